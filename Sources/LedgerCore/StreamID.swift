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
