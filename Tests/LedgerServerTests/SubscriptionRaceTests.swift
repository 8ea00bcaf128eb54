import AppleReceipts
import Foundation
import HTTPTypes
import LedgerCore
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("One subscription's purchase, renewals and notifications all at once, over HTTP")
struct SubscriptionRaceTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    static let day: TimeInterval = 86_400

    @Test("the start with its order, its renewals uploaded and notified thrice, renewal changes and a refund, at once: every answer 200, each period once")
    func oneSubscriptionAtOnce() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let otid = "7300001", now = Date()
            try await http.send(.post, "/v1/orders", json: newOrder("o-race", product: "pro.monthly"))
            let start = SubscriptionNotificationTests.period(
                otid, 0, purchased: now.addingTimeInterval(-700 * Self.day), expires: now.addingTimeInterval(-670 * Self.day))
            let renewals = (1...20).map { n in
                SubscriptionNotificationTests.period(
                    otid, n, purchased: now.addingTimeInterval(Double(-700 + 30 * n) * Self.day),
                    expires: now.addingTimeInterval(Double(-670 + 30 * n) * Self.day))
            }
            var requests: [(path: String, fields: [String: String])] = []
            let signedStart = try await apple.sign(start)
            for _ in 0..<3 { requests.append(("/v1/receipts", ["orderId": "o-race", "signedTransaction": signedStart])) }
            let subscribed = try await apple.notification("SUBSCRIBED", subtype: "INITIAL_BUY", transaction: start, renewalInfo: TestApple.renewalInfo(otid))
            for _ in 0..<2 { requests.append(("/v1/notifications/apple", ["signedPayload": subscribed])) }
            for renewal in renewals {
                requests.append(("/v1/receipts", ["userId": "u-1", "signedTransaction": try await apple.sign(renewal)]))
                let renewed = try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid))
                for _ in 0..<3 { requests.append(("/v1/notifications/apple", ["signedPayload": renewed])) }
            }
            for _ in 0..<5 {
                let changed = try await apple.notification(
                    "DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_DISABLED", transaction: renewals[renewals.count - 1],
                    renewalInfo: TestApple.renewalInfo(otid, autoRenew: false))
                requests.append(("/v1/notifications/apple", ["signedPayload": changed]))
            }
            let refunded = try await apple.notification("REFUND", transaction: SubscriptionNotificationTests.revoked(renewals[3]))
            for _ in 0..<2 { requests.append(("/v1/notifications/apple", ["signedPayload": refunded])) }
            let started = ContinuousClock.now
            let answers = try await withThrowingTaskGroup(of: (String, HTTPResponse.Status, String).self) { group in
                for request in requests.shuffled() {
                    group.addTask {
                        let (status, answer) = try await http.send(.post, request.path, json: request.fields)
                        return (request.path, status, "\(answer)")
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            let took = ContinuousClock.now - started
            #expect(answers.count == requests.count)
            #expect(answers.filter { $0.1 != .ok && $0.1 != .created }.map { "\($0.0) \($0.1): \($0.2)" } == [], "took \(took)")
            let s = try #require(try await SubscriptionStore(database: db.database).subscription(otid))
            #expect(s.periods.map(\.kind) == [.start] + Array(repeating: .renewal, count: renewals.count))
            #expect(s.periods.filter { $0.refundedAt != nil }.map(\.transactionId.rawValue) == [renewals[3].transactionId])
            #expect(s.autoRenew == false)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}
