import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import Testing

/// A renewal Apple refunded while it waited for its subscription's start: the refund is on the
/// renewal's own stream until the start ties the renewal as a period, which is then refunded too,
/// once, with what Apple signed of the refund.
@Suite("A waiting renewal's refund, carried to its period when the start arrives, over HTTP")
struct WaitingRenewalRefundTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    static let day: TimeInterval = 86_400

    /// Renewal 1 of `otid`, bought yesterday, sent by `DID_RENEW` before the ledger knows the start.
    func waitingRenewal(_ http: LedgerHTTP, _ otid: String, now: Date) async throws -> SignedTransactionPayload {
        let renewal = SubscriptionNotificationTests.period(otid, 1, purchased: now.addingTimeInterval(-Self.day), expires: now.addingTimeInterval(29 * Self.day))
        let waited = try await http.notifyAppleTaken(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid)))
        #expect(waited["streamId"] as? String == "transaction-\(otid)1", "no start known yet: \(waited)")
        return renewal
    }

    /// The start of `otid`, bought 31 days ago, uploaded for order `o-<otid>` of `u-w`.
    func uploadStart(_ http: LedgerHTTP, _ otid: String, now: Date) async throws {
        let start = SubscriptionNotificationTests.period(otid, 0, purchased: now.addingTimeInterval(-31 * Self.day), expires: now.addingTimeInterval(-Self.day))
        let (_, answer) = try await http.send(.post, "/v1/receipts", json: [
            "userId": "u-w", "orderId": "o-\(otid)", "signedTransaction": try await apple.sign(start),
        ])
        #expect(answer["orderId"] as? String == "o-\(otid)", "\(answer)")
    }

    /// The start of `otid` uploaded for its order: both periods unrefunded, the subscription
    /// active, no refund recorded on it, and the rebuild agrees.
    func startLeavesPeriodsUnrefunded(_ http: LedgerHTTP, _ db: TestDatabase, _ otid: String, now: Date) async throws {
        try await http.send(.post, "/v1/orders", json: newOrder("o-\(otid)", user: "u-w", product: "pro.monthly"))
        try await uploadStart(http, otid, now: now)
        let (_, one) = try await http.send(.get, "/v1/subscriptions/\(otid)")
        let periods = one["periods"] as? [[String: Any]] ?? []
        #expect(periods.count == 2 && periods.allSatisfy { !($0["refundedAt"] is String) }, "\(periods)")
        #expect(one["status"] as? String == "active", "\(one)")
        #expect(try await refundEvents(db, otid) == 0)
        #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
    }

    func refundEvents(_ db: TestDatabase, _ otid: String) async throws -> Int? {
        try await scalar(db, """
            SELECT count(*)::int FROM events WHERE stream_id = \("subscription-\(otid)") AND type = 'subscription-period-refunded'
            """, as: Int.self)
    }

    @Test("a REFUND of a renewal before its start is known refunds the renewal's period when the start ties it, once, as Apple signed it")
    func refundedWhileWaiting() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7600001"
            let renewal = try await waitingRenewal(http, otid, now: now)
            var revoked = SubscriptionNotificationTests.revoked(renewal, type: "REFUND_PRORATED")
            revoked.revocationPercentage = 50_000
            let refund = try await apple.notification("REFUND", transaction: revoked)
            let told = try await http.notifyAppleTaken(refund)
            #expect(told["streamId"] as? String == "transaction-\(otid)1", "still no start: \(told)")

            try await http.send(.post, "/v1/orders", json: newOrder("o-\(otid)", user: "u-w", product: "pro.monthly"))
            try await uploadStart(http, otid, now: now)

            let (status, one) = try await http.send(.get, "/v1/subscriptions/\(otid)")
            #expect(status == .ok, "\(one)")
            let periods = one["periods"] as? [[String: Any]] ?? []
            #expect(periods.map { $0["transactionId"] as? String } == [otid, "\(otid)1"], "\(periods)")
            #expect(periods.map { $0["refundedAt"] is String } == [false, true], "the renewal's period alone: \(periods)")
            #expect(periods.last?["refundPercentage"] as? Int == 50_000, "as Apple signed it: \(periods)")
            #expect(one["status"] as? String == "revoked", "the refunded renewal paid for now: \(one)")
            #expect(try await refundEvents(db, otid) == 1)

            // Finance takes the period's money back: half of 4.99.
            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let renewals = (report["rows"] as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "subscription-renewal" }
            #expect(renewals.reduce(0) { $0 + ($1["refunded"] as? Int ?? 0) } == 1, "\(renewals)")
            #expect(renewals.compactMap { Decimal(string: $0["refundedAmount"] as? String ?? "") }.reduce(0, +) == Decimal(string: "2.495"), "\(renewals)")

            // The start again, and Apple's retry of the refund: nothing recorded twice.
            try await uploadStart(http, otid, now: now)
            #expect(try await http.notifyApple(refund).1["applied"] as? Bool == false)
            #expect(try await refundEvents(db, otid) == 1)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a refund reversed while the renewal waited leaves its period unrefunded when the start ties it")
    func reversedWhileWaiting() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7600002"
            let renewal = try await waitingRenewal(http, otid, now: now)
            try await http.notifyAppleTaken(try await apple.notification("REVOKE", transaction: SubscriptionNotificationTests.revoked(renewal)))
            try await http.notifyAppleTaken(try await apple.notification("REFUND_REVERSED", transaction: renewal))
            try await startLeavesPeriodsUnrefunded(http, db, otid, now: now)
        }
    }

    @Test("a REFUND that arrives after the REFUND_REVERSED Apple signed later, while the renewal waited, leaves its period unrefunded when the start ties it")
    func reversalBeforeItsRefund() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7600003"
            let renewal = try await waitingRenewal(http, otid, now: now)
            var revoked = SubscriptionNotificationTests.revoked(renewal)
            revoked.revocationDate = now.addingTimeInterval(-7200).millisecondsSince1970
            try await http.notifyAppleTaken(
                try await apple.notification("REFUND_REVERSED", transaction: renewal, signedDate: now.addingTimeInterval(-3600)))
            let late = try await http.notifyAppleTaken(
                try await apple.notification("REFUND", transaction: revoked, signedDate: now.addingTimeInterval(-7190)))
            #expect(late["streamId"] as? String == "transaction-\(otid)1", "\(late)")
            try await startLeavesPeriodsUnrefunded(http, db, otid, now: now)
        }
    }

    @Test("what Apple said of renewal while a renewal waited for its start (a failed renewal in its grace period, auto-renew) is the subscription's once the start ties it, as if the start had come first")
    func renewalNewsWhileWaiting() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7600031"
            // The renewal's period ended an hour ago; Apple could not bill the next and grants a grace period.
            let renewal = SubscriptionNotificationTests.period(otid, 1, purchased: now.addingTimeInterval(-Self.day), expires: now.addingTimeInterval(-3600))
            let renewed = try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid, signedDate: now.addingTimeInterval(-Self.day)))
            #expect(try await http.notifyAppleTaken(renewed)["streamId"] as? String == "transaction-\(otid)1")
            var failing = RenewalFields(expirationIntent: 2, graceDays: 2, retry: true).payload(otid, now: now)
            failing.signedDate = now.addingTimeInterval(-60).millisecondsSince1970
            let failed = try await apple.notification("DID_FAIL_TO_RENEW", subtype: "GRACE_PERIOD", transaction: renewal, renewalInfo: failing)
            #expect(try await http.notifyAppleTaken(failed)["streamId"] as? String == "transaction-\(otid)1", "no start known yet")

            try await http.send(.post, "/v1/orders", json: newOrder("o-\(otid)", user: "u-w", product: "pro.monthly"))
            try await uploadStart(http, otid, now: now)
            let (_, one) = try await http.send(.get, "/v1/subscriptions/\(otid)")
            #expect(one["status"] as? String == "grace-period" && one["gracePeriodExpiresDate"] is String, "\(one)")
            #expect(one["inBillingRetry"] as? Bool == true && one["autoRenew"] as? Bool == true && one["expirationIntent"] as? Int == 2, "\(one)")
            let (_, entitled) = try await http.send(.get, "/v1/users/u-w/entitlements")
            #expect((entitled["subscriptions"] as? [[String: Any]] ?? []).map { $0["originalTransactionId"] as? String } == [otid], "\(entitled)")
            #expect(try await scalar(db, "SELECT status FROM dashboards.subscriptions WHERE original_transaction_id = \(otid)", as: String.self) == "grace-period")
            // Told again (Apple retries), nothing more is recorded.
            let events = try await eventCount(db)
            try await http.notifyAppleTaken(failed)
            #expect(try await eventCount(db) == events)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("what Apple said of renewal about a start held for support (an Apple-account conflict) is the subscription's once support pairs it")
    func heldStartsRenewalNews() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date(), otid = "7600041"
            // Alice's Apple account is known: her first purchase tied it to her.
            try await http.send(.post, "/v1/orders", json: newOrder("o-alice", user: "u-alice"))
            var first = TestApple.transaction("7600040")
            first.appTransactionId = "acct-alice"
            let (_, tied) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-alice", "signedTransaction": try await apple.sign(first)])
            #expect(tied["outcome"] as? String == "matched", "\(tied)")
            // Her subscription's start, uploaded by Bob: held for support. Its period ended an hour
            // ago; Apple could not bill the next and grants a grace period.
            var start = SubscriptionNotificationTests.period(otid, 0, purchased: now.addingTimeInterval(-31 * Self.day), expires: now.addingTimeInterval(-3600))
            start.appTransactionId = "acct-alice"
            try await http.send(.post, "/v1/orders", json: newOrder("o-bob", user: "u-bob", product: "pro.monthly"))
            let (_, held) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-bob", "signedTransaction": try await apple.sign(start)])
            #expect(held["reason"] as? String == "account-conflict", "\(held)")
            let failed = try await apple.notification(
                "DID_FAIL_TO_RENEW", subtype: "GRACE_PERIOD", transaction: start, renewalInfo: RenewalFields(graceDays: 2, retry: true).payload(otid, now: now))
            try await http.notifyAppleTaken(failed)
            let (unknown, _) = try await http.send(.get, "/v1/subscriptions/\(otid)")
            #expect(unknown == .notFound, "no subscription while its start is held")

            let (paired, order) = try await http.send(.post, "/v1/transactions/\(otid)/match", json: ["orderId": "o-bob", "reason": "Bob bought it on Alice's device"])
            #expect(paired == .ok && order["state"] as? String == "verified", "\(order)")
            let (_, one) = try await http.send(.get, "/v1/subscriptions/\(otid)")
            #expect(one["status"] as? String == "grace-period" && one["inBillingRetry"] as? Bool == true && one["autoRenew"] as? Bool == true, "\(one)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}
