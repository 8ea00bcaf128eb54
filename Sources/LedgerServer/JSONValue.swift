import Foundation
import LedgerJSON
import LedgerStore

/// Any JSON value, for the bodies the ledger keeps as sent (an event's `data`, its metadata) and
/// the free-form fields of answers. Numbers are `Decimal`, which reads and writes a JSON number's
/// digits exactly.
public enum JSONValue: Codable, Equatable, Sendable {
    case null
    case bool(Bool)
    case number(Decimal)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        // Strings first: most values are.
        if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Decimal.self) {
            self = .number(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// The value stored as JSON text (an event's data or metadata as the log holds it).
    init(json data: Data) {
        self = (try? EventCoding.decoder.decode(JSONValue.self, from: data)) ?? .null
    }
}
