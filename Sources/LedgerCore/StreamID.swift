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
    // Prefixes compare bytes, as PostgreSQL does: a Character compares whole grapheme clusters,
    // and an id that starts with a combining mark joins the prefix's `-` into one of them
    // (`order-` + U+0301 would be no order's stream).

    /// An order's stream (`order-<orderId>`).
    public var isOrder: Bool { rawValue.utf8.starts(with: "order-".utf8) }
    /// An Apple transaction's stream (`transaction-<transactionId>`).
    public var isTransaction: Bool { rawValue.utf8.starts(with: "transaction-".utf8) }
    /// An auto-renewable subscription's stream (`subscription-<originalTransactionId>`).
    public var isSubscription: Bool { rawValue.utf8.starts(with: "subscription-".utf8) }
    /// The subscription (its `originalTransactionId`) whose stream this is.
    public var subscriptionID: String? { Self.id(in: rawValue, after: "subscription-") }
    /// The stream of the subscription whose `originalTransactionId` is `id`.
    public static func subscription(_ id: String) -> StreamID { StreamID(unchecked: "subscription-" + id) }
    /// The order whose stream this is.
    public var orderID: OrderID? { Self.id(in: rawValue, after: "order-").map(OrderID.init(unchecked:)) }
    /// The transaction whose stream this is.
    public var transactionID: TransactionID? { Self.id(in: rawValue, after: "transaction-").map(TransactionID.init(unchecked:)) }

    /// What follows `prefix` in the stream id `name`, compared as bytes; nil without it.
    public static func id(in name: String, after prefix: String) -> String? {
        guard name.utf8.starts(with: prefix.utf8) else { return nil }
        return String(decoding: name.utf8.dropFirst(prefix.utf8.count), as: UTF8.self)
    }
}
