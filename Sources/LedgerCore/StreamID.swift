/// The name of one event stream, such as `order-42` or `transaction-2000000123`.
public struct StreamID: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The longest stream id the log accepts.
    public static let maximumLength = 256

    public let rawValue: String

    /// Validates a stream id: 1 to 256 characters, no control characters.
    public init(_ rawValue: String) throws(LedgerInputError) {
        guard !rawValue.isEmpty else {
            throw LedgerInputError(field: "streamId", problem: "is empty")
        }
        guard rawValue.count <= Self.maximumLength else {
            throw LedgerInputError(field: "streamId", problem: "is longer than \(Self.maximumLength) characters")
        }
        guard !rawValue.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
            throw LedgerInputError(field: "streamId", problem: "contains a control character")
        }
        self.rawValue = rawValue
    }

    /// A stream id built from already validated parts.
    init(unchecked rawValue: String) {
        self.rawValue = rawValue
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        try self.init(container.decode(String.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }

    public var description: String { rawValue }
}
