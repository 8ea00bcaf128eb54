import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerCore
import LedgerServer
import LedgerStore
import LedgerTestSupport
import NIOCore
import Testing

/// Proofs pick their app by what Apple signed (issue #39, point 3): a ledger holding two apps
/// takes each one's signed transactions, notifications and receipts, checked against that app;
/// a bundle it does not hold is refused (`unknown-app`) and leaves nothing but a log line and a
/// metric; `/v1/notifications/apple/{bundleId}` takes that app's notifications only.
@Suite("Proofs checked against the app Apple signed them for")
struct ProofAppTests {
    static let second = "com.example.second-game"
    let apple: TestApple
    init() throws { apple = try TestApple() }

    /// A live ledger holding the configured test app and `second` (sandbox only, unless a test
    /// changes it), added over HTTP.
    func withTwoApps(
        production: String? = nil, sandbox: String? = nil, secondApp: [String: Any] = [:],
        configure: @Sendable @escaping (inout LedgerConfiguration) -> Void = { _ in },
        _ test: @Sendable @escaping (LedgerHTTP, TestDatabase) async throws -> Void
    ) async throws {
        let base: [String: Any] = ["bundleId": Self.second, "environments": ["Sandbox"]]
        let body = base.merging(secondApp) { _, given in given }
        let json = try JSONSerialization.data(withJSONObject: body)
        try await withReceiptsApplication(apple, production: production, sandbox: sandbox, configure: configure) { http, db in
            let object = try JSONSerialization.jsonObject(with: json)
            let (status, added) = try await http.send(.post, "/v1/apps", json: object)
            try #require(status == .created, "\(added)")
            try await test(http, db)
        }
    }

    func notification(bundleId: String, transaction: SignedTransactionPayload? = nil, environment: String = "Sandbox") async throws -> String {
        let signedTransaction: String? = if let transaction { try await apple.sign(transaction) } else { nil }
        return try await apple.sign(SignedNotificationPayload(
            notificationType: transaction == nil ? "TEST" : "ONE_TIME_CHARGE", notificationUUID: UUID().uuidString.lowercased(),
            signedDate: Date().millisecondsSince1970,
            data: .init(bundleId: bundleId, environment: environment, signedTransactionInfo: signedTransaction)))
    }

    /// A new order of `app` (a ledger of two apps needs it named).
    func order(_ id: String, user: String = "u-1", app: String) -> [String: Any] {
        newOrder(id, user: user).merging(["bundleId": app]) { _, named in named }
    }

    func metric(_ http: LedgerHTTP, _ line: String) async throws -> Bool {
        let text = String(buffer: try await http.client.execute(uri: "/metrics", method: .get).body)
        return text.split(separator: "\n").contains { $0.hasPrefix(line) }
    }

