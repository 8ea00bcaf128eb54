import AppleReceipts
import Foundation
import LedgerCore
import LedgerJSON

/// The demo's subscriber (issue 40): a monthly auto-renewable subscription bought 70 days ago
/// through an order of the team's history (created then by its earlier backend), renewing twice through Apple's notifications, the second time after a failed renewal
/// that recovers within its grace period; one period refunded; and an order of the same product
/// the subscriber abandoned at payment, which no renewal may pay.
extension DemoStory {
    static let subscriber = "demo-subscriber"
    static let subscriptionProduct = "pro.monthly"
    static let month: TimeInterval = 30 * 86_400

    /// What Apple signs as a subscription's renewal info (`JWSRenewalInfoDecodedPayload`): the
    /// fields the ledger reads.
    struct RenewalInfoPayload: Encodable {
        var originalTransactionId: String
        var productId: String
        var autoRenewProductId: String
        var autoRenewStatus: Int
        var isInBillingRetryPeriod: Bool?
        var gracePeriodExpiresDate: Int64?
        var renewalDate: Int64?
        var environment = "Production"
        var signedDate = Date().millisecondsSince1970
    }

    mutating func playSubscription() async throws {
        app = Demo.bundleId
        let user = Self.subscriber
        let product = Self.subscriptionProduct
        _ = try await request("PUT", "/v1/products/\(product)", body: #"{"price":"9.99","currency":"USD","bundleId":"\#(Demo.bundleId)"}"#)
        _ = try await logIn(user, account: "demo-account-subscriber")
        let original = String(700_000_000 + Int(random.seed % 1000) * 100)
        // Bought 70 days ago; each period a month.
        let started = Date().addingTimeInterval(-70 * 86_400)
        func period(_ index: Int, at purchased: Date) -> SignedTransactionPayload {
            var payload = SignedTransactionPayload(
                transactionId: index == 0 ? original : "\(original)\(index)", originalTransactionId: original, bundleId: Demo.bundleId,
                productId: product, purchaseDate: purchased.millisecondsSince1970, signedDate: Date().millisecondsSince1970,
                environment: "Production", appTransactionId: "demo-account-subscriber", price: 9_990, currency: "USD")
            payload.type = "Auto-Renewable Subscription"
            payload.expiresDate = purchased.addingTimeInterval(Self.month).millisecondsSince1970
            payload.webOrderLineItemId = "\(original)-\(index)"
            payload.transactionReason = index == 0 ? "PURCHASE" : "RENEWAL"
            payload.subscriptionGroupIdentifier = "demo-pro"
            return payload
        }
        // Its order is history: the team's earlier backend created it then, a minute before the
        // purchase (a purchase never pays an order created after it).
        let orderId = "\(user)-pro-1"
        let created = try await history(OrderID(unchecked: orderId), OrderCreated(
            userId: UserID(unchecked: user), productId: ProductID(unchecked: product), price: "9.99", currency: "USD",
            bundleId: BundleID(unchecked: Demo.bundleId), createdAt: started.addingTimeInterval(-60)))
        count("orders from the team's history")
        var start = period(0, at: started)
        start.appAccountToken = created.appAccountToken.uuidString.lowercased()
        let startJWS = try chain.sign(start)
        let bought = try await upload(Pending(transactionId: original, orderId: orderId, user: user, jws: startJWS, lost: false, payload: start))
        count("subscription bought: \(bought["outcome"] as? String ?? "?") \(bought["state"] as? String ?? "?")")
        _ = try await deliverIfMatched(bought)
        // The subscriber opens the store again and abandons a purchase of the same product.
        let abandoned = "\(user)-pro-2"
        _ = try await request("POST", "/v1/orders", body: orderBody(abandoned, user, product, "9.99"))
        _ = try await request("POST", "/v1/orders/\(abandoned)/events", body: #"{"type":"payment-added","data":{"queuedAt":"\#(EventCoding.formatDate(Date()))"}}"#)
        count("orders created")

        // A month on, Apple renews it.
        let first = period(1, at: started.addingTimeInterval(Self.month))
        let firstJWS = try chain.sign(first)
        try await notify("DID_RENEW", nil, firstJWS, renewal: RenewalInfoPayload(
            originalTransactionId: original, productId: product, autoRenewProductId: product, autoRenewStatus: 1))
        // The next month the charge fails: 16 days of grace, billing retried.
        let due = started.addingTimeInterval(2 * Self.month)
        try await notify("DID_FAIL_TO_RENEW", "GRACE_PERIOD", firstJWS, renewal: RenewalInfoPayload(
            originalTransactionId: original, productId: product, autoRenewProductId: product, autoRenewStatus: 1,
            isInBillingRetryPeriod: true, gracePeriodExpiresDate: due.addingTimeInterval(16 * 86_400).millisecondsSince1970))
        // Two days later the charge goes through, within the grace period.
        let second = period(2, at: due.addingTimeInterval(2 * 86_400))
        try await notify("DID_RENEW", "BILLING_RECOVERY", try chain.sign(second), renewal: RenewalInfoPayload(
            originalTransactionId: original, productId: product, autoRenewProductId: product, autoRenewStatus: 1, isInBillingRetryPeriod: false))
        // The customer gets the first renewal's month refunded: that period alone.
        var refunded = first
        refunded.revocationDate = Date().millisecondsSince1970
        refunded.revocationReason = 0
        refunded.revocationType = "REFUND_FULL"
        try await notify("REFUND", nil, try chain.sign(refunded), renewal: nil)

        // The reconciler runs: the renewals are the subscription's, never the abandoned order's.
        _ = try await requestJSON("POST", "/v1/reconcile", body: "{}")
        let open = try await requestJSON("GET", "/v1/orders/\(abandoned)")
        count("subscription's abandoned order of the same product, after the renewals and a reconciler pass: \(open["state"] as? String ?? "?")")
        // User ids are per app: the ledger holds two, so the app is named.
        let listed = try await requestJSON("GET", "/v1/users/\(user)/subscriptions?bundleId=\(Demo.bundleId)")
        let subscription = (listed["subscriptions"] as? [[String: Any]])?.first { $0["originalTransactionId"] as? String == original }
        subscriptionSummary = [
            "Subscription \(original) (\(user), \(product), order \(orderId)): bought, renewed twice (the second a billing recovery within its grace period), the first renewal refunded",
            subscription.map { "  status \($0["status"] as? String ?? "?"), expires \($0["expiresDate"] as? String ?? "?"), autoRenew \($0["autoRenew"] as? Bool ?? false)" }
                ?? "  GET /v1/users/\(user)/subscriptions: not available",
            "  abandoned order \(abandoned) of the same product: \(open["state"] as? String ?? "?")",
        ]
    }

    /// Posts a notification as Apple signs it: `transaction` (signed) and renewal info signed too.
    mutating func notify(_ type: String, _ subtype: String?, _ transaction: String, renewal: RenewalInfoPayload?) async throws {
        let uuid = EventID.named("demo-notification", type, subtype ?? "", transaction).uuid.uuidString.lowercased()
        let signed = try chain.sign(SignedNotificationPayload(
            notificationType: type, subtype: subtype, notificationUUID: uuid, signedDate: Date().millisecondsSince1970,
            data: .init(
                bundleId: Demo.bundleId, appAppleId: Demo.appAppleId, environment: "Production", signedTransactionInfo: transaction,
                signedRenewalInfo: try renewal.map { try chain.sign($0) })))
        let answer = try await requestJSON("POST", "/v1/notifications/apple", body: #"{"signedPayload":"\#(signed)"}"#)
        let outcome = answer["applied"] as? Bool == true ? "applied" : (answer["error"] as? [String: Any])?["code"] as? String ?? "not applied"
        count("subscription notifications: \(type)\(subtype.map { " \($0)" } ?? ""): \(outcome)")
    }
}
