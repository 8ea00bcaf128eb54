import AppStoreStandIn
import AppleReceipts
import Foundation
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("Consumption answers about an auto-renewable subscription's transactions")
struct SubscriptionConsumptionTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    @Test("no consumptionPercentage for a subscription's start or renewal (Apple refuses it), GRANT_PRORATED as the catalog says, a renewal delivered as its subscription's order")
    func noPercentageForSubscriptions() async throws {
        try await withAppleAPIApplication(apple, standIn, configure: { olderPurchases(&$0); $0.appleCallsInterval = 0 }) { http, db, base in
            try await http.send(.put, "/v1/products/pro.monthly", json: ["sampleContentProvided": true, "refundPreference": "GRANT_PRORATED"])
            let periods = (0..<2).map { SubscriptionFixture.signed("9400001", period: $0, environment: "Sandbox") }
            await standIn.setAutoRenewable(periods.map(\.transactionId))
            try await http.send(.post, "/v1/orders", json: newOrder("c-sub", product: "pro.monthly"))
            try await http.send(.post, "/v1/receipts", json: ["orderId": "c-sub", "signedTransaction": try await apple.sign(periods[0])])
            try await SubscriptionFixture.record(secondServer(db), periods, user: "u-1")
            // The backend says how much was used, as it may for a consumable.
            try await http.send(.post, "/v1/orders/c-sub/events", json: ["type": "delivered", "data": ["consumptionPercentage": 40_000]])
            for payload in periods {
                let (status, _) = try await http.send(
                    .post, "/v1/notifications/apple",
                    json: ["signedPayload": try await apple.notification("CONSUMPTION_REQUEST", transaction: payload, consumptionRequestReason: "UNINTENDED_PURCHASE")],
                    key: .some(nil))
                #expect(status == .ok)
            }

            let summary = try await drain(appleCalls(standIn, base, db, switches: .init(consumption: true)), db)
            #expect(summary.calls == ["consumption sent": 2], "\(summary)")
            for write in await standIn.writes {
                let body = (try? JSONSerialization.jsonObject(with: Data(write.body.utf8))) as? [String: Any] ?? [:]
                #expect(body["consumptionPercentage"] == nil, "\(write.path): \(body)")
                #expect(body["deliveryStatus"] as? String == "DELIVERED" && body["refundPreference"] as? String == "GRANT_PRORATED", "\(write.path): \(body)")
            }
            #expect(await standIn.writes.count == 2)
        }
    }
}
