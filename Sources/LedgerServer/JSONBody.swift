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
    private let content: Content

    /// A plain body's top-level members, or JSONSerialization's parse of any other.
    private enum Content {
        case plain([(key: String, value: StoredJSON.PlainMember)])
        case parsed([String: Any])
    }

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
            content = .plain(members)
            return
        }
        let parsed = try? JSONSerialization.jsonObject(with: text, options: [.fragmentsAllowed])
        guard let parsed else {
            throw APIError(.badRequest, code: "invalid-json", message: "the body is not valid JSON")
        }
        guard let object = parsed as? [String: Any] else {
            throw APIError(.badRequest, code: "invalid-json", message: "the body must be a JSON object")
        }
        content = .parsed(object)
    }

    /// Whether the body was read without Foundation: plain JSON with each key once.
    var isPlain: Bool {
        if case .plain = content { true } else { false }
    }

    /// The body as JSONSerialization parses it (a plain body is parsed here, on each call: for
    /// the rare paths that write a body again).
    var object: [String: Any] {
        if case .parsed(let object) = content { return object }
        return (try? JSONSerialization.jsonObject(with: text)) as? [String: Any] ?? [:]
    }

    /// `field`'s value as a plain body's member, whichever way the body was read (a parsed
    /// member is converted when asked for: only bodies that are not plain take this path).
    private func member(_ field: String) -> StoredJSON.PlainMember? {
        switch content {
        case .plain(let members): members.first { $0.key == field }?.value
        case .parsed(let object): object[field].map(Self.member)
        }
    }

    /// A value of JSONSerialization's parse as the scanner gives it.
    private static func member(_ value: Any) -> StoredJSON.PlainMember {
        switch value {
        case is NSNull: .null
        case let text as String: .string(text)
        case let number as NSNumber: isBoolean(number) ? .bool(number.boolValue) : .number(number.doubleValue)
        // An object JSONSerialization cannot write again is no object the ledger can store.
        case let object as [String: Any]: (try? JSONSerialization.data(withJSONObject: object)).map { .object($0) } ?? .array
        default: .array
        }
    }

    /// Whether the body has `field`, null included. (Not through `member`, which would write a
    /// parsed object member again only to be asked whether it is there.)
    func has(_ field: String) -> Bool {
        switch content {
        case .plain(let members): members.contains { $0.key == field }
        case .parsed(let object): object[field] != nil
        }
    }

    /// Whether the body gives `field` as null.
    func isNull(_ field: String) -> Bool {
        switch content {
        case .plain(let members): members.first { $0.key == field }?.value == .null
        case .parsed(let object): object[field] is NSNull
        }
    }

    func string(_ field: String) throws(LedgerInputError) -> String? {
        switch member(field) {
        case nil, .null?: return nil
        case .string(let text)?: return text
        default: throw LedgerInputError(field: field, problem: "must be a string")
        }
    }

    func requiredString(_ field: String) throws(LedgerInputError) -> String {
        guard let text = try string(field) else { throw LedgerInputError(field: field, problem: "is missing") }
        return text
    }

    func bool(_ field: String) throws(LedgerInputError) -> Bool? {
        switch member(field) {
        case nil, .null?: return nil
        case .bool(let value)?: return value
        default: throw LedgerInputError(field: field, problem: "must be true or false")
        }
    }

    func integer(_ field: String) throws(LedgerInputError) -> Int64? {
        switch member(field) {
        case nil, .null?: return nil
        case .number(let number)?:
            guard number == number.rounded(), let integer = Int64(exactly: number) else { break }
            return integer
        default: break
        }
        throw LedgerInputError(field: field, problem: "must be an integer")
    }

    /// A nested JSON object, as JSON text: as the body wrote it when it is plain, else written
    /// again from the parsed value.
    func objectData(_ field: String) throws(LedgerInputError) -> Data {
        switch member(field) {
        case nil, .null?: throw LedgerInputError(field: field, problem: "is missing")
        case .object(let data)?: return data
        default: throw LedgerInputError(field: field, problem: "must be a JSON object")
        }
    }

    /// JSON's true and false arrive as NSNumber too; their type name tells them apart.
    private static func isBoolean(_ number: NSNumber) -> Bool {
        String(describing: type(of: number)).contains("Boolean")
    }
}
