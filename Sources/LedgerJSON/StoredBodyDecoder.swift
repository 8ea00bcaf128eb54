import Foundation

/// Reads the JSON the ledger wrote itself with `EventCoding.encoder` (the log's event bodies, an
/// event it writes read back, a pooled transaction's verification) through the types' own
/// `Decodable` conformances without Foundation's `JSONDecoder`: the rebuild decodes a body per
/// event, a million of them, and spent a third of its time there with `JSONDecoder` (the commit
/// that brought this back gives the alternating runs).
///
/// It reads plain JSON only: strings without escapes, integers, dates in the ledger's formats.
/// Whatever else it meets (an escape, invalid UTF-8, a `Data`, `Decimal` or floating-point
/// field, a missing key, a wrong type) hands the body to `EventCoding.decoder`, so every answer,
/// value or error, is the one `JSONDecoder` gives.
public enum StoredBodyDecoder {
    public static func decode<T: Decodable>(_ type: T.Type, from text: String) throws -> T {
        if let value = withoutFoundation(type, from: text) { return value }
        return try EventCoding.decoder.decode(T.self, from: Data(text.utf8))
    }

    /// The value when this decoder reads `text` by itself; nil when `JSONDecoder` must.
    public static func withoutFoundation<T: Decodable>(_ type: T.Type, from text: String) -> T? {
        var text = text
        return text.withUTF8 { bytes in
            var scanner = JSONScanner(bytes)
            guard (try? scanner.scanDocument()) != nil else { return nil }
            return try? T(from: StoredJSONDecoder(scanner.document, at: 0))
        }
    }
}

/// The values of one JSON document, in document order: a container is followed by its members
/// (an object's as key, value, key, value…) and knows the index just past them.
struct JSONDocument {
    enum Kind: UInt8 { case object, array, string, number, `true`, `false`, null }

    struct Token {
        var kind: Kind
        /// The value's bytes (a string's without its quotes).
        var start: Int
        var end: Int
        /// The index of the token after this value and everything inside it.
        var after: Int
    }

    let bytes: UnsafeBufferPointer<UInt8>
    var tokens: [Token] = []

    func text(_ index: Int) -> String? {
        let token = tokens[index]
        return String(validating: UnsafeBufferPointer(rebasing: bytes[token.start..<token.end]), as: UTF8.self)
    }

    /// The value of `key` in the object at `object`, if it has one.
    func member(_ key: String, of object: Int) -> Int? {
        var index = object + 1
        let end = tokens[object].after
        var key = key
        return key.withUTF8 { wanted in
            while index < end {
                let token = tokens[index]
                if token.end - token.start == wanted.count,
                   memcmp(bytes.baseAddress! + token.start, wanted.baseAddress!, wanted.count) == 0 {
                    return index + 1
                }
                index = tokens[index + 1].after
            }
            return nil
        }
    }
}

/// Splits a document into tokens; throws on anything outside plain JSON, and on escapes.
struct JSONScanner {
    struct Unsupported: Error {}

    var document: JSONDocument
    var index = 0

    init(_ bytes: UnsafeBufferPointer<UInt8>) {
        document = JSONDocument(bytes: bytes)
        document.tokens.reserveCapacity(32)
    }

    private var bytes: UnsafeBufferPointer<UInt8> { document.bytes }

    mutating func scanDocument() throws {
        try scanValue(depth: 0)
        skipSpace()
        guard index == bytes.count else { throw Unsupported() }
    }

    private mutating func skipSpace() {
        while index < bytes.count, bytes[index] == 0x20 || bytes[index] == 0x0A || bytes[index] == 0x0D || bytes[index] == 0x09 {
            index += 1
        }
    }

    private mutating func expect(_ byte: UInt8) throws {
        skipSpace()
        guard index < bytes.count, bytes[index] == byte else { throw Unsupported() }
        index += 1
    }

