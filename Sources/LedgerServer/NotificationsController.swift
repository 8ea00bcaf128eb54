import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerServices
import LedgerStore

/// `POST /v1/notifications/apple`: App Store Server Notifications V2 of every app the ledger
/// holds (the signed payload names its app), and `POST /v1/notifications/apple/{bundleId}`, for
/// Apple's per-app URL setting, which takes that app's only. No API key: Apple signs the payload.
/// 200 only once the notification is committed; Apple retries anything else (in production, five
/// more times, 1, 12, 24, 48 and 72 hours apart), so a refusal the operator can mend (an app not
/// added yet) is taken on a retry once it is.
struct NotificationsController {
    let notifications: NotificationLedger
    let verifier: AppleProofVerifier
    let metrics: LedgerMetrics

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/notifications/apple") { request, context in try await receive(request, context) }
        router.post("/v1/notifications/apple/:bundleId") { request, context in
            let bundleId = try BundleID(pathParameter(context, "bundleId")).rawValue
            // The path's app first: a URL of no app the ledger holds takes nothing.
            let held: Bool
            if let apps = verifier.apps {
                do { held = try await apps.app(bundleId: bundleId) != nil } catch let error as AppleVerificationError {
                    throw APIError(.serviceUnavailable, code: error.code, message: error.message, headers: [.retryAfter: "60"])
                }
            } else {
                held = verifier.app.bundleId?.lowercased() == bundleId.lowercased()
            }
            guard held else {
                metrics.notificationAnswered("rejected", app: nil)
                metrics.unknownApp("notification")
                context.logger.warning("notification refused: unknown-app", metadata: ["app.bundle_id": "\(bundleId)"])
                throw APIError(.notFound, code: "unknown-app", message: "the ledger holds no app \(bundleId) (ledger apps add, or POST /v1/apps)")
            }
            return try await receive(request, context, onlyFor: bundleId)
        }
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

    func receive(_ request: Request, _ context: LedgerRequestContext, onlyFor: String? = nil) async throws -> Answer<Applied> {
        let body = try await request.decode(as: Body.self, context: context)
        let notification: VerifiedNotification
        do {
            notification = try await verifier.notification(signed: body.signedPayload, onlyFor: onlyFor)
        } catch {
            metrics.notificationAnswered("rejected", app: error.bundleId)
            if error.code == "unknown-app" {
                // Nothing stored; a 400, so that Apple retries: the app may be added meanwhile.
                metrics.unknownApp("notification")
                context.logger.warning("notification refused: unknown-app", metadata: ["error.message": "\(error.message)"])
            }
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
        metrics.notificationAnswered(applied.appended ? "applied" : "repeated", app: notification.bundleId)
        return Answer(Applied(
            notificationUUID: notification.notificationUUID.uuidString.lowercased(), applied: applied.appended,
            streamId: applied.streamId, type: applied.type))
    }
}
