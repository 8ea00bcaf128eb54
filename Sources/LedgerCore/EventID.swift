import Foundation

/// The idempotency key of one event: a UUID chosen by the writer (or generated for it).
public struct EventID: Hashable, Sendable, Codable, CustomStringConvertible {
    public let uuid: UUID

    public init(_ uuid: UUID = UUID()) {
        self.uuid = uuid
    }

    /// Parses the canonical text form of a UUID.
    public init(_ text: String) throws(LedgerInputError) {
        guard let uuid = UUID(uuidString: text) else {
            throw LedgerInputError(field: "eventId", problem: "is not a UUID")
        }
        self.uuid = uuid
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        try self.init(container.decode(String.self))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }

    /// Lower-case, as PostgreSQL prints UUIDs.
    public var description: String { uuid.uuidString.lowercased() }
}
