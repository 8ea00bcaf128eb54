import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import Testing

/// An upgrade within a subscription group to a product of a shorter period: Apple's new
/// transaction (same `originalTransactionId`, another product, bought later) ends before the
/// period it replaced, which Apple marks `isUpgraded`. The subscription follows the latest period
/// Apple signed, by purchase date: its product and end are the upgrade's, so a later `EXPIRED` and
/// a refund of the upgrade's period apply to it.
@Suite("An upgrade to a shorter period, over HTTP")
struct SubscriptionUpgradeTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    static let day: TimeInterval = 86_400

    /// A yearly subscription bought through order `o-<otid>` of `u-up` 60 days ago, upgraded
    /// yesterday to the monthly `pro.plus.monthly` (announced by `DID_CHANGE_RENEWAL_PREF`
    /// `UPGRADE`), and the old period re-sent by the client as Apple signs it after the upgrade:
    /// the start and the upgrade as signed.
    func upgraded(_ http: LedgerHTTP, _ otid: String, now: Date) async throws -> (start: SignedTransactionPayload, upgrade: SignedTransactionPayload) {
        try await http.send(.post, "/v1/orders", json: newOrder("o-\(otid)", user: "u-up", product: "pro.yearly"))
        let start = SubscriptionNotificationTests.period(
            otid, 0, product: "pro.yearly", purchased: now.addingTimeInterval(-60 * Self.day), expires: now.addingTimeInterval(305 * Self.day))
        let (_, bought) = try await http.send(.post, "/v1/receipts", json: [
            "userId": "u-up", "orderId": "o-\(otid)", "signedTransaction": try await apple.sign(start),
        ])
        #expect(bought["outcome"] as? String == "matched", "\(bought)")

        var upgrade = SubscriptionNotificationTests.period(
            otid, 1, product: "pro.plus.monthly", purchased: now.addingTimeInterval(-Self.day), expires: now.addingTimeInterval(29 * Self.day))
        upgrade.transactionReason = "PURCHASE"
        let answer = try await http.notifyAppleTaken(try await apple.notification(
            "DID_CHANGE_RENEWAL_PREF", subtype: "UPGRADE", transaction: upgrade,
            renewalInfo: TestApple.renewalInfo(otid, product: "pro.plus.monthly")))
        #expect(answer["streamId"] as? String == "subscription-\(otid)", "\(answer)")

        var replaced = start
        replaced.isUpgraded = true
        let (_, again) = try await http.send(.post, "/v1/receipts", json: [
            "userId": "u-up", "orderId": "o-\(otid)", "signedTransaction": try await apple.sign(replaced),
        ])
        #expect(again["orderId"] as? String == "o-\(otid)", "\(again)")
        return (start, upgrade)
    }

    func shown(_ http: LedgerHTTP, _ otid: String) async throws -> [String: Any] {
        let (status, one) = try await http.send(.get, "/v1/subscriptions/\(otid)")
        #expect(status == .ok, "\(one)")
        return one
    }

    @Test("the upgrade's product and end are the subscription's, and Apple's EXPIRED of it expires the subscription")
    func upgradeThenExpired() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7500001"
            let (_, upgrade) = try await upgraded(http, otid, now: now)
            var one = try await shown(http, otid)
            #expect(one["productId"] as? String == "pro.plus.monthly" && one["status"] as? String == "active", "\(one)")
            let held = try #require(try await SubscriptionStore(database: db.database).subscription(otid))
            #expect(held.expiresAt.map { abs($0.timeIntervalSince(now.addingTimeInterval(29 * Self.day))) < 1 } == true,
                    "the upgrade's end, not the replaced year's: \(String(describing: held.expiresAt))")
            #expect(held.periods.count == 2)

            // The monthly period lapses; Apple says so.
            var info = TestApple.renewalInfo(otid, product: "pro.plus.monthly", autoRenew: false)
            info.expirationIntent = 1
            let expired = try await http.notifyAppleTaken(try await apple.notification(
                "EXPIRED", subtype: "VOLUNTARY", transaction: upgrade, renewalInfo: info))
            #expect(expired["type"] as? String == "subscription-renewal-changed", "\(expired)")
            one = try await shown(http, otid)
            #expect(one["status"] as? String == "expired" && one["expirationIntent"] as? Int == 1, "\(one)")
            let (_, entitled) = try await http.send(.get, "/v1/users/u-up/entitlements")
            #expect((entitled["subscriptions"] as? [[String: Any]])?.isEmpty == true, "\(entitled)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a refund of the upgrade's period revokes the subscription; the replaced year's period stays unrefunded")
    func upgradeThenRefund() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7500002"
            let (_, upgrade) = try await upgraded(http, otid, now: now)
            let refunded = try await http.notifyAppleTaken(try await apple.notification(
                "REFUND", transaction: SubscriptionNotificationTests.revoked(upgrade)))
            #expect(refunded["type"] as? String == "subscription-period-refunded", "\(refunded)")
            let one = try await shown(http, otid)
            #expect(one["status"] as? String == "revoked" && one["productId"] as? String == "pro.plus.monthly", "\(one)")
            let periods = one["periods"] as? [[String: Any]] ?? []
            #expect(periods.map { $0["refundedAt"] is String } == [false, true], "\(periods)")
            let (_, order) = try await http.send(.get, "/v1/orders/o-\(otid)")
            #expect(order["state"] as? String == "verified", "the upgrade paid no order: \(order)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}