    private mutating func scanValue(depth: Int) throws {
        skipSpace()
        guard index < bytes.count, depth < 64 else { throw Unsupported() }
        switch bytes[index] {
        case UInt8(ascii: "{"):
            try scanContainer(.object, close: UInt8(ascii: "}"), depth: depth)
        case UInt8(ascii: "["):
            try scanContainer(.array, close: UInt8(ascii: "]"), depth: depth)
        case UInt8(ascii: "\""):
            try scanString()
        case UInt8(ascii: "t"):
            try scanLiteral("true", .true)
        case UInt8(ascii: "f"):
            try scanLiteral("false", .false)
        case UInt8(ascii: "n"):
            try scanLiteral("null", .null)
        default:
            try scanNumber()
        }
    }

    private mutating func scanContainer(_ kind: JSONDocument.Kind, close: UInt8, depth: Int) throws {
        let container = document.tokens.count
        document.tokens.append(.init(kind: kind, start: index, end: index, after: 0))
        index += 1
        skipSpace()
        if index < bytes.count, bytes[index] == close {
            index += 1
        } else {
            while true {
                if kind == .object {
                    skipSpace()
                    guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw Unsupported() }
                    try scanString()
                    try expect(UInt8(ascii: ":"))
                }
                try scanValue(depth: depth + 1)
                skipSpace()
                guard index < bytes.count else { throw Unsupported() }
                if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
                guard bytes[index] == close else { throw Unsupported() }
                index += 1
                break
            }
        }
        document.tokens[container].end = index
        document.tokens[container].after = document.tokens.count
    }

    private mutating func scanString() throws {
        let start = index + 1
        index = start
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                document.tokens.append(.init(kind: .string, start: start, end: index, after: document.tokens.count + 1))
                index += 1
                return
            }
            // Escapes are left to Foundation; control characters are not JSON.
            guard byte != UInt8(ascii: "\\"), byte >= 0x20 else { throw Unsupported() }
            index += 1
        }
        throw Unsupported()
    }

    private mutating func scanLiteral(_ word: StaticString, _ kind: JSONDocument.Kind) throws {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count,
              memcmp(bytes.baseAddress! + index, word.utf8Start, count) == 0 else { throw Unsupported() }
        document.tokens.append(.init(kind: kind, start: index, end: index + count, after: document.tokens.count + 1))
        index += count
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    private mutating func scanNumber() throws {
        let start = index
        func digits() -> Int {
            let first = index
            while index < bytes.count, (0x30...0x39).contains(bytes[index]) { index += 1 }
            return index - first
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
        let integerStart = index
        let integerDigits = digits()
        guard integerDigits > 0, integerDigits == 1 || bytes[integerStart] != 0x30 else { throw Unsupported() }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digits() > 0 else { throw Unsupported() }
        }
        if index < bytes.count, bytes[index] | 0x20 == UInt8(ascii: "e") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            guard digits() > 0 else { throw Unsupported() }
        }
        document.tokens.append(.init(kind: .number, start: start, end: index, after: document.tokens.count + 1))
    }
}

/// A `Decoder` over one value of a scanned document. Every failure is `Unsupported`: the caller
/// then asks Foundation, whose error names the problem.
struct StoredJSONDecoder: Decoder {
    typealias Unsupported = JSONScanner.Unsupported

