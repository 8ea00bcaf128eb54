import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerTestSupport
import Testing

/// Every notification is checked against the app by the part that names it (`data`,
/// `summary`, `externalPurchaseToken`, `appData`), as Apple's verifier does; one that names none
/// is refused.
@Suite("Notifications without data: checked against the app by summary, externalPurchaseToken or appData")
struct NotificationAppCheckTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    typealias Payload = SignedNotificationPayload

    /// A notification signed by the test chain whose only part is the one `configure` sets.
    func signed(_ type: String, _ configure: (inout Payload) -> Void) async throws -> String {
        var payload = Payload(notificationType: type, notificationUUID: UUID().uuidString.lowercased(), signedDate: Date().millisecondsSince1970, data: nil)
        configure(&payload)
        return try await apple.sign(payload)
    }

    @Test("another app's summary, external purchase token or app data is refused; the app's own is taken; none at all is a 400")
    func everyPart() async throws {
        let other = "com.example.another-app"
        try await withReceiptsApplication(apple) { http, db in
            // A bundle the ledger does not hold is `unknown-app`, by whichever part names it.
            let refusals: [(String, String, (inout Payload) -> Void)] = [
                ("RENEWAL_EXTENSION", "unknown-app", { $0.summary = .init(bundleId: other, appAppleId: TestApple.appAppleId, environment: "Sandbox") }),
                ("RENEWAL_EXTENSION", "wrong-environment", { $0.summary = .init(bundleId: TestApple.bundleId, appAppleId: TestApple.appAppleId, environment: "Production") }),
                ("EXTERNAL_PURCHASE_TOKEN", "unknown-app", {
                    $0.externalPurchaseToken = .init(externalPurchaseId: "SANDBOX_1", bundleId: other, appAppleId: TestApple.appAppleId)
                }),
                // No SANDBOX prefix: a production token, which a sandbox ledger refuses.
                ("EXTERNAL_PURCHASE_TOKEN", "wrong-environment", {
                    $0.externalPurchaseToken = .init(externalPurchaseId: "0001", bundleId: TestApple.bundleId, appAppleId: TestApple.appAppleId)
                }),
                ("RESCIND_CONSENT", "unknown-app", { $0.appData = .init(bundleId: other, appAppleId: TestApple.appAppleId, environment: "Sandbox") }),
                ("TEST", "notification-without-app", { _ in }),
                // `data` without an environment is no longer let through unchecked.
                ("TEST", "wrong-environment", { $0.data = .init(bundleId: TestApple.bundleId, environment: nil, signedTransactionInfo: nil) }),
            ]
            let before = try await eventCount(db)
            for (type, code, configure) in refusals {
                let (status, answer) = try await http.notifyApple(try await signed(type, configure))
                #expect(status == .badRequest && errorOf(answer)["code"] as? String == code, "\(type) \(code): \(status) \(answer)")
            }
            #expect(try await eventCount(db) == before, "nothing recorded")

            let accepted: [(String, (inout Payload) -> Void)] = [
                ("RENEWAL_EXTENSION", { $0.summary = .init(bundleId: TestApple.bundleId, appAppleId: TestApple.appAppleId, environment: "Sandbox", succeededCount: 3) }),
                ("EXTERNAL_PURCHASE_TOKEN", {
                    $0.externalPurchaseToken = .init(externalPurchaseId: "SANDBOX_2", bundleId: TestApple.bundleId, appAppleId: TestApple.appAppleId)
                }),
                ("RESCIND_CONSENT", { $0.appData = .init(bundleId: TestApple.bundleId, appAppleId: TestApple.appAppleId, environment: "Sandbox") }),
            ]
            for (type, configure) in accepted {
                let (status, answer) = try await http.notifyApple(try await signed(type, configure))
                #expect(status == .ok && answer["type"] as? String == "notification-received", "\(type): \(status) \(answer)")
            }
        }
    }
}

@Suite("Notifications in production: the app's Apple id, by whichever part names it")
struct NotificationAppIdTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    func verifier(appAppleId: Int64) throws -> AppleProofVerifier {
        AppleProofVerifier(
            app: .init(bundleId: TestApple.bundleId, appAppleId: appAppleId, environment: .production),
            signedData: SignedDataVerifier(rootCertificates: try AppleRootCertificates.load(paths: [apple.rootFile])), verifyReceipt: nil)
    }

    @Test("summary, external purchase token and app data of another app id are refused in production", arguments: ["summary", "externalPurchaseToken", "appData"])
    func appIds(_ part: String) async throws {
        func payload(_ appAppleId: Int64) -> SignedNotificationPayload {
            var payload = SignedNotificationPayload(
                notificationType: "TEST", notificationUUID: UUID().uuidString.lowercased(), signedDate: Date().millisecondsSince1970, data: nil)
            switch part {
            case "summary": payload.summary = .init(bundleId: TestApple.bundleId, appAppleId: appAppleId, environment: "Production")
            case "externalPurchaseToken": payload.externalPurchaseToken = .init(externalPurchaseId: "0002", bundleId: TestApple.bundleId, appAppleId: appAppleId)
            default: payload.appData = .init(bundleId: TestApple.bundleId, appAppleId: appAppleId, environment: "Production")
            }
            return payload
        }
        let verifier = try verifier(appAppleId: TestApple.appAppleId)
        _ = try await verifier.notification(signed: try await apple.sign(payload(TestApple.appAppleId)))
        do {
            _ = try await verifier.notification(signed: try await apple.sign(payload(42)))
            Issue.record("another app id's \(part) was taken")
        } catch {
            #expect((error as? AppleVerificationError)?.code == "wrong-app-id" && (error as? AppleVerificationError)?.message.contains(part) == true)
        }
    }
}
