import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerCore
import LedgerJSON
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Testing

/// Everything belongs to an app (issue 39): an order's app is chosen when it is created and shown
/// in every answer; a transaction of one app never pays an order of another.
@Suite("Orders of several apps")
struct AppOrdersTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("the quickstart ledger (no app) creates orders as before, with bundleId null")
    func noAppNoBundle() async throws {
        try await withLiveApplication { http, db in
            let (status, order) = try await http.send(.post, "/v1/orders", json: newOrder("plain-1"))
            #expect(status == .created, "\(order)")
            #expect(order["bundleId"] is NSNull, "\(order)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE bundle_id IS NULL", as: Int.self) == 1)
            let (unknown, refused) = try await http.send(.post, "/v1/orders", json: newOrder("plain-2").merging(["bundleId": "com.example.none"]) { $1 })
            #expect(unknown == .badRequest && errorOf(refused)["code"] as? String == "unknown-app", "\(refused)")
        }
    }

    @Test("bundleId: optional with one app (the order is its), required with several, unknown 400, retired 409; shown in every answer")
    func bundleRules() async throws {
        try await withReceiptsApplication(apple) { http, db in
            // One app (the LEDGER_APPLE_* one): an order that names none is that app's.
            let (created, order) = try await http.send(.post, "/v1/orders", json: newOrder("one-app"))
            #expect(created == .created && order["bundleId"] as? String == TestApple.bundleId, "\(order)")
            #expect(try await scalar(db, "SELECT bundle_id FROM orders WHERE order_id = 'one-app'", as: String.self) == TestApple.bundleId)
            let (_, stored) = try await http.send(.get, "/v1/orders/one-app")
            let events = stored["events"] as? [[String: Any]] ?? []
            #expect((events.first?["data"] as? [String: Any])?["bundleId"] as? String == TestApple.bundleId, "the event records the app: \(stored)")

            let (added, _) = try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.other"])
            #expect(added == .created)
            let (required, missing) = try await http.send(.post, "/v1/orders", json: newOrder("no-app-named"))
            #expect(required == .badRequest && errorOf(missing)["code"] as? String == "bundle-id-required", "\(missing)")
            let (unknown, notHeld) = try await http.send(.post, "/v1/orders", json: newOrder("unknown").merging(["bundleId": "com.example.none"]) { $1 })
            #expect(unknown == .badRequest && errorOf(notHeld)["code"] as? String == "unknown-app", "\(notHeld)")
            // Named in another case: the app as the ledger holds it.
            let (other, otherOrder) = try await http.send(.post, "/v1/orders", json: newOrder("other-1").merging(["bundleId": "COM.example.OTHER"]) { $1 })
            #expect(other == .created && otherOrder["bundleId"] as? String == "com.example.other", "\(otherOrder)")

            // Product ids are per app: one id, an entry in each app.
            try await http.send(.put, "/v1/products/gems.100", json: ["price": "0.99", "currency": "USD"])
            let (put, product) = try await http.send(.put, "/v1/products/gems.100", json: ["price": "1.99", "currency": "EUR", "bundleId": "com.example.other"])
            #expect(put == .ok && product["bundleId"] as? String == "com.example.other", "\(product)")
            let (_, catalog) = try await http.send(.get, "/v1/products")
            let entries = (catalog["products"] as? [[String: Any]] ?? []).map { "\($0["bundleId"] as? String ?? "-"):\($0["price"] as? String ?? "-")" }
            #expect(entries == ["\(TestApple.bundleId):0.99", "com.example.other:1.99"], "\(catalog)")
            let (badApp, noApp) = try await http.send(.put, "/v1/products/gems.100", json: ["bundleId": "com.example.none"])
            #expect(badApp == .badRequest && errorOf(noApp)["code"] as? String == "unknown-app", "\(noApp)")

            let (retired, _) = try await http.send(.patch, "/v1/apps/com.example.other", json: ["retired": true])
            #expect(retired == .ok)
            let (conflict, refused) = try await http.send(.post, "/v1/orders", json: newOrder("other-2").merging(["bundleId": "com.example.other"]) { $1 })
            #expect(conflict == .conflict && errorOf(refused)["code"] as? String == "app-retired", "\(refused)")
            // Retries of creates that succeeded still answer their orders: after the app was
            // retired, and without `bundleId` once a second app made it required.
            let (again, retry) = try await http.send(.post, "/v1/orders", json: newOrder("other-1").merging(["bundleId": "com.example.other"]) { $1 })
            #expect(again == .ok && retry["orderId"] as? String == "other-1", "\(retry)")
            let (againOne, retryOne) = try await http.send(.post, "/v1/orders", json: newOrder("one-app"))
            #expect(againOne == .ok && retryOne["bundleId"] as? String == TestApple.bundleId, "\(retryOne)")

            // Lists and event answers show it too; user ids are per app: the search takes the app.
            let (_, list) = try await http.send(.get, "/v1/orders?userId=u-1&bundleId=com.example.other")
            #expect((list["orders"] as? [[String: Any]])?.map { $0["orderId"] as? String } == ["other-1"], "\(list)")
            // A bundle id is found in any case (docs/apps.md), in the pool's list too.
            let (_, upper) = try await http.send(.get, "/v1/orders?userId=u-1&bundleId=COM.EXAMPLE.OTHER")
            #expect((upper["orders"] as? [[String: Any]])?.map { $0["orderId"] as? String } == ["other-1"], "\(upper)")
            let (pooled, _) = try await http.send(.get, "/v1/transactions/unmatched?bundleId=COM.EXAMPLE.OTHER")
            #expect(pooled == .ok)
            let (_, appended) = try await http.send(.post, "/v1/orders/one-app/events", json: ["type": "payment-added", "data": ["queuedAt": "2026-11-21T10:00:00Z"]])
            #expect(appended["bundleId"] as? String == TestApple.bundleId, "\(appended)")
        }
    }

    @Test("the database refuses an order of an unknown or retired app and a second app without bundleId, whatever Swift decided")
    func databaseChecksApps() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.other", "retired": true])
            func create(_ id: String, _ bundle: String?) async -> String? {
                let created = OrderCreated(userId: UserID(unchecked: "u"), productId: ProductID(unchecked: "gems.100"), bundleId: bundle.map(BundleID.init(unchecked:)))
                do {
                    _ = try await db.writer.append([try EventCoding.newEvent(.created(created), id: EventID(), metadata: Data("{}".utf8))], to: OrderID(unchecked: id).streamID)
                    return nil
                } catch let error as OrderLedgerError {
                    return error.code
                } catch {
                    return "\(error)"
                }
            }
            #expect(await create("db-unknown", "com.example.none") == "unknown-app")
            #expect(await create("db-retired", "com.example.other") == "app-retired")
            #expect(await create("db-none", nil) == "bundle-id-required")
            #expect(await create("db-ok", TestApple.bundleId) == nil)
            #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE order_id LIKE 'db-%'", as: Int.self) == 1)
        }
    }

    @Test("a transaction of app A never pays an order of app B, by order id or by appAccountToken: the order is untouched, the transaction waits in A's pool")
    func appMismatch() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.other"])
            let (_, order) = try await http.send(.post, "/v1/orders", json: newOrder("b-order").merging(["bundleId": "com.example.other"]) { $1 })
            let token = try #require(order["appAccountToken"] as? String)

            // By order id.
            let signed = try await apple.sign(TestApple.transaction("9900001"))
            let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "b-order", "userId": "u-1", "signedTransaction": signed])
            #expect(status == .ok)
            #expect(answer["outcome"] as? String == "unmatched" && answer["reason"] as? String == "app-mismatch", "\(answer)")
            #expect(answer["finishTransaction"] as? Bool == false, "kept in the pool, not rejected: the client keeps it until an order takes it")
            // By appAccountToken.
            let tokened = TestApple.transaction("9900002", appAccountToken: UUID(uuidString: token))
            let (_, byToken) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await apple.sign(tokened)])
            #expect(byToken["outcome"] as? String == "unmatched" && byToken["reason"] as? String == "app-mismatch", "\(byToken)")

            let (_, untouched) = try await http.send(.get, "/v1/orders/b-order")
            #expect(untouched["state"] as? String == "created" && untouched["transactionId"] is NSNull, "\(untouched)")
            let pooled = try await scalar(
                db, "SELECT string_agg(transaction_id || ':' || bundle_id, ',' ORDER BY transaction_id) FROM unmatched_transactions", as: String.self)
            #expect(pooled == "9900001:\(TestApple.bundleId),9900002:\(TestApple.bundleId)")

            // Support cannot pair it either (the database refuses it whatever the caller).
            let (refused, body) = try await http.send(
                .post, "/v1/transactions/9900001/match", json: ["orderId": "b-order", "reason": "customer asked"])
            #expect(refused == .conflict && errorOf(body)["code"] as? String == "app-mismatch", "\(body)")
            #expect(try await http.send(.get, "/v1/orders/b-order").1["state"] as? String == "created")

            // The reconciler never pairs across apps either.
            let (_, pass) = try await http.send(.post, "/v1/reconcile", json: [:])
            #expect(pass["paired"] as? Int == 0, "\(pass)")
        }
    }

    @Test("a backend's unverified claim of a transaction Apple signed for another app is taken back: the order of Apple's app whose proof names it takes it")
    func claimOfAnotherApp() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.other"])
            try await http.send(.post, "/v1/orders", json: newOrder("b-claimer").merging(["bundleId": "com.example.other"]) { $1 })
            var own = receipt("9900010")
            own["purchaseDate"] = ISO8601DateFormatter().string(from: Date())
            let (claimed, claim) = try await http.send(.post, "/v1/orders/b-claimer/events", json: ["type": "receipt-received", "data": own])
            #expect(claimed == .created, "\(claim)")
            try await http.send(.post, "/v1/orders", json: newOrder("a-payer").merging(["bundleId": TestApple.bundleId]) { $1 })
            let signed = try await apple.sign(TestApple.transaction("9900010"))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "a-payer", "signedTransaction": signed])
            #expect(answer["outcome"] as? String == "matched" && answer["orderId"] as? String == "a-payer", "\(answer)")
            let (_, claimer) = try await http.send(.get, "/v1/orders/b-claimer")
            #expect(claimer["state"] as? String == "created" && claimer["transactionId"] is NSNull, "\(claimer)")
            #expect(try await scalar(db, "SELECT order_id || ' ' || bundle_id FROM apple_transactions WHERE transaction_id = '9900010'", as: String.self)
                == "a-payer \(TestApple.bundleId)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a later transaction of one app naming another app's subscription is refused, and that subscription is left as it was")
    func renewalOfAnotherAppsSubscription() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.other"])
            let now = Date()
            var start = TestApple.subscriptionPeriod("9900020", of: "9900020", purchaseDate: now, expires: now + 30 * 86_400)
            start.bundleId = "com.example.other"
            let (_, started) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-b", "signedTransaction": try await apple.sign(start)])
            #expect(started["outcome"] as? String == "unmatched", "\(started)")
            let renewal = TestApple.subscriptionPeriod("9900021", of: "9900020", purchaseDate: now + 60, expires: now + 60 * 86_400)
            let (status, refused) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-a", "signedTransaction": try await apple.sign(renewal)])
            #expect(status == .badRequest, "\(refused)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM subscription_periods WHERE original_transaction_id = '9900020'", as: Int.self) == 1)
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE transaction_id = '9900021'", as: Int.self) == 0)
        }
    }

    @Test("a renewal another app's order claimed, unverified, is taken back as the renewal it is, never left payable")
    func renewalClaimedByAnotherApp() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.other"])
            try await http.send(.post, "/v1/orders", json: newOrder("b-renewal", product: "pro.monthly").merging(["bundleId": "com.example.other"]) { $1 })
            var own = receipt("9900031", product: "pro.monthly")
            own["purchaseDate"] = ISO8601DateFormatter().string(from: Date())
            let (claimed, claim) = try await http.send(.post, "/v1/orders/b-renewal/events", json: ["type": "receipt-received", "data": own])
            #expect(claimed == .created, "\(claim)")
            let now = Date()
            let renewal = TestApple.subscriptionPeriod("9900031", of: "9900030", purchaseDate: now, expires: now + 30 * 86_400)
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": try await apple.sign(renewal)])
            #expect(answer["outcome"] as? String == "recorded", "\(answer)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '9900031' AND order_id IS NULL", as: String.self) == "renewal")
            let (_, order) = try await http.send(.get, "/v1/orders/b-renewal")
            #expect(order["state"] as? String == "created", "\(order)")
        }
    }
}
