import Foundation
import LedgerCore
import LedgerJSON
import LedgerServices
import LedgerStore
import LedgerTestSupport
import Testing

/// Issue 41, point 1: a purchase Apple signed before an order was created (beyond the clock skew
/// the reconciler allows) never pays that order, whichever way it comes.
@Suite("The purchase-date guard: an old purchase never pays a newer order")
struct PurchaseDateGuardTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    static let day: TimeInterval = 86_400

    func signed(_ id: String, daysAgo: Double, token: UUID? = nil) async throws -> String {
        try await apple.sign(TestApple.transaction(id, appAccountToken: token, purchaseDate: Date(timeIntervalSinceNow: -daysAgo * Self.day)))
    }

    @Test("named by its order id or its token, a purchase signed 90 days ago is purchased-before-order and waits in the pool; re-sent, the same")
    func directPaths() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-new", user: "u-1"))
            let old = try await signed("4100001", daysAgo: 90)
            for _ in 0..<2 {
                let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "orderId": "o-new", "signedTransaction": old])
                #expect(status == .ok)
                #expect(answer["outcome"] as? String == "unmatched" && answer["reason"] as? String == "purchased-before-order", "\(answer)")
                #expect(answer["orderId"] as? String == "o-new" && answer["state"] as? String == "created")
                #expect(answer["finishTransaction"] as? Bool == false)
            }
            let (_, order) = try await http.send(.get, "/v1/orders/o-new")
            #expect(order["state"] as? String == "created" && order["transactionId"] as? String == nil)
            #expect(try await scalar(db, "SELECT user_id FROM unmatched_transactions WHERE transaction_id = '4100001'", as: String.self) == "u-1")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'transaction-4100001'", as: Int.self) == 1)

            // By its appAccountToken, no order id.
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-token", user: "u-2"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            let (_, byToken) = try await http.send(.post, "/v1/receipts", json: [
                "userId": "u-2", "signedTransaction": try await signed("4100002", daysAgo: 90, token: token),
            ])
            #expect(byToken["outcome"] as? String == "unmatched" && byToken["reason"] as? String == "purchased-before-order", "\(byToken)")
            #expect(byToken["orderId"] as? String == "o-token")
            let (_, tokenOrder) = try await http.send(.get, "/v1/orders/o-token")
            #expect(tokenOrder["state"] as? String == "created")

            // The reconciler pairs neither with the orders created after them.
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 0, "\(summary)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE state = 'created' AND transaction_id IS NULL", as: Int.self) == 2)
        }
    }

    @Test("within the clock skew a purchase pays the order created just after it")
    func withinTheSkew() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-skew"))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: [
                "userId": "u-1", "orderId": "o-skew", "signedTransaction": try await signed("4100003", daysAgo: 4.0 / 1440),
            ])
            #expect(answer["outcome"] as? String == "matched" && answer["state"] as? String == "verified", "\(answer)")
        }
    }

    @Test("the reconciler pairs an old purchase with its user's order created before it, never with one created after")
    func reconcilerTakesAnOlderOrder() async throws {
        try await withReceiptsApplication(apple) { http, db in
            // An order of the team's history, created three days ago; a newer one of the same user and product.
            let history = secondServer(db).orders
            _ = try await history.create(
                OrderID(unchecked: "o-history"),
                OrderCreated(userId: UserID(unchecked: "u-3"), productId: ProductID(unchecked: "gems.100"), createdAt: Date(timeIntervalSinceNow: -3 * Self.day)),
                tokenGiven: false, metadata: Data("{}".utf8))
            try await http.send(.post, "/v1/orders", json: newOrder("o-today", user: "u-3"))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-3", "signedTransaction": try await signed("4100004", daysAgo: 2)])
            #expect(pooled["outcome"] as? String == "unmatched" && pooled["reason"] as? String == "no-order")
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 1, "\(summary)")
            let (_, paid) = try await http.send(.get, "/v1/orders/o-history")
            #expect(paid["transactionId"] as? String == "4100004" && paid["state"] as? String == "verified")
            let (_, today) = try await http.send(.get, "/v1/orders/o-today")
            #expect(today["state"] as? String == "created")
            // The history order keeps its creation time, in the projection and in a replay of the log.
            let created = try #require((paid["createdAt"] as? String).flatMap(EventCoding.parseDate))
            #expect(abs(created.timeIntervalSinceNow + 3 * Self.day) < 600, "\(paid)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("support ties an old purchase to a newer order only with force and a reason, which the pairing records")
    func supportOverride() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-support", user: "u-4"))
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-4", "signedTransaction": try await signed("4100005", daysAgo: 30)])
            let (refused, refusal) = try await http.send(.post, "/v1/transactions/4100005/match", json: ["orderId": "o-support"])
            #expect(refused == .conflict)
            let body = refusal["error"] as? [String: Any]
            #expect(body?["code"] as? String == "purchased-before-order")
            let message = body?["message"] as? String ?? ""
            #expect(message.contains("force"), "\(refusal)")
            let (_, unforced) = try await http.send(.get, "/v1/orders/o-support")
            #expect(unforced["state"] as? String == "created")

            let reason = "bought on the old backend; ticket 4411"
            let (status, order) = try await http.send(.post, "/v1/transactions/4100005/match", json: [
                "orderId": "o-support", "force": true, "reason": reason,
            ])
            #expect(status == .ok)
            #expect(order["state"] as? String == "verified" && order["transactionId"] as? String == "4100005")
            let rule = try await scalar(db, """
                SELECT data->>'rule' FROM events WHERE stream_id = 'transaction-4100005' AND type = 'transaction-matched'
                """, as: String.self)
            #expect(rule == "support-forced: \(reason)")
        }
    }

    @Test("with recovery orders on, a purchase refused as purchased-before-order gets no order of its own: it waits for support")
    func noRecoveryOrder() async throws {
        try await withReceiptsApplication(apple, configure: { $0.recoveryOrders = true }) { http, db in
            try await http.send(.put, "/v1/products/gems.100", json: ["price": "0.99", "currency": "USD"])
            try await http.send(.post, "/v1/orders", json: newOrder("o-later", user: "u-r"))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: [
                "userId": "u-r", "orderId": "o-later", "signedTransaction": try await signed("4100070", daysAgo: 90),
            ])
            #expect(answer["reason"] as? String == "purchased-before-order", "\(answer)")
            // A recent orphan of a user with no order still gets one: the policy is on.
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-s", "signedTransaction": try await apple.sign(TestApple.transaction("4100071", product: "gems.100"))])

            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["recoveryOrders"] as? Int == 1 && summary["notRecovered"] as? Int == 1 && summary["paired"] as? Int == 0, "\(summary)")
            let (missing, _) = try await http.send(.get, "/v1/orders/recovery-4100070")
            #expect(missing == .notFound)
            let (_, recovered) = try await http.send(.get, "/v1/orders/recovery-4100071")
            #expect(recovered["state"] as? String == "verified")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '4100070'", as: String.self) == "unmatched")
            let (_, later) = try await http.send(.get, "/v1/orders/o-later")
            #expect(later["state"] as? String == "created")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a backend's own receipt-received of an old purchase the ledger holds is 409 purchased-before-order; of a recent one, taken")
    func directEvent() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-direct", user: "u-d"))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: [
                "userId": "u-d", "orderId": "o-direct", "signedTransaction": try await signed("4100080", daysAgo: 90),
            ])
            #expect(answer["reason"] as? String == "purchased-before-order", "\(answer)")
            let (status, refusal) = try await http.send(.post, "/v1/orders/o-direct/events", json: ["type": "receipt-received", "data": receipt("4100080")])
            #expect(status == .conflict && errorOf(refusal)["code"] as? String == "purchased-before-order", "\(refusal)")
            let (_, order) = try await http.send(.get, "/v1/orders/o-direct")
            #expect(order["state"] as? String == "created" && order["transactionId"] as? String == nil, "\(order)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '4100080'", as: String.self) == "unmatched")

            // A purchase signed a minute ago, waiting in the pool, is the backend's to claim.
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-d", "signedTransaction": try await signed("4100081", daysAgo: 0)])
            let (taken, _) = try await http.send(.post, "/v1/orders/o-direct/events", json: ["type": "receipt-received", "data": receipt("4100081")])
            #expect(taken == .created)
            #expect(try await scalar(db, "SELECT order_id FROM apple_transactions WHERE transaction_id = '4100081'", as: String.self) == "o-direct")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}
