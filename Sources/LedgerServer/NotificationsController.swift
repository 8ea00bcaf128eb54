import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
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

    func receive(_ request: Request, _ context: LedgerRequestContext) async throws -> Response {
        let body = try await JSONBody.read(request, context: context)
        let signedPayload = try body.requiredString("signedPayload")
        let notification: VerifiedNotification
        do {
            notification = try await verifier.notification(signed: signedPayload)
        } catch {
            metrics.notificationAnswered("rejected")
            if error.isRetryable {
                throw APIError(.serviceUnavailable, code: error.code, message: error.message, headers: [.retryAfter: "60"])
            }
            throw APIError(.badRequest, code: error.code, message: error.message)
        }
        var json = JSONText()
        json.add("requestId", context.requestID)
        json.add("appendedBy", "apple-notification")
        json.add("notificationType", notification.notificationType)
        let metadata = Data(json.result.utf8)
        let record = NotificationReceived(
            notificationUUID: notification.notificationUUID, notificationType: notification.notificationType,
            subtype: notification.subtype, transactionId: notification.transaction?.transactionId, signedDate: notification.signedDate)
        let applied = try await notifications.apply(
            .init(record: record, transaction: notification.transaction, revocationDate: notification.revocationDate,
                  revocationReason: notification.revocationReason),
            metadata: metadata)
        metrics.notificationAnswered(applied.appended ? "applied" : "repeated")
        return Rendering.response(.ok, [
            "notificationUUID": notification.notificationUUID.uuidString.lowercased(),
            "applied": applied.appended, "streamId": applied.streamId.rawValue, "type": applied.type,
        ])
    }
}