    @Test("each app's signed transactions are taken: the second app's is pooled, then pays its order; the first app's still does")
    func twoAppsTransactions() async throws {
        try await withTwoApps { http, db in
            let jws = try await apple.sign(TestApple.transaction("7100001", bundleId: Self.second))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-b", "signedTransaction": jws])
            #expect(pooled["outcome"] as? String == "unmatched" && pooled["reason"] as? String == "no-order", "\(pooled)")
            #expect(try await scalar(db, "SELECT user_id FROM unmatched_transactions WHERE transaction_id = '7100001'", as: String.self) == "u-b")
            try await http.send(.post, "/v1/orders", json: order("o-b", user: "u-b", app: Self.second))
            let (_, matched) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-b", "orderId": "o-b", "signedTransaction": jws])
            #expect(matched["outcome"] as? String == "matched" && matched["orderId"] as? String == "o-b", "\(matched)")

            try await http.send(.post, "/v1/orders", json: order("o-a", app: TestApple.bundleId))
            let first = try await apple.sign(TestApple.transaction("7100002"))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "orderId": "o-a", "signedTransaction": first])
            #expect(answer["outcome"] as? String == "matched", "\(answer)")
            // A purchase of the second app Apple took back: refused, and counted under its app.
            var revoked = TestApple.transaction("7100003", bundleId: Self.second)
            revoked.revocationDate = Date().millisecondsSince1970
            revoked.revocationReason = 1
            let (_, refused) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-b", "signedTransaction": try await apple.sign(revoked)])
            #expect(refused["outcome"] as? String == "rejected" && refused["reason"] as? String == "transaction-revoked", "\(refused)")
            // Counted by app, so that one app's failing proofs show apart from the other's.
            for (outcome, app) in [("unmatched", Self.second), ("matched", Self.second), ("matched", TestApple.bundleId), ("rejected", Self.second)] {
                #expect(try await metric(http, "ledger_receipts_total{outcome=\"\(outcome)\",app=\"\(app.lowercased())\"} 1"), "\(outcome) \(app)")
            }
        }
    }

    @Test("a transaction signed in another case than the app was added pays that app's order, recorded in the ledger's spelling; its notifications apply")
    func bundleCase() async throws {
        try await withTwoApps { http, db in
            try await http.send(.post, "/v1/orders", json: order("o-case", user: "u-c", app: Self.second))
            let jws = try await apple.sign(TestApple.transaction("7100009", bundleId: Self.second.uppercased()))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-c", "orderId": "o-case", "signedTransaction": jws])
            #expect(answer["outcome"] as? String == "matched", "\(answer)")
            #expect(try await scalar(db, "SELECT bundle_id FROM apple_transactions WHERE transaction_id = '7100009'", as: String.self) == Self.second)

            // Apple's notification about it, in the same case: applied, as the transaction was.
            var refunded = TestApple.transaction("7100009", bundleId: Self.second.uppercased())
            refunded.revocationDate = Date().millisecondsSince1970
            refunded.revocationType = "REFUND_FULL"
            let refund = try await apple.sign(SignedNotificationPayload(
                notificationType: "REFUND", notificationUUID: UUID().uuidString.lowercased(), signedDate: Date().millisecondsSince1970,
                data: .init(bundleId: Self.second.uppercased(), environment: "Sandbox", signedTransactionInfo: try await apple.sign(refunded))))
            let (status, applied) = try await http.notifyApple(refund)
            #expect(status == .ok && applied["applied"] as? Bool == true, "\(applied)")
            #expect(try await scalar(db, "SELECT state FROM orders WHERE order_id = 'o-case'", as: String.self) == "refunded")
            #expect(try await metric(http, "ledger_apple_notifications_total{result=\"applied\",app=\"\(Self.second.lowercased())\"} 1"))
        }
    }

    @Test("a transaction or notification of an app the ledger does not hold: unknown-app, nothing stored, logged and counted")
    func unknownApp() async throws {
        try await withTwoApps { http, db in
            let before = try await eventCount(db)
            let jws = try await apple.sign(TestApple.transaction("7200001", bundleId: "com.example.not-held"))
            try await http.send(.post, "/v1/orders", json: order("o-u", app: TestApple.bundleId))
            let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-u", "signedTransaction": jws])
            #expect(status == .ok)
            #expect(answer["outcome"] as? String == "rejected" && answer["reason"] as? String == "unknown-app", "\(answer)")
            // The money was taken, and the app may yet be added: the client keeps the transaction.
            #expect(answer["finishTransaction"] as? Bool == false)
            let (notified, refusal) = try await http.send(
                .post, "/v1/notifications/apple",
                json: ["signedPayload": try await notification(bundleId: "com.example.not-held", transaction: TestApple.transaction("7200002", bundleId: "com.example.not-held"))],
                key: .some(nil))
            #expect(notified == .badRequest && errorOf(refusal)["code"] as? String == "unknown-app", "\(refusal)")
            // Only the order's `created`: no proof-rejected event, no transaction, no pool entry.
            #expect(try await eventCount(db) == before + 1)
            #expect(try await scalar(db, "SELECT count(*)::int FROM dashboards.rejected_proofs", as: Int.self) == 0)
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions", as: Int.self) == 0)
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions", as: Int.self) == 0)
            #expect(try await http.send(.get, "/v1/orders/o-u").1["state"] as? String == "created")
            #expect(try await metric(http, #"ledger_apple_unknown_app_total{proof="transaction"} 1"#))
            #expect(try await metric(http, #"ledger_apple_unknown_app_total{proof="notification"} 1"#))
            #expect(try await metric(http, #"ledger_receipts_total{outcome="rejected",app=""} 1"#))
            #expect(try await metric(http, #"ledger_apple_notifications_total{result="rejected",app=""} 1"#))
        }
    }

    @Test("an app added or changed elsewhere is taken: a new app at once, a change within LEDGER_APPS_MAX_AGE; this server's own change at once")
    func changesElsewhere() async throws {
        // No staleness allowed: a change made by another server is read on the next proof.
        try await withTwoApps(configure: { $0.appsMaximumAge = 0 }) { http, db in
            let catalog = AppCatalog(database: db.database)
            // As another server (or `ledger apps add`) would: straight into the table.
            _ = try await catalog.add(BundleID("com.example.third-game"), AppChanges(environments: [.sandbox]))
            let third = try await apple.sign(TestApple.transaction("7300001", bundleId: "com.example.third-game"))
            let (_, taken) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": third])
            #expect(taken["outcome"] as? String == "unmatched", "\(taken)")
            _ = try await catalog.change(BundleID("com.example.third-game"), AppChanges(environments: [.production]))
            let again = try await apple.sign(TestApple.transaction("7300002", bundleId: "com.example.third-game"))
            let (_, refused) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": again])
            #expect(refused["outcome"] as? String == "rejected" && refused["reason"] as? String == "wrong-environment", "\(refused)")
        }
        // A copy that never goes stale by age: this server's PATCH is still taken at once.
        try await withTwoApps(configure: { $0.appsMaximumAge = 86_400 }) { http, _ in
            let jws = try await apple.sign(TestApple.transaction("7300003", bundleId: Self.second))
            #expect(try await http.send(.post, "/v1/receipts", json: ["signedTransaction": jws]).1["outcome"] as? String == "unmatched")
            let (status, _) = try await http.send(.patch, "/v1/apps/\(Self.second)", json: ["environments": ["Production"], "appAppleId": 42])
            #expect(status == .ok)
            let later = try await apple.sign(TestApple.transaction("7300004", bundleId: Self.second))
            let (_, refused) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": later])
            #expect(refused["reason"] as? String == "wrong-environment", "\(refused)")
        }
    }

    @Test("production data of an app without its Apple id waits for it (retry-later); a retired app's proofs are still taken")
    func appleIdAndRetired() async throws {
        try await withTwoApps(secondApp: ["environments": ["Production", "Sandbox"]]) { http, _ in
            let production = try await apple.sign(TestApple.transaction("7400001", environment: "Production", bundleId: Self.second))
            let (_, waiting) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": production])
            #expect(waiting["outcome"] as? String == "retry-later" && waiting["reason"] as? String == "app-apple-id-missing", "\(waiting)")
            try await http.send(.patch, "/v1/apps/\(Self.second)", json: ["appAppleId": 42, "retired": true])
            // Retired: its money was taken, and Apple still sends its refunds.
            let (_, taken) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": production])
            #expect(taken["outcome"] as? String == "unmatched", "\(taken)")
            let charge = try await notification(bundleId: Self.second, transaction: TestApple.transaction("7400002", bundleId: Self.second))
            let (status, applied) = try await http.notifyApple(charge)
            #expect(status == .ok, "\(applied)")
        }
    }

    @Test("/v1/notifications/apple takes both apps'; /v1/notifications/apple/{bundleId} its own only, and no app the ledger does not hold")
    func notificationURLs() async throws {
        try await withTwoApps { http, db in
            func post(_ path: String, _ payload: String) async throws -> (HTTPResponse.Status, [String: Any]) {
                try await http.send(.post, path, json: ["signedPayload": payload], key: .some(nil))
            }
            let first = try await notification(bundleId: TestApple.bundleId)
            let second = try await notification(bundleId: Self.second)
            #expect(try await post("/v1/notifications/apple", first).0 == .ok)
            #expect(try await post("/v1/notifications/apple", second).0 == .ok)
            let own = try await notification(bundleId: Self.second, transaction: TestApple.transaction("7500001", bundleId: Self.second))
            let (status, applied) = try await post("/v1/notifications/apple/\(Self.second)", own)
            #expect(status == .ok && applied["applied"] as? Bool == true, "\(applied)")
            // Apple holds bundle ids whatever their case.
            #expect(try await post("/v1/notifications/apple/\(Self.second.uppercased())", try await notification(bundleId: Self.second)).0 == .ok)

            let before = try await eventCount(db)
            let (other, otherError) = try await post("/v1/notifications/apple/\(Self.second)", try await notification(bundleId: TestApple.bundleId))
            #expect(other == .badRequest && errorOf(otherError)["code"] as? String == "wrong-bundle-id", "\(otherError)")
            let (unknown, unknownError) = try await post("/v1/notifications/apple/com.example.not-held", try await notification(bundleId: "com.example.not-held"))
            #expect(unknown == .notFound && errorOf(unknownError)["code"] as? String == "unknown-app", "\(unknownError)")
            #expect(try await eventCount(db) == before)
        }
    }

    @Test("a legacy receipt is asked with its own app's shared secret when several apps hold one")
    func receiptSecrets() async throws {
        let purchase = Int64(Date().timeIntervalSince1970 * 1000) - 60_000
        let standIn = VerifyReceiptStandIn(answers: [
            "production:SECOND": VerifyReceiptStandIn.valid(bundleId: Self.second, transactions: [("7600001", "gems.100", purchase)]),
            "production:FIRST": VerifyReceiptStandIn.valid(transactions: [("7600002", "gems.100", purchase)]),
            "production:STRANGER": VerifyReceiptStandIn.valid(bundleId: "com.example.not-held", transactions: [("7600003", "gems.100", purchase)]),
            // Apple wants the app's secret first (21004 without it, or with another app's).
            "production:SUBSCRIBED": .json(#"{"status": 21004}"#),
            "production:SUBSCRIBED#secret-of-second": VerifyReceiptStandIn.valid(bundleId: Self.second, transactions: [("7600004", "gems.100", purchase)]),
        ])
        try await standIn.run { production, sandbox in
            try await withTwoApps(
                production: production, sandbox: sandbox, secondApp: ["sharedSecret": "secret-of-second"],
                configure: { $0.apple.sharedSecret = "secret-of-first" }
            ) { http, db in
                let (_, second) = try await http.send(.post, "/v1/receipts", json: ["receiptData": "SECOND"])
                #expect(second["outcome"] as? String == "unmatched", "\(second)")
                let (_, first) = try await http.send(.post, "/v1/receipts", json: ["receiptData": "FIRST"])
                #expect(first["outcome"] as? String == "unmatched", "\(first)")
                let before = try await eventCount(db)
                let (_, stranger) = try await http.send(.post, "/v1/receipts", json: ["receiptData": "STRANGER"])
                #expect(stranger["outcome"] as? String == "rejected" && stranger["reason"] as? String == "unknown-app", "\(stranger)")
                #expect(try await eventCount(db) == before)
                #expect(try await metric(http, #"ledger_apple_unknown_app_total{proof="receipt"} 1"#))
                let (_, subscribed) = try await http.send(.post, "/v1/receipts", json: ["receiptData": "SUBSCRIBED"])
                #expect(subscribed["outcome"] as? String == "unmatched" && subscribed["transactionId"] as? String == "7600004", "\(subscribed)")
            }
        }
        // SUBSCRIBED: asked with none, then the apps' secrets in order until Apple took one.
        #expect(await standIn.calls("password:secret-of-second") == 2)
        #expect(await standIn.calls("password:secret-of-first") == 2)
    }

    @Test("a token that is a per-user token in the app Apple signed for names its user there, whatever order of another app carries it")
    func ownAppsUserTokenFirst() async throws {
        try await withTwoApps(secondApp: ["appAccountTokens": "user"], configure: bothEnvironments) { http, db in
            let token = "6f1c2a4e-0000-4000-8000-0000000000c3"
            // The second app's user u-2 carries it as the user's token; an order of the first app,
            // another user's, as its own.
            var own = order("o-own", user: "u-2", app: Self.second)
            own["appAccountToken"] = token
            let (created, answer) = try await http.send(.post, "/v1/orders", json: own)
            try #require(created == .created && answer["appAccountToken"] as? String == token, "\(answer)")
            var other = order("o-other", user: "u-9", app: TestApple.bundleId)
            other["appAccountToken"] = token
            let (otherCreated, otherAnswer) = try await http.send(.post, "/v1/orders", json: other)
            try #require(otherCreated == .created, "\(otherAnswer)")

            let jws = try await apple.sign(TestApple.transaction("7400001", bundleId: Self.second, appAccountToken: UUID(uuidString: token)))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": jws])
            #expect(pooled["outcome"] as? String == "unmatched" && pooled["reason"] as? String == "no-order", "\(pooled)")
            #expect(try await scalar(db, "SELECT user_id FROM apple_transactions WHERE transaction_id = '7400001'", as: String.self) == "u-2")
            let (_, paired) = try await http.send(.post, "/v1/reconcile")
            #expect(paired["paired"] as? Int == 1, "\(paired)")
            let (_, paid) = try await http.send(.get, "/v1/orders/o-own")
            #expect(paid["state"] as? String == "verified", "\(paid)")
        }
    }
}
