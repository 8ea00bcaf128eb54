/// Small JSON objects written directly, for the hot paths (event metadata, orders and events,
/// receipt answers)
/// where JSONSerialization's dictionaries cost more than the work they describe.
struct JSONText {
    private var text = "{"

    /// Adds `"key": value` (value nil: `null`).
    mutating func add(_ key: String, _ value: String?) {
        separate(key)
        if let value { Self.quote(value, into: &text) } else { text += "null" }
    }

    mutating func add(_ key: String, _ value: Bool) {
        separate(key)
        text += value ? "true" : "false"
    }

    mutating func add(_ key: String, _ value: some BinaryInteger) {
        separate(key)
        text += String(value)
    }

    /// Adds `"key": <raw>` where raw is already JSON.
    mutating func add(_ key: String, raw: String) {
        separate(key)
        text += raw
    }

    var result: String { text + "}" }

    /// A JSON array of values that are already JSON.
    static func array(_ items: [String]) -> String {
        "[" + items.joined(separator: ",") + "]"
    }

    private mutating func separate(_ key: String) {
        if text.utf8.count > 1 { text += "," }
        Self.quote(key, into: &text)
        text += ":"
    }

    /// A JSON string literal (RFC 8259 §7): quotes, backslashes and control characters escaped.
    static func quote(_ value: String, into text: inout String) {
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
