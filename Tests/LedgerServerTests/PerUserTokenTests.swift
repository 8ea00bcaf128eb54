import Foundation
import HTTPTypes
import LedgerCore
import LedgerServer
import LedgerStore
import LedgerTestSupport
import NIOCore
import Testing

/// Issue 41, point 3: an app whose `appAccountToken` is its user's (`appAccountTokens: user`)
/// creates every order of the user with it, never lets another user take it, and a transaction
/// carrying it resolves the user, never an order by itself: the reconciler chooses the order.
@Suite("Per-user appAccountTokens")
struct PerUserTokenTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    static let token = "6f1c2a4e-0000-4000-8000-0000000000a1"

    @Sendable static func perUser(_ configuration: inout LedgerConfiguration) {
        configuration.apple.appAccountTokens = .user
    }

    func order(_ http: LedgerHTTP, _ id: String, user: String, token: String?) async throws -> (HTTPResponse.Status, [String: Any]) {
        var body = newOrder(id, user: user)
        if let token { body["appAccountToken"] = token }
        return try await http.send(.post, "/v1/orders", json: body)
    }

    @Test("several orders of one user carry the user's token, given or not; another user's order with it is 409")
    func ordersShareTheUsersToken() async throws {
        try await withReceiptsApplication(apple, configure: Self.perUser) { http, db in
            let (first, one) = try await order(http, "o-1", user: "u-1", token: Self.token)
            #expect(first == .created && one["appAccountToken"] as? String == Self.token, "\(one)")
            let (second, two) = try await order(http, "o-2", user: "u-1", token: Self.token)
            #expect(second == .created && two["appAccountToken"] as? String == Self.token, "\(two)")
            // Created without a token: the one the user's orders carry.
            let (third, three) = try await order(http, "o-3", user: "u-1", token: nil)
            #expect(third == .created && three["appAccountToken"] as? String == Self.token, "\(three)")
            // A retry of the first is the same order.
            let (retried, _) = try await order(http, "o-1", user: "u-1", token: Self.token)
            #expect(retried == .ok)

            let (taken, error) = try await order(http, "o-4", user: "u-2", token: Self.token)
            #expect(taken == .conflict && errorOf(error)["code"] as? String == "app-account-token-taken", "\(error)")
            let (own, other) = try await order(http, "o-5", user: "u-2", token: nil)
            #expect(own == .created)
            let othersToken = try #require(other["appAccountToken"] as? String)
            #expect(othersToken != Self.token)
            // Two users racing for one new token in one group commit: one gets it.
            let fresh = "6f1c2a4e-0000-4000-8000-0000000000b2"
            let statuses = try await withThrowingTaskGroup(of: HTTPResponse.Status.self) { group in
                for user in ["u-6", "u-7"] {
                    group.addTask { try await order(http, "o-\(user)", user: user, token: fresh).0 }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(statuses.sorted { $0.code < $1.code } == [.created, .conflict], "\(statuses)")
            #expect(try await scalar(db, "SELECT count(DISTINCT user_id)::int FROM orders WHERE app_account_token = \(UUID(uuidString: fresh)!)", as: Int.self) == 1)
            #expect(try await scalar(db, "SELECT count(*)::int FROM app_account_tokens WHERE order_id IS NULL", as: Int.self) == 3)
        }
    }

    @Test("a user's first token is named with the database's secret: another user cannot compute it and take it first")
    func firstTokenCannotBeGuessed() async throws {
        try await withReceiptsApplication(apple, configure: Self.perUser) { http, db in
            // What the victim's token would be, named by the app and the user alone.
            let guessed = EventID.named("user-token", TestApple.bundleId, "victim").uuid.uuidString.lowercased()
            let (taken, _) = try await order(http, "o-mallory", user: "mallory", token: guessed)
            #expect(taken == .created)
            let (created, victim) = try await order(http, "o-victim", user: "victim", token: nil)
            #expect(created == .created, "\(victim)")
            let token = try #require(victim["appAccountToken"] as? String)
            #expect(token != guessed)
            // The same on every server: the user's next order, and a second server's, carry it.
            let (_, again) = try await order(http, "o-victim-2", user: "victim", token: nil)
            #expect(again["appAccountToken"] as? String == token)
            #expect(try await scalar(db, "SELECT count(*)::int FROM ledger_secrets", as: Int.self) == 1)
        }
    }

    @Test("a per-order app still refuses a second order with a token, and a per-user token is never taken by an order of a per-order app")
    func perOrderStaysTheDefault() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            let (_, app) = try await http.send(.get, "/v1/apps")
            #expect(((app["apps"] as? [[String: Any]])?.first?["appAccountTokens"] as? String) == "order", "\(app)")
            _ = try await order(http, "o-1", user: "u-1", token: Self.token)
            let (taken, error) = try await order(http, "o-2", user: "u-1", token: Self.token)
            #expect(taken == .conflict && errorOf(error)["code"] as? String == "app-account-token-taken", "\(error)")

            // Switched to per-user tokens: the token the order took stays that order's.
            let (changed, answer) = try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["appAccountTokens": "user"])
            #expect(changed == .ok && answer["appAccountTokens"] as? String == "user", "\(answer)")
            let (bad, badError) = try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["appAccountTokens": "account"])
            #expect(bad == .badRequest && errorOf(badError)["message"].map { "\($0)".contains("appAccountTokens") } == true, "\(badError)")
            let (still, stillError) = try await order(http, "o-3", user: "u-1", token: Self.token)
            #expect(still == .conflict && errorOf(stillError)["code"] as? String == "app-account-token-taken", "\(stillError)")
        }
    }

    @Test("a transaction with the user's token resolves the user, never an order by itself; the reconciler picks by queue order")
    func transactionResolvesTheUser() async throws {
        try await withReceiptsApplication(apple, configure: Self.perUser) { http, db in
            let token = try #require(UUID(uuidString: Self.token))
            _ = try await order(http, "o-1", user: "u-1", token: Self.token)
            _ = try await order(http, "o-2", user: "u-1", token: Self.token)
            try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "payment-added", "data": ["queuedAt": LedgerJSONDate.now(minus: 30)]])

            let jws = try await apple.sign(TestApple.transaction("4300001", appAccountToken: token))
            let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": jws])
            #expect(status == .ok && answer["outcome"] as? String == "unmatched" && (answer["orderId"] as? String) == nil, "\(answer)")
            for id in ["o-1", "o-2"] {
                let (_, open) = try await http.send(.get, "/v1/orders/\(id)")
                #expect(["created", "payment-added"].contains(open["state"] as? String ?? ""), "\(open)")
            }
            // Another user's claim on it is held for support: the token says whose it is.
            let (_, claimed) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": jws, "userId": "u-2"])
            #expect(claimed["reason"] as? String == "account-conflict", "\(claimed)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '4300001'", as: String.self) == "conflict")
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 0, "\(summary)")

            // Without the claim, the pool has it under the token's user and the reconciler pairs
            // it with the order whose payment entered the queue.
            let second = try await apple.sign(TestApple.transaction("4300002", appAccountToken: token))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": second])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            let (_, search) = try await http.send(.get, "/v1/transactions/unmatched?userId=u-1")
            #expect((search["transactions"] as? [[String: Any]])?.map { $0["transactionId"] as? String } == ["4300002"], "\(search)")
            let (_, paired) = try await http.send(.post, "/v1/reconcile")
            #expect(paired["paired"] as? Int == 1, "\(paired)")
            let (_, one) = try await http.send(.get, "/v1/orders/o-1")
            #expect(one["state"] as? String == "verified" && one["transactionId"] as? String == "4300002", "\(one)")
            #expect(try await scalar(db, """
                SELECT data->>'rule' FROM events WHERE stream_id = 'transaction-4300002' AND type = 'transaction-matched'
                """, as: String.self) == "queue-order")
            let (_, two) = try await http.send(.get, "/v1/orders/o-2")
            #expect(two["state"] as? String == "created", "\(two)")

            // Named by its order id, a transaction with the token pays that order at once.
            let third = try await apple.sign(TestApple.transaction("4300003", appAccountToken: token))
            let (_, named) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": third, "orderId": "o-2", "userId": "u-1"])
            #expect(named["outcome"] as? String == "matched" && named["orderId"] as? String == "o-2", "\(named)")
        }
    }

    @Test("tokens are per app: one user's token in two apps of per-user tokens, and one order token in two apps, each names its own app's")
    func tokensPerApp() async throws {
        try await withReceiptsApplication(apple, configure: Self.perUser) { http, db in
            let other = "com.example.other-game"
            let (added, app) = try await http.send(.post, "/v1/apps", json: ["bundleId": other, "appAccountTokens": "user"])
            #expect(added == .created, "\(app)")
            func order(_ id: String, user: String, app: String, token: String) async throws -> HTTPResponse.Status {
                var body = newOrder(id, user: user).merging(["bundleId": app]) { $1 }
                body["appAccountToken"] = token
                return try await http.send(.post, "/v1/orders", json: body).0
            }
            // The studio's one account system: u-1's UUID is the token in both games.
            #expect(try await order("g1-1", user: "u-1", app: TestApple.bundleId, token: Self.token) == .created)
            #expect(try await order("g2-1", user: "u-1", app: other, token: Self.token) == .created)
            // Another user of the second game may not take it there.
            #expect(try await order("g2-2", user: "u-2", app: other, token: Self.token) == .conflict)

            // In the second game, u-9 holds another token; a transaction of the first game with it,
            // claimed by u-5, knows no user from the second game: no conflict to hold.
            let token2 = "6f1c2a4e-0000-4000-8000-0000000000c3"
            #expect(try await order("g2-3", user: "u-9", app: other, token: token2) == .created)
            let first = try await apple.sign(TestApple.transaction("4300101", appAccountToken: UUID(uuidString: token2)))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": first, "userId": "u-5"])
            #expect(pooled["outcome"] as? String == "unmatched" && pooled["reason"] as? String == "no-order", "\(pooled)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '4300101'", as: String.self) == "unmatched")

            // A transaction of the second game with u-1's token is u-1's there, and its reconciler
            // pairs it with the second game's order.
            let second = try await apple.sign(TestApple.transaction("4300102", bundleId: other, appAccountToken: UUID(uuidString: Self.token)))
            let (_, waiting) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": second])
            #expect(waiting["outcome"] as? String == "unmatched", "\(waiting)")
            let (_, pass) = try await http.send(.post, "/v1/reconcile")
            #expect(pass["paired"] as? Int == 1, "\(pass)")
            let (_, paid) = try await http.send(.get, "/v1/orders/g2-1")
            #expect(paid["state"] as? String == "verified" && paid["transactionId"] as? String == "4300102", "\(paid)")
            let (_, untouched) = try await http.send(.get, "/v1/orders/g1-1")
            #expect(untouched["state"] as? String == "created", "\(untouched)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM app_account_tokens WHERE app_account_token = \(UUID(uuidString: Self.token)!)", as: Int.self) == 2)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a purchase imported as granted, replayed with the user's token for the user's new order: already granted, finished, as in an app of per-order tokens")
    func importedGrantReplayedWithTheUsersToken() async throws {
        try await withReceiptsApplication(apple, configure: { Self.perUser(&$0); bothEnvironments(&$0) }) { http, _ in
            let history = """
                \(ImportTests.header)
                h-1,u-1,gems.100,,2025-03-01T10:00:00Z,finished,0.99,USD,5200001,,2025-03-01T10:01:00Z,,

                """
            let headers: HTTPFields = [.contentType: "text/csv", .authorization: "Bearer \(http.key)"]
            let imported = try await http.client.execute(uri: "/v1/imports?source=history.csv", method: .post, headers: headers, body: ByteBuffer(string: history))
            #expect(imported.status == .ok && json(imported.body)["imported"] as? Int == 1, "\(json(imported.body))")
            let (_, created) = try await order(http, "o-new", user: "u-1", token: Self.token)
            #expect(created["appAccountToken"] as? String == Self.token, "\(created)")

            // The old purchase, carrying the user's token, sent for the user's new order: the token
            // names the user, whose imported order holds it.
            let jws = try await apple.sign(TestApple.transaction(
                "5200001", appAccountToken: UUID(uuidString: Self.token), purchaseDate: Date(timeIntervalSinceNow: -86_400 * 400)))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": jws, "orderId": "o-new", "userId": "u-1"])
            #expect(answer["outcome"] as? String == "duplicate" && answer["reason"] as? String == "duplicate-transaction", "\(answer)")
            #expect(answer["finishTransaction"] as? Bool == true, "\(answer)")
            // The order it was replayed for is failed, as for an app of per-order tokens (promise 6).
            let (_, replayed) = try await http.send(.get, "/v1/orders/o-new")
            #expect(replayed["state"] as? String == "failed", "\(replayed)")
        }
    }
}