    let document: JSONDocument
    let index: Int
    var codingPath: [any CodingKey] { [] }
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    init(_ document: JSONDocument, at index: Int) {
        self.document = document
        self.index = index
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard document.tokens[index].kind == .object else { throw Unsupported() }
        return KeyedDecodingContainer(Keyed<Key>(document: document, object: index))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard document.tokens[index].kind == .array else { throw Unsupported() }
        return Unkeyed(document: document, array: index)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { Single(document: document, index: index) }

    /// The value at `index` as `T`: numbers, strings and booleans directly, dates in the ledger's
    /// formats, anything else through its own `init(from:)`.
    static func value<T: Decodable>(_ type: T.Type, in document: JSONDocument, at index: Int) throws -> T {
        let kind = document.tokens[index].kind
        if T.self == String.self {
            guard kind == .string, let text = document.text(index) else { throw Unsupported() }
            return text as! T
        }
        if T.self == Bool.self {
            guard kind == .true || kind == .false else { throw Unsupported() }
            return (kind == .true) as! T
        }
        if let integer = T.self as? any FixedWidthInteger.Type {
            return try Self.integer(integer, in: document, at: index) as! T
        }
        if T.self == UUID.self {
            guard kind == .string, let uuid = Self.uuid(in: document, at: index) else { throw Unsupported() }
            return uuid as! T
        }
        if T.self == Date.self {
            guard kind == .string, let text = document.text(index), let date = EventCoding.parseDate(text) else { throw Unsupported() }
            return date as! T
        }
        // Foundation decodes these with strategies of its own, and floating point with range
        // checks and rounding of its own (no stored body has a floating-point field).
        guard T.self != Data.self, T.self != Decimal.self, T.self != URL.self, T.self != Double.self, T.self != Float.self
        else { throw Unsupported() }
        return try T(from: StoredJSONDecoder(document, at: index))
    }

    /// `UUID(uuidString:)` without its `sscanf`: 8-4-4-4-12 hexadecimal digits, either case.
    private static func uuid(in document: JSONDocument, at index: Int) -> UUID? {
        let token = document.tokens[index]
        guard token.end - token.start == 36 else { return nil }
        var bytes = [UInt8](repeating: 0, count: 16)
        var position = token.start
        for byteIndex in 0..<16 {
            if byteIndex == 4 || byteIndex == 6 || byteIndex == 8 || byteIndex == 10 {
                guard document.bytes[position] == UInt8(ascii: "-") else { return nil }
                position += 1
            }
            guard let high = hexValue(document.bytes[position]), let low = hexValue(document.bytes[position + 1]) else { return nil }
            bytes[byteIndex] = high << 4 | low
            position += 2
        }
        return UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                           bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    private static func integer<I: FixedWidthInteger>(_ type: I.Type, in document: JSONDocument, at index: Int) throws -> I {
        let token = document.tokens[index]
        guard token.kind == .number else { throw Unsupported() }
        var position = token.start
        let negative = document.bytes[position] == UInt8(ascii: "-")
        if negative { position += 1 }
        var value: I = 0
        while position < token.end {
            let digit = document.bytes[position] &- 0x30
            guard digit < 10 else { throw Unsupported() }
            let (times, overflowA) = value.multipliedReportingOverflow(by: 10)
            let (next, overflowB) = negative ? times.subtractingReportingOverflow(I(digit)) : times.addingReportingOverflow(I(digit))
            guard !overflowA, !overflowB else { throw Unsupported() }
            value = next
            position += 1
        }
        return value
    }

    struct Keyed<Key: CodingKey>: KeyedDecodingContainerProtocol {
        let document: JSONDocument
        let object: Int
        var codingPath: [any CodingKey] { [] }

        var allKeys: [Key] {
            var keys: [Key] = []
            var index = object + 1
            while index < document.tokens[object].after {
                if let name = document.text(index), let key = Key(stringValue: name) { keys.append(key) }
                index = document.tokens[index + 1].after
            }
            return keys
        }

        func contains(_ key: Key) -> Bool { document.member(key.stringValue, of: object) != nil }

        private func member(_ key: Key) throws -> Int {
            guard let index = document.member(key.stringValue, of: object) else { throw Unsupported() }
            return index
        }

        func decodeNil(forKey key: Key) throws -> Bool { document.tokens[try member(key)].kind == .null }
        func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try decode(type, key) }
        func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try decode(type, key) }
        func decode(_ type: String.Type, forKey key: Key) throws -> String { try decode(type, key) }
        func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try decode(type, key) }
        func decode(_ type: Float.Type, forKey key: Key) throws -> Float { try decode(type, key) }
        func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try decode(type, key) }
        func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try decode(type, key) }
        func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try decode(type, key) }
        func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try decode(type, key) }
        func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try decode(type, key) }
        func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try decode(type, key) }
        func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try decode(type, key) }
        func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try decode(type, key) }
        func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try decode(type, key) }
        func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try decode(type, key) }
        /// The one decoding path for every overload (calling the generic requirement from a
        /// typed one would pick the typed one again).
        private func decode<T: Decodable>(_ type: T.Type, _ key: Key) throws -> T {
            try StoredJSONDecoder.value(T.self, in: document, at: try member(key))
        }

        func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
            try StoredJSONDecoder(document, at: try member(key)).container(keyedBy: type)
        }
        func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
            try StoredJSONDecoder(document, at: try member(key)).unkeyedContainer()
        }
        func superDecoder() throws -> any Decoder { throw Unsupported() }
        func superDecoder(forKey key: Key) throws -> any Decoder { throw Unsupported() }
    }

    struct Unkeyed: UnkeyedDecodingContainer {
        let document: JSONDocument
        let array: Int
        var next: Int
        var currentIndex = 0
        var codingPath: [any CodingKey] { [] }

        init(document: JSONDocument, array: Int) {
            self.document = document
            self.array = array
            next = array + 1
        }

        var count: Int? {
            var count = 0
            var index = array + 1
            while index < document.tokens[array].after { count += 1; index = document.tokens[index].after }
            return count
        }
        var isAtEnd: Bool { next >= document.tokens[array].after }

        private mutating func advance() throws -> Int {
            guard !isAtEnd else { throw Unsupported() }
            let index = next
            next = document.tokens[index].after
            currentIndex += 1
            return index
        }

        mutating func decodeNil() throws -> Bool {
            guard !isAtEnd else { throw Unsupported() }
            guard document.tokens[next].kind == .null else { return false }
            _ = try advance()
            return true
        }
        mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { try decode(type, generic: ()) }
        mutating func decode(_ type: Bool.Type) throws -> Bool { try decode(type, generic: ()) }
        mutating func decode(_ type: String.Type) throws -> String { try decode(type, generic: ()) }
        mutating func decode(_ type: Double.Type) throws -> Double { try decode(type, generic: ()) }
        mutating func decode(_ type: Float.Type) throws -> Float { try decode(type, generic: ()) }
        mutating func decode(_ type: Int.Type) throws -> Int { try decode(type, generic: ()) }
        mutating func decode(_ type: Int8.Type) throws -> Int8 { try decode(type, generic: ()) }
        mutating func decode(_ type: Int16.Type) throws -> Int16 { try decode(type, generic: ()) }
        mutating func decode(_ type: Int32.Type) throws -> Int32 { try decode(type, generic: ()) }
        mutating func decode(_ type: Int64.Type) throws -> Int64 { try decode(type, generic: ()) }
        mutating func decode(_ type: UInt.Type) throws -> UInt { try decode(type, generic: ()) }
        mutating func decode(_ type: UInt8.Type) throws -> UInt8 { try decode(type, generic: ()) }
        mutating func decode(_ type: UInt16.Type) throws -> UInt16 { try decode(type, generic: ()) }
        mutating func decode(_ type: UInt32.Type) throws -> UInt32 { try decode(type, generic: ()) }
        mutating func decode(_ type: UInt64.Type) throws -> UInt64 { try decode(type, generic: ()) }
        private mutating func decode<T: Decodable>(_ type: T.Type, generic: Void) throws -> T {
            guard !isAtEnd else { throw Unsupported() }
            let value = try StoredJSONDecoder.value(T.self, in: document, at: next)
            _ = try advance()
            return value
        }
        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
            try StoredJSONDecoder(document, at: try advance()).container(keyedBy: type)
        }
        mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
            try StoredJSONDecoder(document, at: try advance()).unkeyedContainer()
        }
        mutating func superDecoder() throws -> any Decoder { throw Unsupported() }
    }

    struct Single: SingleValueDecodingContainer {
        let document: JSONDocument
        let index: Int
        var codingPath: [any CodingKey] { [] }

        func decodeNil() -> Bool { document.tokens[index].kind == .null }
        func decode<T: Decodable>(_ type: T.Type) throws -> T { try StoredJSONDecoder.value(T.self, in: document, at: index) }
        func decode(_ type: Bool.Type) throws -> Bool { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: String.Type) throws -> String { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: Double.Type) throws -> Double { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: Float.Type) throws -> Float { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: Int.Type) throws -> Int { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: Int8.Type) throws -> Int8 { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: Int16.Type) throws -> Int16 { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: Int32.Type) throws -> Int32 { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: Int64.Type) throws -> Int64 { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: UInt.Type) throws -> UInt { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: UInt8.Type) throws -> UInt8 { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: UInt16.Type) throws -> UInt16 { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: UInt32.Type) throws -> UInt32 { try StoredJSONDecoder.value(type, in: document, at: index) }
        func decode(_ type: UInt64.Type) throws -> UInt64 { try StoredJSONDecoder.value(type, in: document, at: index) }
    }
}
