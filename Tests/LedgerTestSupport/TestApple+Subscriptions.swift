import AppleReceipts
import Foundation

extension TestApple {
    /// The subscription group the test subscriptions belong to.
    public static let subscriptionGroup = "20500001"

    /// A signed transaction of one billed period of auto-renewable subscription `original` (the
    /// start when `id` is `original`, a renewal otherwise), its period named `line` (default:
    /// "line-<id>").
    public static func subscriptionPeriod(
        _ id: String, of original: String, product: String = "pro.monthly", line: String? = nil, purchaseDate: Date, expires: Date,
        environment: String = "Sandbox", signedDate: Date = Date()
    ) -> SignedTransactionPayload {
        var payload = transaction(id, product: product, environment: environment, purchaseDate: purchaseDate, signedDate: signedDate)
        payload.originalTransactionId = original
        payload.type = "Auto-Renewable Subscription"
        payload.expiresDate = expires.millisecondsSince1970
        payload.webOrderLineItemId = line ?? "line-\(id)"
        payload.transactionReason = id == original ? "PURCHASE" : "RENEWAL"
        payload.subscriptionGroupIdentifier = subscriptionGroup
        return payload
    }
}
