/// The name of one event stream, such as `order-42` or `transaction-2000000123`.
public struct StreamID: ValidatedIdentifier {
    public static let field = "streamId"
    /// Streams are named after ids of up to 128 characters plus a prefix.
    public static let maximumLength = 256

    public let rawValue: String

    /// A stream id built from already validated parts.
    public init(unchecked rawValue: String) {
        self.rawValue = rawValue
    }
}

extension StreamID {
    /// An order's stream (`order-<orderId>`).
    public var isOrder: Bool { rawValue.hasPrefix("order-") }
    /// An Apple transaction's stream (`transaction-<transactionId>`).
    public var isTransaction: Bool { rawValue.hasPrefix("transaction-") }
    /// An auto-renewable subscription's stream (`subscription-<originalTransactionId>`).
    public var isSubscription: Bool { rawValue.hasPrefix("subscription-") }
    /// The subscription (its `originalTransactionId`) whose stream this is.
    public var subscriptionID: String? { isSubscription ? String(rawValue.dropFirst("subscription-".count)) : nil }
    /// The stream of the subscription whose `originalTransactionId` is `id`.
    public static func subscription(_ id: String) -> StreamID { StreamID(unchecked: "subscription-" + id) }
    /// The order whose stream this is.
    public var orderID: OrderID? { isOrder ? OrderID(unchecked: String(rawValue.dropFirst("order-".count))) : nil }
    /// The transaction whose stream this is.
    public var transactionID: TransactionID? { isTransaction ? TransactionID(unchecked: String(rawValue.dropFirst("transaction-".count))) : nil }
}
