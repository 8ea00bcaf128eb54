import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerServices
import LedgerStore

/// `POST /v1/notifications/apple`: App Store Server Notifications V2. No API key: Apple signs
/// the payload. 200 only once the notification is committed; Apple retries anything else.
struct NotificationsController {
    let notifications: NotificationLedger
    let verifier: AppleProofVerifier
    let metrics: LedgerMetrics

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/notifications/apple") { request, context in try await receive(request, context) }
    }

    /// The body Apple posts.
    struct Body: Decodable {
        let signedPayload: String
    }

    /// What the ledger did with a notification.
    struct Applied: Encodable, Sendable {
        let notificationUUID: String
        let applied: Bool
        let streamId: StreamID
        let type: String
    }

    func receive(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<Applied> {
        let body = try await request.decode(as: Body.self, context: context)
        let notification: VerifiedNotification
        do {
            notification = try await verifier.notification(signed: body.signedPayload)
        } catch {
            metrics.notificationAnswered("rejected")
            if error.isRetryable {
                throw APIError(.serviceUnavailable, code: error.code, message: error.message, headers: [.retryAfter: "60"])
            }
            throw APIError(.badRequest, code: error.code, message: error.message)
        }
        struct Metadata: Encodable {
            let requestId: String
            let appendedBy = "apple-notification"
            let notificationType: String
        }
        let metadata = try EventCoding.encoder.encode(Metadata(requestId: context.requestID, notificationType: notification.notificationType))
        let applied = try await notifications.apply(notification, metadata: metadata)
        metrics.notificationAnswered(applied.appended ? "applied" : "repeated")
        return Answer(Applied(
            notificationUUID: notification.notificationUUID.uuidString.lowercased(), applied: applied.appended,
            streamId: applied.streamId, type: applied.type))
    }
}
