/// Small JSON objects written directly, for the hot paths (event metadata, orders and events,
/// receipt answers)
/// where JSONSerialization's dictionaries cost more than the work they describe.
public struct JSONText {
    private var text = "{"

    public init() {}

    /// An object whose text will be about `capacity` bytes: grown once instead of doubling.
    public init(capacity: Int) {
        text.reserveCapacity(capacity)
    }

    /// Adds `"key": value` (value nil: `null`).
    public mutating func add(_ key: String, _ value: String?) {
        separate(key)
        if let value { Self.quote(value, into: &text) } else { text += "null" }
    }

    public mutating func add(_ key: String, _ value: Bool) {
        separate(key)
        text += value ? "true" : "false"
    }

    public mutating func add(_ key: String, _ value: some BinaryInteger) {
        separate(key)
        text += String(value)
    }

    /// Adds `"key": value` (value nil: `null`).
    public mutating func add(_ key: String, integer value: Int64?) {
        separate(key)
        text += value.map { String($0) } ?? "null"
    }

    /// Adds `"key": <raw>` where raw is already JSON.
    public mutating func add(_ key: String, raw: String) {
        separate(key)
        text += raw
    }

    public var result: String { text + "}" }

    /// A JSON array of values that are already JSON.
    public static func array(_ items: [String]) -> String {
        "[" + items.joined(separator: ",") + "]"
    }

    private mutating func separate(_ key: String) {
        if text.utf8.count > 1 { text += "," }
        Self.quote(key, into: &text)
        text += ":"
    }

    /// A JSON string literal (RFC 8259 §7): quotes, backslashes and control characters escaped.
    public static func quote(_ value: String, into text: inout String) {
        // Most values (ids, states, times) need no escape: appended whole.
        if !value.utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) {
            text += "\""
            text += value
            text += "\""
            return
        }
        text += "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": text += "\\\""
            case "\\": text += "\\\\"
            case "\n": text += "\\n"
            case "\r": text += "\\r"
            case "\t": text += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                text += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: text.unicodeScalars.append(scalar)
            }
        }
        text += "\""
    }
}
