import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import Testing

/// A subscription Apple's notification started before the client's upload: it starts without a
/// user, and gets the user its start is then claimed for.
@Suite("A subscription's user, learnt after it started, over HTTP")
struct SubscriptionUserTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    static let day: TimeInterval = 86_400

    func listed(_ http: LedgerHTTP, _ user: String) async throws -> [String] {
        let (status, json) = try await http.send(.get, "/v1/users/\(user)/subscriptions")
        #expect(status == .ok, "\(json)")
        return (json["subscriptions"] as? [[String: Any]] ?? []).compactMap { $0["originalTransactionId"] as? String }
    }

    @Test("SUBSCRIBED before the client's upload: the upload that matches the order makes the subscription its user's")
    func notificationFirstThenUpload() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7400001"
            try await http.send(.post, "/v1/orders", json: newOrder("o-late", user: "u-late", product: "pro.monthly"))
            let start = SubscriptionNotificationTests.period(otid, 0, purchased: now.addingTimeInterval(-60), expires: now.addingTimeInterval(30 * Self.day))
            _ = try await http.notifyAppleTaken(try await apple.notification(
                "SUBSCRIBED", subtype: "INITIAL_BUY", transaction: start, renewalInfo: TestApple.renewalInfo(otid)))
            let store = SubscriptionStore(database: db.database)
            #expect(try await store.subscription(otid)?.userId == nil, "Apple's notification names no user")

            let (_, answer) = try await http.send(.post, "/v1/receipts", json: [
                "userId": "u-late", "orderId": "o-late", "signedTransaction": try await apple.sign(start),
            ])
            #expect(answer["outcome"] as? String == "matched" && answer["orderId"] as? String == "o-late", "\(answer)")
            #expect(try await listed(http, "u-late") == [otid])
            let (_, one) = try await http.send(.get, "/v1/subscriptions/\(otid)")
            #expect(one["userId"] as? String == "u-late" && one["orderId"] as? String == "o-late", "\(one)")
            let (_, entitled) = try await http.send(.get, "/v1/users/u-late/entitlements")
            #expect((entitled["subscriptions"] as? [[String: Any]])?.count == 1, "\(entitled)")

            // Sent again: the user is recorded once.
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-late", "orderId": "o-late", "signedTransaction": try await apple.sign(start)])
            let recorded = try await scalar(
                db, "SELECT count(*)::int FROM events WHERE stream_id = \("subscription-\(otid)") AND type = 'subscription-user-recorded'", as: Int.self)
            #expect(recorded == 1)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("SUBSCRIBED before any upload, its Apple account linked later: the reconciler's pairing of the start makes the subscription its order's user's")
    func notificationFirstThenReconciler() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7400201"
            let start = SubscriptionNotificationTests.period(otid, 0, purchased: now.addingTimeInterval(-60), expires: now.addingTimeInterval(30 * Self.day))
            _ = try await http.notifyAppleTaken(try await apple.notification(
                "SUBSCRIBED", subtype: "INITIAL_BUY", transaction: start, renewalInfo: TestApple.renewalInfo(otid)))
            #expect(try await SubscriptionStore(database: db.database).subscription(otid)?.userId == nil, "Apple's notification names no user")
            // The app's login links the Apple account to its user; the user's order waits in the queue.
            let (linked, link) = try await http.send(.post, "/v1/users/u-rec/app-transaction", json: [
                "signedAppTransaction": try await apple.sign(TestApple.appTransaction(start.appTransactionId)),
            ])
            #expect(linked == .ok, "\(link)")
            try await http.send(.post, "/v1/orders", json: newOrder("o-rec", user: "u-rec", product: "pro.monthly"))
            try await http.send(.post, "/v1/orders/o-rec/events", json: ["type": "payment-added", "data": ["queuedAt": LedgerJSONDate.now(minus: 300)]])

            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 1, "\(summary)")
            #expect(try await listed(http, "u-rec") == [otid])
            let (_, one) = try await http.send(.get, "/v1/subscriptions/\(otid)")
            #expect(one["userId"] as? String == "u-rec" && one["orderId"] as? String == "o-rec", "\(one)")
            let (_, entitled) = try await http.send(.get, "/v1/users/u-rec/entitlements")
            #expect((entitled["subscriptions"] as? [[String: Any]])?.count == 1, "\(entitled)")
            let recorded = try await scalar(db, """
                SELECT count(*)::int FROM events WHERE stream_id = \("subscription-\(otid)") AND type = 'subscription-user-recorded'
                   AND data ->> 'userId' = 'u-rec' AND data ->> 'orderId' = 'o-rec'
                """, as: Int.self)
            #expect(recorded == 1)

            // The client's upload of the start afterwards records no second user.
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-rec", "orderId": "o-rec", "signedTransaction": try await apple.sign(start)])
            #expect(try await scalar(
                db, "SELECT count(*)::int FROM events WHERE stream_id = \("subscription-\(otid)") AND type = 'subscription-user-recorded'", as: Int.self) == 1)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("SUBSCRIBED and DID_RENEW before any upload, then the client uploads the renewal (StoreKit's latest) for its user: the subscription is that user's, and the reconciler pairs the start with the user's open order")
    func notificationsFirstThenRenewalUpload() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7400301"
            try await http.send(.post, "/v1/orders", json: newOrder("o-paid", user: "u-ren", product: "pro.monthly"))
            try await http.send(.post, "/v1/orders/o-paid/events", json: ["type": "payment-added", "data": ["queuedAt": LedgerJSONDate.now(minus: 300)]])
            let start = SubscriptionNotificationTests.period(otid, 0, purchased: now.addingTimeInterval(-31 * Self.day), expires: now.addingTimeInterval(-Self.day))
            let renewal = SubscriptionNotificationTests.period(otid, 1, purchased: now.addingTimeInterval(-Self.day), expires: now.addingTimeInterval(29 * Self.day))
            _ = try await http.notifyAppleTaken(try await apple.notification(
                "SUBSCRIBED", subtype: "INITIAL_BUY", transaction: start, renewalInfo: TestApple.renewalInfo(otid)))
            _ = try await http.notifyAppleTaken(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid)))
            #expect(try await listed(http, "u-ren").isEmpty)

            let (_, answer) = try await http.send(.post, "/v1/receipts", json: [
                "userId": "u-ren", "orderId": "o-paid", "signedTransaction": try await apple.sign(renewal),
            ])
            #expect(answer["outcome"] as? String == "recorded" && answer["reason"] as? String == "subscription-renewal", "\(answer)")
            #expect(try await listed(http, "u-ren") == [otid])
            let (_, entitled) = try await http.send(.get, "/v1/users/u-ren/entitlements")
            #expect((entitled["subscriptions"] as? [[String: Any]])?.count == 1, "\(entitled)")
            #expect(try await scalar(db, "SELECT user_id FROM apple_transactions WHERE transaction_id = '7400301'", as: String.self) == "u-ren")

            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 1, "\(summary)")
            let (_, order) = try await http.send(.get, "/v1/orders/o-paid")
            #expect(order["state"] as? String == "verified" && order["transactionId"] as? String == otid, "the start pays its order: \(order)")

            // Sent again: nothing more.
            let events = try await eventCount(db)
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-ren", "signedTransaction": try await apple.sign(renewal)])
            #expect(try await eventCount(db) == events)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a renewal uploaded for another user than the one its Apple account is linked to names no one: the account's user decides")
    func renewalUploadAgainstKnownUser() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7400401"
            let start = SubscriptionNotificationTests.period(otid, 0, purchased: now.addingTimeInterval(-31 * Self.day), expires: now.addingTimeInterval(-Self.day))
            let renewal = SubscriptionNotificationTests.period(otid, 1, purchased: now.addingTimeInterval(-Self.day), expires: now.addingTimeInterval(29 * Self.day))
            let (linked, _) = try await http.send(.post, "/v1/users/u-owner/app-transaction", json: [
                "signedAppTransaction": try await apple.sign(TestApple.appTransaction(start.appTransactionId))])
            #expect(linked == .ok)
            _ = try await http.notifyAppleTaken(try await apple.notification(
                "SUBSCRIBED", subtype: "INITIAL_BUY", transaction: start, renewalInfo: TestApple.renewalInfo(otid)))
            _ = try await http.notifyAppleTaken(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid)))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-other", "signedTransaction": try await apple.sign(renewal)])
            #expect(answer["outcome"] as? String == "recorded", "\(answer)")
            #expect(try await listed(http, "u-other").isEmpty, "another user's Apple account")
            #expect(try await scalar(db, "SELECT coalesce(user_id, '-') FROM apple_transactions WHERE transaction_id = '7400401'", as: String.self) != "u-other")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a family member's shared subscription first seen by notification becomes the member's when the member's client uploads it")
    func sharedNotificationFirst() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7400101"
            let shared = SubscriptionNotificationTests.period(
                otid, 0, purchased: now.addingTimeInterval(-60), expires: now.addingTimeInterval(30 * Self.day), ownership: "FAMILY_SHARED")
            _ = try await http.notifyAppleTaken(try await apple.notification(
                "SUBSCRIBED", subtype: "INITIAL_BUY", transaction: shared, renewalInfo: TestApple.renewalInfo(otid)))
            #expect(try await SubscriptionStore(database: db.database).subscription(otid)?.userId == nil)
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-member", "signedTransaction": try await apple.sign(shared)])
            #expect(answer["reason"] as? String == "family-shared", "\(answer)")
            #expect(try await listed(http, "u-member") == [otid])
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}
