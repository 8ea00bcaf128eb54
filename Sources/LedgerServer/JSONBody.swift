import Foundation
import Hummingbird
import LedgerCore

/// A request's JSON object, read with a size limit, with typed accessors that name the field
/// that is missing or wrong. A plain body (`StoredJSON.plainMembers`, as most are) is read by
/// the ledger's scanner alone; any other by `JSONSerialization`. The accessors answer the same
/// either way.
struct JSONBody {
    /// The largest body the API reads.
    static let maximumBytes = 256 * 1024

    /// The body as it came.
    let text: Data
    /// The top-level members of a plain body; nil when `parsed` holds the body.
    private let members: [(key: String, value: StoredJSON.PlainMember)]?
    private let parsed: [String: Any]?

    static func read(_ request: Request, context: LedgerRequestContext) async throws -> JSONBody {
        let buffer: ByteBuffer
        do {
            buffer = try await request.body.collect(upTo: maximumBytes)
        } catch {
            throw APIError(.contentTooLarge, code: "body-too-large", message: "the body is larger than \(maximumBytes / 1024) KiB")
        }
        guard buffer.readableBytes > 0 else {
            throw APIError(.badRequest, code: "invalid-json", message: "the body is empty; send a JSON object")
        }
        return try JSONBody(text: Data(buffer: buffer))
    }

    /// `scanner` false: through JSONSerialization even when plain (the tests compare the two).
    init(text: Data, scanner: Bool = true) throws {
        self.text = text
        if scanner, let members = StoredJSON.plainMembers(of: text) {
            self.members = members
            parsed = nil
            return
        }
        let parsed = try? JSONSerialization.jsonObject(with: text, options: [.fragmentsAllowed])
        guard let parsed else {
            throw APIError(.badRequest, code: "invalid-json", message: "the body is not valid JSON")
        }
        guard let object = parsed as? [String: Any] else {
            throw APIError(.badRequest, code: "invalid-json", message: "the body must be a JSON object")
        }
        members = nil
        self.parsed = object
    }

    /// Whether the body was read without Foundation: plain JSON with each key once.
    var isPlain: Bool { members != nil }

    /// The body as JSONSerialization parses it (a plain body is parsed here, on each call: for
    /// the rare paths that write a body again).
    var object: [String: Any] {
        parsed ?? (try? JSONSerialization.jsonObject(with: text)) as? [String: Any] ?? [:]
    }

    /// Whether the body has `field`, null included.
    func has(_ field: String) -> Bool {
        if let members { return members.contains { $0.key == field } }
        return parsed?[field] != nil
    }

    /// Whether the body gives `field` as null.
    func isNull(_ field: String) -> Bool {
        if let members { return members.first { $0.key == field }?.value == .null }
        return parsed?[field] is NSNull
    }

    func string(_ field: String) throws(LedgerInputError) -> String? {
        if let members {
            switch members.first(where: { $0.key == field })?.value {
            case nil, .null?: return nil
            case .string(let text)?: return text
            default: throw LedgerInputError(field: field, problem: "must be a string")
            }
        }
        guard let value = parsed?[field], !(value is NSNull) else { return nil }
        guard let text = value as? String else { throw LedgerInputError(field: field, problem: "must be a string") }
        return text
    }

    func requiredString(_ field: String) throws(LedgerInputError) -> String {
        guard let text = try string(field) else { throw LedgerInputError(field: field, problem: "is missing") }
        return text
    }

    func bool(_ field: String) throws(LedgerInputError) -> Bool? {
        if let members {
            switch members.first(where: { $0.key == field })?.value {
            case nil, .null?: return nil
            case .bool(let value)?: return value
            default: throw LedgerInputError(field: field, problem: "must be true or false")
            }
        }
        guard let value = parsed?[field], !(value is NSNull) else { return nil }
        guard let value = value as? NSNumber, Self.isBoolean(value) else {
            throw LedgerInputError(field: field, problem: "must be true or false")
        }
        return value.boolValue
    }

    func integer(_ field: String) throws(LedgerInputError) -> Int64? {
        let number: Double
        if let members {
            switch members.first(where: { $0.key == field })?.value {
            case nil, .null?: return nil
            case .number(let value)?: number = value
            default: throw LedgerInputError(field: field, problem: "must be an integer")
            }
        } else {
            guard let value = parsed?[field], !(value is NSNull) else { return nil }
            guard let value = value as? NSNumber, !Self.isBoolean(value) else {
                throw LedgerInputError(field: field, problem: "must be an integer")
            }
            number = value.doubleValue
        }
        guard number == number.rounded(), let integer = Int64(exactly: number) else {
            throw LedgerInputError(field: field, problem: "must be an integer")
        }
        return integer
    }

    /// A nested JSON object, as JSON text: as the body wrote it when it is plain, else written
    /// again from the parsed value.
    func objectData(_ field: String) throws(LedgerInputError) -> Data {
        if let members {
            switch members.first(where: { $0.key == field })?.value {
            case nil, .null?: throw LedgerInputError(field: field, problem: "is missing")
            case .object(let data)?: return data
            default: throw LedgerInputError(field: field, problem: "must be a JSON object")
            }
        }
        guard let value = parsed?[field], !(value is NSNull) else { throw LedgerInputError(field: field, problem: "is missing") }
        guard value is [String: Any], let data = try? JSONSerialization.data(withJSONObject: value) else {
            throw LedgerInputError(field: field, problem: "must be a JSON object")
        }
        return data
    }

    /// JSON's true and false arrive as NSNumber too; their type name tells them apart.
    static func isBoolean(_ number: NSNumber) -> Bool {
        String(describing: type(of: number)).contains("Boolean")
    }
}
