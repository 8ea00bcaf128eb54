/// Validation shared by the ledger's string identifiers: 1 to 128 characters, no control characters.
public enum Identifier {
    public static let maximumLength = 128

    public static func validate(_ value: String, field: String, maximumLength: Int = maximumLength) throws(LedgerInputError) -> String {
        guard !value.isEmpty else { throw LedgerInputError(field: field, problem: "is empty") }
        // Counted in code points, as PostgreSQL's length() counts (not in Swift's characters,
        // where one letter may carry any number of combining marks).
        // One pass over the code points: the length, and the control characters (Unicode's
        // category Cc is exactly U+0000–U+001F and U+007F–U+009F; comparing ranges is much cheaper
        // than looking the category up, which a projection rebuild does for every identifier).
        var count = 0
        var control = false
        for scalar in value.unicodeScalars {
            count += 1
            if scalar.value < 0x20 || (scalar.value >= 0x7F && scalar.value <= 0x9F) { control = true }
        }
        guard count <= maximumLength else {
            throw LedgerInputError(field: field, problem: "is longer than \(maximumLength) characters")
        }
        guard !control else {
            throw LedgerInputError(field: field, problem: "contains a control character")
        }
        return value
    }

    /// Refuses a new id with white space at either end (or nothing else): `" o-1"` is another
    /// order than `o-1`, which a client sending `o-1` would never find. Checked where an id is
    /// first given (an order's creation, an app's SKU), not when the log is read: it keeps what
    /// it took.
    public static func checkUnpadded(_ value: String, field: String) throws(LedgerInputError) {
        guard let first = value.unicodeScalars.first, let last = value.unicodeScalars.last else { return }
        if first.properties.isWhitespace || last.properties.isWhitespace {
            throw LedgerInputError(field: field, problem: "is \(value.debugDescription), with white space at its start or end; send it without")
        }
    }
}

/// A string identifier with its field name, validated on creation and when decoded.
public protocol ValidatedIdentifier: Hashable, Sendable, Codable, CustomStringConvertible {
    static var field: String { get }
    /// The longest value accepted (128 unless a type says otherwise).
    static var maximumLength: Int { get }
    var rawValue: String { get }
    init(unchecked rawValue: String)
}

extension ValidatedIdentifier {
    public static var maximumLength: Int { Identifier.maximumLength }

    public init(_ rawValue: String) throws(LedgerInputError) {
        self.init(unchecked: try Identifier.validate(rawValue, field: Self.field, maximumLength: Self.maximumLength))
    }

    /// An id given for the first time, for what will be stored under it (an order, a catalog
    /// product, a user an Apple account or a pooled transaction resolves to): validated, and
    /// refused padded (`Identifier.checkUnpadded`), which the log, read back, keeps.
    public init(given rawValue: String) throws(LedgerInputError) {
        try self.init(rawValue)
        try checkGiven()
    }

    /// `init(given:)`'s check, of an id decoded with the rest of a body.
    public func checkGiven() throws(LedgerInputError) {
        try Identifier.checkUnpadded(rawValue, field: Self.field)
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

    // Equal when their bytes are, as PostgreSQL compares them: Swift's String == takes two
    // spellings of one accented letter (NFC and NFD) for one, which the log and the projections
    // keep apart. A repeated creation with a user id spelled the other way is another order's
    // user, not the same order's.
    public static func == (lhs: Self, rhs: Self) -> Bool { lhs.rawValue.utf8.elementsEqual(rhs.rawValue.utf8) }

    public func hash(into hasher: inout Hasher) {
        var text = rawValue
        text.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
    }
}

/// The client-chosen id of an order (the value once put in `applicationUsername`).
public struct OrderID: ValidatedIdentifier {
    public static let field = "orderId"
    public let rawValue: String
    public init(unchecked rawValue: String) { self.rawValue = rawValue }

    /// The order's event stream.
    public var streamID: StreamID { StreamID(unchecked: "order-" + rawValue) }
}

/// The backend's id of the paying user.
public struct UserID: ValidatedIdentifier {
    public static let field = "userId"
    public let rawValue: String
    public init(unchecked rawValue: String) { self.rawValue = rawValue }
}

/// An App Store product id.
public struct ProductID: ValidatedIdentifier {
    public static let field = "productId"
    public let rawValue: String
    public init(unchecked rawValue: String) { self.rawValue = rawValue }
}

/// Apple's id of one transaction.
public struct TransactionID: ValidatedIdentifier {
    public static let field = "transactionId"
    public let rawValue: String
    public init(unchecked rawValue: String) { self.rawValue = rawValue }

