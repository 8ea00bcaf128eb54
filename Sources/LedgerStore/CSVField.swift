/// A cell of the CSV files finance opens in a spreadsheet: quoted as RFC 4180 says when it holds a
/// comma, a quote or a line break.
enum CSVField {
    /// A value the ledger computed (a count, an amount such as -4.99, a day): quoted if need be.
    static func value(_ text: String) -> String {
        text.unicodeScalars.contains(where: { $0 == "," || $0 == "\"" || $0 == "\n" || $0 == "\r" })
            ? "\"" + text.replacingOccurrences(of: "\"", with: "\"\"") + "\"" : text
    }

    /// Text a client or Apple chose (a product id, a failure's reason, an SKU): a spreadsheet would
    /// run one that starts with `=`, `+`, `-`, `@`, a tab or a carriage return as a formula, so such
    /// a one is preceded by an apostrophe (OWASP's advice on CSV injection), then quoted if need be.
    static func text(_ text: String) -> String {
        guard let first = text.unicodeScalars.first, ["=", "+", "-", "@", "\t", "\r"].contains(first) else { return value(text) }
        return value("'" + text)
    }

    /// A map as `key=value` pairs joined by `;`, by key; a key's own `%`, `=` and `;` are
    /// percent-encoded, so that the cell reads back one way.
    static func map(_ values: [String: some CustomStringConvertible]) -> String {
        values.sorted { $0.key < $1.key }.map { pair in
            let key = pair.key.replacingOccurrences(of: "%", with: "%25").replacingOccurrences(of: "=", with: "%3D").replacingOccurrences(of: ";", with: "%3B")
            return "\(key)=\(pair.value)"
        }.joined(separator: ";")
    }
}
