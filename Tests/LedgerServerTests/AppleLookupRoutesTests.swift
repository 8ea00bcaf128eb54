import AppleReceipts
import AppStoreStandIn
import Foundation
import NIOCore
import LedgerServer
import LedgerTestSupport
import Testing

@Suite("POST /v1/apple-orders/{appleOrderId}/lookup against a stand-in App Store Server API")
struct AppleLookupRoutesTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    /// The receipts application with the App Store Server API pointed at the stand-in.
    func withLookupApplication(_ test: @Sendable @escaping (LedgerHTTP, TestDatabase) async throws -> Void) async throws {
        try await withAppleAPIApplication(apple, standIn) { http, db, _ in try await test(http, db) }
    }

    @Test("each purchase of an Apple order goes through the receipts' intake: matched by its token, pooled for the user, a forged one refused; again, nothing new")
    func lookUp() async throws {
        let forged = try ThrowawaySigningChain(name: "Not Apple")
        try await withLookupApplication { http, db in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("lk-1", user: "u-lk"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            await standIn.setOrder("MQ1ABC", [
                try await apple.sign(TestApple.transaction("9100001", appAccountToken: token)),
                try await apple.sign(TestApple.transaction("9100002")),
                try forged.sign(TestApple.transaction("9100003")),
            ])
            let (status, found) = try await http.send(.post, "/v1/apple-orders/MQ1ABC/lookup", json: ["userId": "u-lk"])
            #expect(status == .ok)
            let entries = found["transactions"] as? [[String: Any]] ?? []
            #expect(entries.count == 3)
            #expect(entries.first?["outcome"] as? String == "matched" && entries.first?["orderId"] as? String == "lk-1")
            #expect(entries.first?["environment"] as? String == "Sandbox" && entries.first?["bundleId"] as? String == TestApple.bundleId, "\(entries)")
            #expect(entries.dropFirst().first?["outcome"] as? String == "unmatched")
            #expect(entries.last?["outcome"] as? String == "rejected" && entries.last?["transactionId"] == nil)
            let (_, pool) = try await http.send(.get, "/v1/transactions/unmatched?userId=u-lk")
            #expect((pool["transactions"] as? [[String: Any]])?.first?["transactionId"] as? String == "9100002")
            let events = try await eventCount(db)
            let (_, again) = try await http.send(.post, "/v1/apple-orders/MQ1ABC/lookup", raw: "")
            #expect((again["transactions"] as? [[String: Any]])?.count == 3)
            #expect(try await eventCount(db) == events, "a second lookup appends nothing")
            // Apple refunded the purchase since: the lookup names it, and its order is refunded.
            var refunded = TestApple.transaction("9100001", appAccountToken: token)
            refunded.revocationDate = Date().millisecondsSince1970
            await standIn.setOrder("MQ2DEF", [try await apple.sign(refunded)])
            let (_, later) = try await http.send(.post, "/v1/apple-orders/MQ2DEF/lookup", raw: "")
            let entry = (later["transactions"] as? [[String: Any]])?.first ?? [:]
            #expect(entry["outcome"] as? String == "rejected" && entry["reason"] as? String == "transaction-revoked", "\(later)")
            #expect(entry["transactionId"] as? String == "9100001", "\(later)")
            #expect(try await http.send(.get, "/v1/orders/lk-1").1["state"] as? String == "refunded")
            let (missing, error) = try await http.send(.post, "/v1/apple-orders/MQ0000/lookup", raw: "")
            #expect(missing == .notFound && errorOf(error)["code"] as? String == "apple-order-not-found")
            let (bad, _) = try await http.send(.post, "/v1/apple-orders/MQ-1%20x/lookup", raw: "")
            #expect(bad == .badRequest)
            // Apple busy for two minutes: support is told so, and when to ask again, at once
            // (the background work waits it out; a person is not kept waiting).
            await standIn.queue([.tooManyRequests(after: .seconds(120))])
            let response = try await http.client.execute(
                uri: "/v1/apple-orders/MQ1ABC/lookup", method: .post, headers: [.authorization: "Bearer \(http.key)"], body: ByteBuffer())
            #expect(response.status == .serviceUnavailable && errorOf(json(response.body))["code"] as? String == "apple-api-rate-limited")
            #expect(Int(response.headers[.retryAfter] ?? "").map { (100...121).contains($0) } == true, "\(response.headers)")
            #expect(await standIn.refusedTokens == 0)
        }
    }

    @Test("without an API key the route answers 503 apple-api-not-configured")
    func notConfigured() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            let (status, error) = try await http.send(.post, "/v1/apple-orders/MQ1ABC/lookup", raw: "")
            #expect(status == .serviceUnavailable && errorOf(error)["code"] as? String == "apple-api-not-configured")
            // A key the ledger cannot read is its own setup's fault, as a missing one: Apple was
            // not asked, and the answer is no 502 of Apple's.
            let (patched, app) = try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: [
                "apiKey": ["issuerId": "issuer-1", "keyId": "KEY1", "privateKeyRef": "env:LEDGER_TEST_KEY_NEVER_SET"]])
            #expect(patched == .ok, "\(app)")
            let (unreadable, refusal) = try await http.send(.post, "/v1/apple-orders/MQ1ABC/lookup", raw: "")
            #expect(unreadable == .serviceUnavailable && errorOf(refusal)["code"] as? String == "app-key-unavailable", "\(refusal)")
        }
    }

    @Test("a purchase of an Apple account the ledger knows for another user, looked up for a user: held for support at once, as that user's proof would be")
    func lookUpAnotherUsersAccount() async throws {
        try await withLookupApplication { http, db in
            let (_, linked) = try await http.send(.post, "/v1/users/alice/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("acct-lk"))])
            #expect(linked["outcome"] as? String == "linked", "\(linked)")
            var alices = TestApple.transaction("9100011")
            alices.appTransactionId = "acct-lk"
            await standIn.setOrder("MQ3GHI", [try await apple.sign(alices)])
            let (status, found) = try await http.send(.post, "/v1/apple-orders/MQ3GHI/lookup", json: ["userId": "bob"])
            let entries = found["transactions"] as? [[String: Any]] ?? []
            #expect(status == .ok && entries.count == 1, "\(found)")
            #expect(entries.first?["outcome"] as? String == "unmatched" && entries.first?["reason"] as? String == "account-conflict", "\(entries)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '9100011'", as: String.self) == "conflict")
            #expect(try await scalar(db, """
                SELECT claimed_by || ' ' || owner_user_id FROM dashboards.apple_account_conflicts WHERE transaction_id = '9100011'
                """, as: String.self) == "bob alice")
        }
    }
}