    /// The transaction's event stream, once it enters the pool.
    public var streamID: StreamID { StreamID(unchecked: "transaction-" + rawValue) }

    /// Refuses an Apple transaction id a backend or a history file wrote in a way Apple never
    /// does, which the ledger would keep apart from Apple's own (and grant that one again): a
    /// space at either end (a padded export), or a long number a spreadsheet rounded to exponent
    /// notation (`7.00471509000800E+12`), a number with a leading zero, a sign or digits other
    /// than ASCII's (`007`, `+7`, `７`), or nothing at all. Not checked when the log is read: it
    /// keeps what it took.
    public static func checkSpelling(_ value: String, field: String) throws(LedgerInputError) {
        guard !value.isEmpty else { throw LedgerInputError(field: field, problem: "is empty; leave it out when there is none") }
        // A number written otherwise than Apple writes it: `007` for 7, `+7`, `７` (full-width).
        let scalars = value.unicodeScalars
        let unsigned = scalars.first == "+" || scalars.first == "-" ? scalars.dropFirst() : scalars[...]
        if !unsigned.isEmpty, unsigned.allSatisfy({ $0.properties.numericType == .decimal }) {
            if unsigned.contains(where: { !$0.isASCII }) {
                throw LedgerInputError(field: field, problem: "is \(value.debugDescription), with digits other than 0 to 9; Apple writes its transaction ids in ASCII digits")
            }
            if unsigned.count < scalars.count {
                throw LedgerInputError(field: field, problem: "is \(value.debugDescription), a number with a sign; Apple's transaction ids are digits alone")
            }
            if unsigned.first == "0" {
                throw LedgerInputError(field: field, problem: "is \(value.debugDescription), with a leading zero; Apple's transaction ids have none")
            }
        }
        if let first = value.unicodeScalars.first, let last = value.unicodeScalars.last,
           first.properties.isWhitespace || last.properties.isWhitespace {
            throw LedgerInputError(field: field, problem: "is \(value.debugDescription), with a space at its start or end; Apple's transaction ids have none")
        }
        let bytes = Array(value.utf8)
        if let e = bytes.firstIndex(where: { $0 == UInt8(ascii: "E") || $0 == UInt8(ascii: "e") }), e > 0,
           bytes[..<e].allSatisfy({ Self.isDigit($0) || $0 == UInt8(ascii: ".") }), bytes[..<e].contains(where: Self.isDigit),
           bytes[(e + 1)...].drop(while: { $0 == UInt8(ascii: "+") || $0 == UInt8(ascii: "-") }).allSatisfy(Self.isDigit),
           bytes.count > e + 1 {
            throw LedgerInputError(
                field: field,
                problem: "is \(value.debugDescription), a number in exponent notation (a spreadsheet's rounding of a long id); Apple's transaction ids are whole digit strings: export the column as text")
        }
    }

    private static func isDigit(_ byte: UInt8) -> Bool { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) }
}

/// An app's bundle id, the key of an app: Apple's rule, letters, digits, hyphens and periods only
/// (up to 128 of them), starting with a letter or digit as a reverse-DNS name does.
public struct BundleID: ValidatedIdentifier {
    public static let field = "bundleId"
    public let rawValue: String
    public init(unchecked rawValue: String) { self.rawValue = rawValue }

    public init(_ rawValue: String) throws(LedgerInputError) {
        let value = try Identifier.validate(rawValue, field: Self.field)
        guard value.utf8.allSatisfy(Self.isAllowed), let first = value.utf8.first, first != UInt8(ascii: "-"), first != UInt8(ascii: ".") else {
            throw LedgerInputError(
                field: Self.field, problem: "may hold only letters, digits, hyphens and periods, as Apple's bundle ids do, and starts with a letter or digit")
        }
        self.init(unchecked: value)
    }

    public init(from decoder: any Decoder) throws {
        try self.init(decoder.singleValueContainer().decode(String.self))
    }

    private static func isAllowed(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
             UInt8(ascii: "-"), UInt8(ascii: "."): true
        default: false
        }
    }
}
