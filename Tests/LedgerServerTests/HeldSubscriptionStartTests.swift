import AppStoreStandIn
import AppleReceipts
import Foundation
import HTTPTypes
import Hummingbird
import LedgerCore
import LedgerStore
import LedgerTestSupport
import NIOCore
import Testing

/// A subscription whose start an order holds that never went through the intake as a
/// subscription's start (an imported history, a backend's own `receipt-received`): its renewals
/// start it from what the ledger holds, tied to that order.
@Suite("A subscription whose start an order already holds, over HTTP")
struct HeldSubscriptionStartTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    static let day: TimeInterval = 86_400
    let otid = "7300001"

    /// How the start reached its order.
    enum Grant: String, CaseIterable, Sendable { case imported, receiptReceived = "receipt-received" }

    /// Grants the start `otid` (bought at `purchased`) to order `h-sub` of user `u-h` as `grant` says.
    func grant(_ grant: Grant, _ http: LedgerHTTP, purchased: Date) async throws {
        let at = purchased.formatted(Date.ISO8601FormatStyle())
        switch grant {
        case .imported:
            let csv = """
                orderId,userId,productId,bundleId,createdAt,state,price,currency,transactionId,originalTransactionId,purchaseDate,environment,refundedAt
                h-sub,u-h,pro.monthly,,\(at),delivered,4.99,USD,\(otid),\(otid),\(at),Sandbox,

                """
            let headers: HTTPFields = [.contentType: "text/csv", .authorization: "Bearer \(http.key)"]
            let response = try await http.client.execute(uri: "/v1/imports?source=history.csv", method: .post, headers: headers, body: ByteBuffer(string: csv))
            let summary = json(response.body)
            #expect(response.status == .ok && summary["imported"] as? Int == 1, "\(summary)")
        case .receiptReceived:
            try await http.send(.post, "/v1/orders", json: newOrder("h-sub", user: "u-h", product: "pro.monthly"))
            let received: [String: Any] = [
                "transactionId": otid, "originalTransactionId": otid, "productId": "pro.monthly", "purchaseDate": at, "receiptSha256": sha,
                "format": "jws", "matchedBy": "applicationUsername", "environment": "Sandbox",
            ]
            for (type, data) in [("receipt-received", received), ("verified", ["transactionId": otid] as [String: Any])] {
                let (status, answer) = try await http.send(.post, "/v1/orders/h-sub/events", json: ["type": type, "data": data])
                #expect(status == .created || status == .ok, "\(type): \(answer)")
            }
        }
        #expect(try await http.send(.get, "/v1/subscriptions/\(otid)").0 == .notFound, "the grant alone starts no subscription")
    }

    /// The start granted a month ago as `grant` says, then its renewal's `DID_RENEW`, which
    /// starts the subscription: the notification's answer.
    @discardableResult
    func grantedThenRenewed(_ grant: Grant, _ http: LedgerHTTP, now: Date) async throws -> [String: Any] {
        try await self.grant(grant, http, purchased: now.addingTimeInterval(-31 * Self.day))
        let renewal = SubscriptionNotificationTests.period(otid, 1, purchased: now.addingTimeInterval(-Self.day), expires: now.addingTimeInterval(29 * Self.day))
        return try await http.notifyAppleTaken(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid)))
    }

    @Test("DID_RENEW after the start was granted otherwise starts the subscription, tied to the start's order", arguments: Grant.allCases)
    func renewalStartsHeldSubscription(_ grant: Grant) async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            let answer = try await grantedThenRenewed(grant, http, now: now)
            #expect(answer["streamId"] as? String == "subscription-\(otid)" && answer["type"] as? String == "subscription-renewal-changed", "\(answer)")

            let (status, one) = try await http.send(.get, "/v1/subscriptions/\(otid)")
            #expect(status == .ok, "\(one)")
            #expect(one["orderId"] as? String == "h-sub" && one["userId"] as? String == "u-h" && one["status"] as? String == "active", "\(one)")
            let periods = one["periods"] as? [[String: Any]] ?? []
            #expect(periods.map { $0["transactionId"] as? String } == [otid, "\(otid)1"], "\(periods)")
            #expect(periods.map { $0["kind"] as? String } == ["subscription-start", "subscription-renewal"])
            let (_, mine) = try await http.send(.get, "/v1/users/u-h/subscriptions")
            let listed = Dictionary(grouping: mine["subscriptions"] as? [[String: Any]] ?? []) { $0["originalTransactionId"] as? String ?? "?" }
                .compactMapValues(\.first)
            #expect(Set(listed.keys) == [otid] && listed[otid]?["orderId"] as? String == "h-sub", "\(mine)")
            let (_, order) = try await http.send(.get, "/v1/orders/h-sub")
            #expect(order["transactionId"] as? String == otid, "the start stays its order's: \(order)")

            // Apple's signed start, uploaded later, adds no second period for it.
            let start = SubscriptionNotificationTests.period(otid, 0, purchased: now.addingTimeInterval(-31 * Self.day), expires: now.addingTimeInterval(-Self.day))
            let (_, uploaded) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-h", "signedTransaction": try await apple.sign(start)])
            #expect(uploaded["outcome"] as? String == "matched" && uploaded["orderId"] as? String == "h-sub", "\(uploaded)")
            let again = try #require(try await SubscriptionStore(database: db.database).subscription(otid))
            #expect(again.periods.map(\.transactionId.rawValue) == [otid, "\(otid)1"])
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("Apple's notifications carrying the held start (its period under another key) apply to its one period: renewal status, refund, reversal", arguments: Grant.allCases)
    func notificationsAboutHeldStart(_ grant: Grant) async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            try await grantedThenRenewed(grant, http, now: now)
            let start = SubscriptionNotificationTests.period(otid, 0, purchased: now.addingTimeInterval(-31 * Self.day), expires: now.addingTimeInterval(-Self.day))

            let status = try await http.notifyAppleTaken(try await apple.notification(
                "DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_DISABLED", transaction: start,
                renewalInfo: TestApple.renewalInfo(otid, product: "pro.monthly", autoRenew: false)))
            #expect(status["type"] as? String == "subscription-renewal-changed", "\(status)")
            let refunded = try await http.notifyAppleTaken(try await apple.notification("REFUND", transaction: SubscriptionNotificationTests.revoked(start)))
            #expect(refunded["streamId"] as? String == "order-h-sub" && refunded["type"] as? String == "refunded", "\(refunded)")
            var s = try #require(try await SubscriptionStore(database: db.database).subscription(otid))
            #expect(s.periods.map(\.transactionId.rawValue) == [otid, "\(otid)1"], "one period a transaction")
            #expect(s.periods.map { $0.refundedAt != nil } == [true, false] && s.status(at: now) == .active, "\(s)")
            let (_, order) = try await http.send(.get, "/v1/orders/h-sub")
            #expect(order["state"] as? String == "refunded")

            let reversed = try await http.notifyAppleTaken(try await apple.notification("REFUND_REVERSED", transaction: start))
            #expect(reversed["type"] as? String == "refund-reversed", "\(reversed)")
            s = try #require(try await SubscriptionStore(database: db.database).subscription(otid))
            #expect(s.periods.allSatisfy { $0.refundedAt == nil })
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a renewal of a start its backend claimed, unverified, waits: Apple's start then starts the subscription with it, or, another user's, none", arguments: [false, true])
    func unverifiedClaimStartsNone(_ anotherUsers: Bool) async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            if anotherUsers {
                let (_, linked) = try await http.send(.post, "/v1/users/u-other/app-transaction", json: [
                    "signedAppTransaction": try await apple.sign(TestApple.appTransaction("app-tx-\(otid)"))])
                #expect(linked["outcome"] as? String == "linked", "\(linked)")
            }
            try await http.send(.post, "/v1/orders", json: newOrder("h-sub", user: "u-h", product: "pro.monthly"))
            let purchased = now.addingTimeInterval(-31 * Self.day)
            let received: [String: Any] = [
                "transactionId": otid, "originalTransactionId": otid, "productId": "pro.monthly", "purchaseDate": purchased.formatted(Date.ISO8601FormatStyle()),
                "receiptSha256": sha, "format": "jws", "matchedBy": "applicationUsername", "environment": "Sandbox",
            ]
            let (claimed, claim) = try await http.send(.post, "/v1/orders/h-sub/events", json: ["type": "receipt-received", "data": received])
            #expect(claimed == .created, "\(claim)")
            let renewal = SubscriptionNotificationTests.period(otid, 1, purchased: now.addingTimeInterval(-Self.day), expires: now.addingTimeInterval(29 * Self.day))
            let waited = try await http.notifyAppleTaken(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid)))
            #expect(waited["streamId"] as? String == "transaction-\(otid)1", "an unverified claim starts nothing: \(waited)")
            #expect(try await http.send(.get, "/v1/subscriptions/\(otid)").0 == .notFound)

            let start = SubscriptionNotificationTests.period(otid, 0, purchased: purchased, expires: now.addingTimeInterval(-Self.day))
            let (_, proof) = try await http.send(.post, "/v1/receipts", json: ["orderId": "h-sub", "signedTransaction": try await apple.sign(start)])
            let (_, mine) = try await http.send(.get, "/v1/users/u-h/subscriptions")
            let listed = (mine["subscriptions"] as? [[String: Any]] ?? []).compactMap { $0["originalTransactionId"] as? String }
            if anotherUsers {
                #expect(proof["reason"] as? String == "account-conflict", "\(proof)")
                #expect(listed.isEmpty, "the claimant holds no subscription: \(mine)")
                #expect(try await http.send(.get, "/v1/subscriptions/\(otid)").0 == .notFound)
            } else {
                #expect(proof["outcome"] as? String == "matched" && proof["state"] as? String == "verified", "\(proof)")
                #expect(listed == [otid], "\(mine)")
                let s = try #require(try await SubscriptionStore(database: db.database).subscription(otid))
                #expect(s.periods.map(\.transactionId.rawValue) == [otid, "\(otid)1"] && s.userId?.rawValue == "u-h" && s.status(at: now) == .active)
            }
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a renewal that waited before the start was imported is tied when the next renewal starts the subscription")
    func waitingRenewalIsTied() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            let first = SubscriptionNotificationTests.period(otid, 1, purchased: now.addingTimeInterval(-31 * Self.day), expires: now.addingTimeInterval(-Self.day))
            let waited = try await http.notifyAppleTaken(try await apple.notification("DID_RENEW", transaction: first, renewalInfo: TestApple.renewalInfo(otid)))
            #expect(waited["streamId"] as? String == "transaction-\(otid)1", "no start known yet: \(waited)")
            try await grant(.imported, http, purchased: now.addingTimeInterval(-61 * Self.day))
            let second = SubscriptionNotificationTests.period(otid, 2, purchased: now.addingTimeInterval(-Self.day), expires: now.addingTimeInterval(29 * Self.day))
            let answer = try await http.notifyAppleTaken(try await apple.notification("DID_RENEW", transaction: second, renewalInfo: TestApple.renewalInfo(otid)))
            #expect(answer["streamId"] as? String == "subscription-\(otid)", "\(answer)")
            let s = try #require(try await SubscriptionStore(database: db.database).subscription(otid))
            #expect(s.periods.map(\.transactionId.rawValue) == [otid, "\(otid)1", "\(otid)2"] && s.userId?.rawValue == "u-h")
            #expect(s.status(at: now) == .active)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("refresh=true starts a subscription whose start an order holds, from Apple's signed start, with the renewal that waited and the one it reads")
    func catchUpStartsHeldSubscription() async throws {
        let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
        try await withAppleAPIApplication(apple, standIn, configure: olderPurchases) { http, db, _ in
            let now = Date()
            let p = SubscriptionNotificationTests.period
            let start = p(otid, 0, "pro.monthly", now.addingTimeInterval(-61 * Self.day), now.addingTimeInterval(-31 * Self.day), "PURCHASED")
            let first = p(otid, 1, "pro.monthly", now.addingTimeInterval(-31 * Self.day), now.addingTimeInterval(-Self.day), "PURCHASED")
            let second = p(otid, 2, "pro.monthly", now.addingTimeInterval(-Self.day), now.addingTimeInterval(29 * Self.day), "PURCHASED")
            _ = try await http.notifyAppleTaken(try await apple.notification("DID_RENEW", transaction: first, renewalInfo: TestApple.renewalInfo(otid)))
            try await grant(.imported, http, purchased: now.addingTimeInterval(-61 * Self.day))
            await standIn.setHistory(otid, [
                .init(revision: "r1", hasMore: false, signedTransactions: [try await apple.sign(start), try await apple.sign(first), try await apple.sign(second)]),
            ])
            await standIn.setSubscriptionStatuses(for: [otid], [.init(subscriptionGroupIdentifier: "g-pro", lastTransactions: [
                .init(status: 1, originalTransactionId: otid, signedTransactionInfo: try await apple.sign(second),
                      signedRenewalInfo: try await apple.sign(TestApple.renewalInfo(otid))),
            ])])
            let (status, one) = try await http.send(.get, "/v1/subscriptions/\(otid)?refresh=true")
            #expect(status == .ok, "\(one)")
            #expect(one["orderId"] as? String == "h-sub" && one["userId"] as? String == "u-h" && one["status"] as? String == "active", "\(one)")
            let periods = one["periods"] as? [[String: Any]] ?? []
            #expect(periods.map { $0["transactionId"] as? String } == [otid, "\(otid)1", "\(otid)2"], "\(periods)")
            #expect(periods.first?["periodKey"] as? String == "\(otid)-w0", "Apple's signed start, with its billing period")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])

            // Apple's status answer with a part that does not verify: refused, a bad gateway named by its code, no 500.
            await standIn.setSubscriptionStatuses(for: [otid], [.init(subscriptionGroupIdentifier: "g-pro", lastTransactions: [
                .init(status: 1, originalTransactionId: otid, signedTransactionInfo: "a.b.c", signedRenewalInfo: try await apple.sign(TestApple.renewalInfo(otid))),
            ])])
            let (refused, refusal) = try await http.send(.get, "/v1/subscriptions/\(otid)?refresh=true")
            #expect(refused == .badGateway && (errorOf(refusal)["message"] as? String ?? "").hasPrefix("Apple's answer did not verify"), "\(refusal)")
        }
    }
}
