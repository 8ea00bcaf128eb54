import AppStoreStandIn
import AppleReceipts
import Foundation
import HTTPTypes
import LedgerCore
import LedgerJSON
import LedgerServer
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// Issue 40's intake over HTTP: a transaction's role decides before any order is looked at. A
/// subscription's start pays its order and starts the subscription; its renewals are recorded on
/// it, once per period, however they arrive, and never pay an order; a family member's share is
/// never an order's; bad subscription transactions are refused with nothing recorded.
@Suite("Subscriptions and family sharing at the intake")
struct SubscriptionIntakeTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    static let day: TimeInterval = 86_400

    /// A signed auto-renewable transaction: the start of subscription `original` (nil: its own
    /// id), or its `period`-th renewal. Periods are 30 days from 90 days ago; the latest ends far in the future.
    static func subscription(
        _ id: String, original: String? = nil, period: Int = 0, product: String = "monthly", group: String? = "g-monthly",
        token: UUID? = nil, shared: Bool = false
    ) -> SignedTransactionPayload {
        let start = Date(timeIntervalSinceNow: -90 * day + Double(period) * 30 * day)
        var payload = TestApple.transaction(id, product: product, appAccountToken: token, purchaseDate: start)
        payload.originalTransactionId = original ?? id
        payload.type = "Auto-Renewable Subscription"
        payload.expiresDate = Date(timeIntervalSinceNow: 3650 * day + Double(period) * 30 * day).millisecondsSince1970
        payload.webOrderLineItemId = "wol-\(id)"
        payload.transactionReason = original == nil ? "PURCHASE" : "RENEWAL"
        payload.subscriptionGroupIdentifier = group
        if shared { payload.inAppOwnershipType = "FAMILY_SHARED" }
        return payload
    }

    @discardableResult
    func upload(_ http: LedgerHTTP, _ payload: SignedTransactionPayload, user: String? = nil, order: String? = nil) async throws -> (HTTPResponse.Status, [String: Any]) {
        var body: [String: Any] = ["signedTransaction": try await apple.sign(payload)]
        if let user { body["userId"] = user }
        if let order { body["orderId"] = order }
        return try await http.send(.post, "/v1/receipts", json: body)
    }

    func queue(_ http: LedgerHTTP, _ order: String, user: String, product: String) async throws {
        try await http.send(.post, "/v1/orders", json: newOrder(order, user: user, product: product))
        try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "payment-added", "data": ["queuedAt": LedgerJSONDate.now(minus: 300)]])
    }

    func state(_ http: LedgerHTTP, _ order: String) async throws -> String? {
        try await http.send(.get, "/v1/orders/\(order)").1["state"] as? String
    }

    func periods(_ db: TestDatabase, _ subscription: String) async throws -> Int? {
        try await scalar(db, "SELECT count(*)::int FROM subscription_periods WHERE original_transaction_id = \(subscription)", as: Int.self)
    }

    func rowStatus(_ db: TestDatabase, _ transaction: String) async throws -> String? {
        try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = \(transaction)", as: String.self)
    }

    @Test("issue 40's story: the renewal (upload, DID_RENEW, sweep) is one period of its subscription; the abandoned order stays payment-added")
    func renewalNeverPaysTheAbandonedOrder() async throws {
        try await withAppleAPIApplication(apple, standIn, configure: { configuration in
            olderPurchases(&configuration)
            configuration.recoveryAfter = 0
            configuration.recoveryInterval = 0
        }) { http, db, _ in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-sub", user: "u-1", product: "monthly"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            let start = Self.subscription("8000001", token: token)
            let (_, bought) = try await upload(http, start, user: "u-1", order: "o-sub")
            #expect(bought["outcome"] as? String == "matched" && bought["orderId"] as? String == "o-sub", "\(bought)")
            try await http.send(.post, "/v1/orders/o-sub/events", json: ["type": "delivered", "data": [:]])
            try await queue(http, "o-abandoned", user: "u-1", product: "monthly")
            #expect(try await periods(db, "8000001") == 1)
            #expect(try await scalar(db, "SELECT user_id FROM subscriptions WHERE original_transaction_id = '8000001'", as: String.self) == "u-1")

            // The renewal carries the start's appAccountToken, which names the delivered order.
            let renewal = Self.subscription("8000002", original: "8000001", period: 1, token: token)
            let (status, answer) = try await upload(http, renewal, user: "u-1")
            #expect(status == .ok)
            #expect(answer["outcome"] as? String == "recorded" && answer["reason"] as? String == "subscription-renewal", "\(answer)")
            #expect(answer["finishTransaction"] as? Bool == true && answer["orderId"] as? String == "o-sub" && answer["state"] as? String == "delivered")
            let (notified, applied) = try await http.notifyApple(try await apple.notification("DID_RENEW", subtype: nil, transaction: renewal))
            #expect(notified == .ok, "\(applied)")
            let (_, again) = try await upload(http, renewal, user: "u-1")
            #expect(again["outcome"] as? String == "recorded" && again["orderId"] as? String == "o-sub")

            // The next renewal reaches the ledger only through a history sweep, beside a
            // subscription transaction Apple would never sign without its expiry.
            var broken = Self.subscription("8000009", original: "8000001", period: 1)
            broken.expiresDate = nil
            let next = Self.subscription("8000003", original: "8000001", period: 2, token: token)
            try await http.send(.post, "/v1/users/u-1/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("acct-sub"))])
            await standIn.setHistory("acct-sub", [.init(revision: "r1", hasMore: false, signedTransactions: [
                try await apple.sign(start), try await apple.sign(renewal), try await apple.sign(broken), try await apple.sign(next),
            ])])
            let (_, swept) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(swept["known"] as? Int == 2 && swept["refused"] as? Int == 1, "\(swept)")
            #expect(swept["ingested"] as? [String: Int] == ["recorded": 1], "\(swept)")
            #expect(try await rowStatus(db, "8000009") == nil, "nothing of the refused transaction is recorded")

            let (_, pass) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(pass["paired"] as? Int == 0, "\(pass)")
            #expect(try await state(http, "o-abandoned") == "payment-added")
            #expect(try await state(http, "o-sub") == "delivered")
            #expect(try await periods(db, "8000001") == 3, "the start and two renewals, each once")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE type = 'subscription-period'", as: Int.self) == 3)
            #expect(try await rowStatus(db, "8000002") == "renewal")
            #expect(try await rowStatus(db, "8000003") == "renewal")
            #expect(try await scalar(db, "SELECT kind FROM subscription_periods WHERE transaction_id = '8000002'", as: String.self) == "subscription-renewal")
            #expect(try await scalar(db, "SELECT order_id FROM dashboards.subscriptions", as: String.self) == "o-sub")
            let differences = try await ProjectionRebuilder(database: db.database).verify()
            #expect(differences == [], "promise 9: \(differences)")
        }
    }

    @Test("a family member's FAMILY_SHARED transaction never pays the member's open order, nor is paired with one; a shared subscription is the member's own")
    func familySharedNeverPays() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            try await queue(http, "o-member", user: "u-2", product: "lifetime")
            try await queue(http, "o-member-2", user: "u-2", product: "lifetime")
            var shared = TestApple.transaction("8100001", product: "lifetime")
            shared.type = "Non-Consumable"
            shared.inAppOwnershipType = "FAMILY_SHARED"
            let (_, named) = try await upload(http, shared, user: "u-2", order: "o-member")
            #expect(named["outcome"] as? String == "recorded" && named["reason"] as? String == "family-shared", "\(named)")
            #expect(named["orderId"] as? String == "o-member" && named["state"] as? String == "payment-added" && named["finishTransaction"] as? Bool == true)
            var other = shared
            other.transactionId = "8100002"
            other.originalTransactionId = "8100002"
            let (_, unnamed) = try await upload(http, other, user: "u-2")
            #expect(unnamed["outcome"] as? String == "recorded" && unnamed["orderId"] is NSNull, "\(unnamed)")

            let (_, pass) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(pass["paired"] as? Int == 0, "\(pass)")
            #expect(try await state(http, "o-member") == "payment-added")
            #expect(try await state(http, "o-member-2") == "payment-added")
            #expect(try await rowStatus(db, "8100001") == "shared")
            #expect(try await rowStatus(db, "8100002") == "shared")
            #expect(try await scalar(db, "SELECT user_id FROM apple_transactions WHERE transaction_id = '8100001'", as: String.self) == "u-2")

            // A shared auto-renewable subscription: the member's own subscription, family-shared.
            let member = Self.subscription("8100010", shared: true)
            let (_, sub) = try await upload(http, member, user: "u-2")
            #expect(sub["outcome"] as? String == "recorded" && sub["reason"] as? String == "family-shared", "\(sub)")
            let renewed = Self.subscription("8100011", original: "8100010", period: 1, shared: true)
            try await http.notifyApple(try await apple.notification("DID_RENEW", transaction: renewed))
            #expect(try await scalar(db, "SELECT user_id || ' ' || family_shared FROM subscriptions WHERE original_transaction_id = '8100010'", as: String.self) == "u-2 true")
            #expect(try await periods(db, "8100010") == 2)
            #expect(try await rowStatus(db, "8100011") == "shared")
            let differences = try await ProjectionRebuilder(database: db.database).verify()
            #expect(differences == [], "promise 9: \(differences)")
        }
    }

    @Test("a shared non-consumable Apple told of first (no user) is the member's once the member uploads it, once; another's later upload changes nothing")
    func sharedNotifiedFirst() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            var shared = TestApple.transaction("8100021", product: "lifetime")
            shared.type = "Non-Consumable"
            shared.inAppOwnershipType = "FAMILY_SHARED"
            let (told, _) = try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: shared))
            #expect(told == .ok)
            #expect(try await rowStatus(db, "8100021") == "shared")
            let (_, nobody) = try await http.send(.get, "/v1/users/u-3/entitlements")
            #expect((nobody["nonConsumables"] as? [Any])?.isEmpty == true, "\(nobody)")

            let (_, uploaded) = try await upload(http, shared, user: "u-3")
            #expect(uploaded["outcome"] as? String == "recorded" && uploaded["reason"] as? String == "family-shared", "\(uploaded)")
            let (_, owned) = try await http.send(.get, "/v1/users/u-3/entitlements")
            let items = owned["nonConsumables"] as? [[String: Any]] ?? []
            #expect(items.map { $0["transactionId"] as? String } == ["8100021"] && items.first?["source"] as? String == "family-shared", "\(owned)")
            let count = try await eventCount(db)
            _ = try await upload(http, shared, user: "u-3")
            _ = try await upload(http, shared, user: "u-4")
            #expect(try await eventCount(db) == count, "the member is learned once")
            #expect(try await scalar(db, "SELECT user_id FROM apple_transactions WHERE transaction_id = '8100021'", as: String.self) == "u-3")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a renewal or a family share pooled before the ledger knew subscriptions (unmatched, no Apple type) is never paired; a purchase pooled then still is")
    func pooledBeforeSubscriptions() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            try await http.send(.put, "/v1/products/pro.old", json: ["type": "auto-renewable", "subscriptionGroup": "g-old", "price": "4.99", "currency": "USD"])
            try await queue(http, "o-old", user: "u-5", product: "pro.old")
            try await queue(http, "o-family", user: "u-5", product: "lifetime.old")
            try await queue(http, "o-gem", user: "u-5", product: "gem.old")
            // As the intake pooled them before issue 40: `transaction-unmatched`, no type, reason no-order.
            func pooled(_ id: String, original: String, product: String, ownership: String = "PURCHASED") async throws {
                let transaction = AppleTransaction(
                    transactionId: TransactionID(unchecked: id), originalTransactionId: original, productId: ProductID(unchecked: product),
                    purchaseDate: Date().addingTimeInterval(-60), environment: "Sandbox", bundleId: TestApple.bundleId,
                    inAppOwnershipType: ownership, price: "4.99", currency: "USD", format: .jws, receiptSha256: String(repeating: "0", count: 64))
                let body = TransactionUnmatched(transaction: transaction, userId: UserID(unchecked: "u-5"), claimedOrderId: nil, reason: "no-order")
                let event = try EventCoding.newEvent(.unmatched(body), id: EventID(UUID()), metadata: Data("{}".utf8))
                _ = try await db.writer.append([event], to: transaction.transactionId.streamID)
            }
            try await pooled("8400002", original: "8400001", product: "pro.old")
            try await pooled("8400010", original: "8400010", product: "lifetime.old", ownership: "FAMILY_SHARED")
            try await pooled("8400020", original: "8400020", product: "gem.old")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE status = 'unmatched'", as: Int.self) == 3)

            let (_, pass) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(pass["paired"] as? Int == 1, "\(pass)")
            #expect(try await state(http, "o-gem") == "verified", "a purchase pooled then is paired as before")
            #expect(try await state(http, "o-old") == "payment-added", "a later period of an auto-renewable product pays no order")
            #expect(try await state(http, "o-family") == "payment-added", "a family member's share pays no order")
            #expect(try await rowStatus(db, "8400002") == "unmatched")
            #expect(try await rowStatus(db, "8400010") == "unmatched")
            #expect(try await scalar(db, "SELECT count(*)::int FROM dashboards.unmatched_transactions", as: Int.self) == 2, "support still sees both")
        }
    }

    @Test("a renewal before its start waits as a renewal no order takes; the start ties it, once")
    func renewalWaitsForItsStart() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            try await queue(http, "o-waiting", user: "u-3", product: "monthly")
            let renewal = Self.subscription("8200002", original: "8200001", period: 1)
            let (_, early) = try await upload(http, renewal, user: "u-3")
            #expect(early["outcome"] as? String == "recorded" && early["reason"] as? String == "subscription-renewal", "\(early)")
            #expect(early["orderId"] is NSNull && early["finishTransaction"] as? Bool == true)
            #expect(try await rowStatus(db, "8200002") == "renewal")
            #expect(try await scalar(db, "SELECT count(*)::int FROM subscriptions", as: Int.self) == 0)
            let (_, pass) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(pass["paired"] as? Int == 0, "\(pass)")
            #expect(try await state(http, "o-waiting") == "payment-added")

            // The start arrives by notification (no order names it: it waits in the pool, as a purchase does).
            let start = Self.subscription("8200001")
            let (_, applied) = try await http.notifyApple(try await apple.notification("SUBSCRIBED", subtype: "INITIAL_BUY", transaction: start))
            // The start is a subscription's: the notification is recorded on the subscription it started.
            #expect(applied["streamId"] as? String == "subscription-8200001", "\(applied)")
            #expect(try await periods(db, "8200001") == 2)
            // Its user: none came with the start, the renewal's client named one.
            #expect(try await scalar(db, "SELECT user_id FROM subscriptions WHERE original_transaction_id = '8200001'", as: String.self) == "u-3")
            #expect(try await scalar(db, "SELECT user_id FROM apple_transactions WHERE transaction_id = '8200001' AND order_id IS NULL", as: String.self) == "u-3",
                    "the start waits for that user too")
            let recorded = "SELECT count(*)::int FROM events WHERE type IN ('transaction-unmatched', 'subscription-started', 'subscription-period')"
            let events = try await scalar(db, PostgresQuery(unsafeSQL: recorded), as: Int.self)
            let (_, again) = try await upload(http, renewal, user: "u-3")
            #expect(again["outcome"] as? String == "recorded")
            try await http.notifyApple(try await apple.notification("SUBSCRIBED", subtype: "INITIAL_BUY", transaction: start))
            #expect(try await scalar(db, PostgresQuery(unsafeSQL: recorded), as: Int.self) == events, "nothing of the transactions is recorded again")
            #expect(try await periods(db, "8200001") == 2)
            let differences = try await ProjectionRebuilder(database: db.database).verify()
            #expect(differences == [], "promise 9: \(differences)")
            // Dropped and replayed: the same rows.
            try await ProjectionRebuilder(database: db.database).rebuild()
            #expect(try await periods(db, "8200001") == 2)
            #expect(try await scalar(db, "SELECT user_id FROM subscriptions WHERE original_transaction_id = '8200001'", as: String.self) == "u-3")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    @Test("bad subscription transactions are 400s naming the field, in an upload and in a notification, with nothing recorded; the catalog's type decides")
    func badInput() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            for product in ["monthly", "yearly", "annual.other", "plain.sub", "gem.sub"] {
                try await http.send(.put, "/v1/products/\(product)", json: ["price": "4.99", "currency": "USD"])
            }
            // (Set in SQL: the API's product types are another part of issue 40.)
            let typed = try await scalar(db, """
                WITH typed AS (
                    UPDATE products SET type = CASE WHEN product_id = 'gem.sub' THEN 'consumable' ELSE 'auto-renewable' END,
                                        subscription_group = CASE WHEN product_id = 'annual.other' THEN 'g-other'
                                                                  WHEN product_id = 'plain.sub' THEN NULL ELSE 'g-monthly' END
                    RETURNING 1)
                SELECT count(*)::int FROM typed
                """, as: Int.self)
            #expect(typed == 5)
            try await http.send(.post, "/v1/orders", json: newOrder("o-bad", user: "u-4", product: "monthly"))
            let events = try await eventCount(db)

            var noExpiry = Self.subscription("8300001")
            noExpiry.expiresDate = nil
            var noOriginal = Self.subscription("8300002")
            noOriginal.originalTransactionId = nil
            // The catalog says auto-renewable where Apple's signed type is silent.
            var untyped = Self.subscription("8300003", product: "plain.sub")
            untyped.type = nil
            untyped.expiresDate = nil
            for (payload, field) in [(noExpiry, "expiresDate"), (noOriginal, "originalTransactionId"), (untyped, "expiresDate")] {
                let (status, answer) = try await upload(http, payload, user: "u-4", order: "o-bad")
                #expect(status == .badRequest && errorOf(answer)["code"] as? String == "invalid-input", "\(answer)")
                #expect(errorOf(answer)["field"] as? String == field, "\(answer)")
                let (notified, refusal) = try await http.notifyApple(try await apple.notification("SUBSCRIBED", transaction: payload))
                #expect(notified == .badRequest && errorOf(refusal)["field"] as? String == field, "\(refusal)")
            }
            #expect(try await eventCount(db) == events, "nothing of a refused transaction is recorded")
            #expect(try await state(http, "o-bad") == "created")

            // The catalog's consumable is a purchase whatever Apple's type says.
            var consumable = Self.subscription("8300004", product: "gem.sub")
            consumable.expiresDate = nil
            let (_, paid) = try await upload(http, consumable, user: "u-4")
            #expect(paid["outcome"] as? String == "unmatched" && paid["reason"] as? String == "no-order", "\(paid)")

            // A renewal of a product outside its subscription's group (by the catalog).
            let start = Self.subscription("8300010")
            #expect(try await upload(http, start, user: "u-4", order: "o-bad").1["outcome"] as? String == "matched")
            let within = try await eventCount(db)
            let crossed = Self.subscription("8300011", original: "8300010", period: 1, product: "annual.other", group: "g-monthly")
            let (status, refused) = try await upload(http, crossed, user: "u-4")
            #expect(status == .badRequest && errorOf(refused)["field"] as? String == "productId", "\(refused)")
            let (notified, refusal) = try await http.notifyApple(try await apple.notification("DID_RENEW", transaction: crossed))
            #expect(notified == .badRequest && errorOf(refusal)["field"] as? String == "productId", "\(refusal)")
            #expect(try await eventCount(db) == within)
            // A crossgrade within the group is the subscription's.
            let upgraded = Self.subscription("8300012", original: "8300010", period: 1, product: "yearly")
            #expect(try await upload(http, upgraded, user: "u-4").1["outcome"] as? String == "recorded")
            #expect(try await scalar(db, "SELECT product_id FROM subscriptions WHERE original_transaction_id = '8300010'", as: String.self) == "yearly")
            let differences = try await ProjectionRebuilder(database: db.database).verify()
            #expect(differences == [], "promise 9: \(differences)")
        }
    }
}
