import Foundation

/// What a JSON text holds that the ledger cannot keep as sent, found before it is decoded: a
/// member named twice in one object (Foundation's decoder keeps one of the two values, PostgreSQL
/// the other), nesting deeper than `maximumDepth` (a stored body that deep breaks the answers and
/// the feed that read it again), a number `Decimal` cannot hold exactly (more than 38 significant
/// digits, or an exponent beyond its range: the decoder would round it, or refuse it with a
/// message about another type). Request bodies and import lines are refused naming the member.
public enum JSONShape {
    /// The most objects and arrays one inside another, the outermost counted.
    public static let maximumDepth = 32

    /// A member at `path` (`data.productId`; the root's name, `body` or `line`, when it is no
    /// member's) and what is wrong with it.
    public struct Problem: Error, Equatable, Sendable {
        public let path: String
        public let problem: String

        public init(path: String, problem: String) {
            self.path = path
            self.problem = problem
        }
    }

    /// The first problem of the text, or nil. Reads the structure only, before the decoder: of
    /// text that is not JSON, what it finds first is named (a member given twice before the
    /// text breaks off), else the decoder refuses it.
    public static func problem(in bytes: UnsafeRawBufferPointer, root: String = "body") -> Problem? {
        // One frame per open object or array: an object's member names so far, and the name of
        // the member it is the value of (nil for an element of an array).
        struct Frame {
            var names: Set<String>?
            var name: String?
        }
        var frames: [Frame] = []
        var expectingName = false
        var lastName: String?
        func path(_ last: String? = nil) -> String {
            let names = frames.compactMap(\.name) + (last.map { [$0] } ?? [])
            return names.isEmpty ? root : names.joined(separator: ".")
        }
        // The member a value belongs to: the object's last name, else the array's own.
        func owner() -> String? { frames.last?.names != nil ? lastName : nil }
        var index = 0
        let count = bytes.count
        // JSON text opens with an ASCII character (RFC 8259 §8.1): in UTF-16 or UTF-32, with or
        // without a byte order mark, one of its first two bytes is a NUL or the mark is there.
        // Foundation's decoder reads those encodings too, but this scan would not see their
        // numbers and names, and would let a rounded number through.
        if count >= 2, bytes[0] == 0 || bytes[1] == 0 || (bytes[0] == 0xFE && bytes[1] == 0xFF) || (bytes[0] == 0xFF && bytes[1] == 0xFE) {
            return Problem(path: root, problem: "is UTF-16 or UTF-32 text; send JSON as UTF-8")
        }
        while index < count {
            switch bytes[index] {
            case UInt8(ascii: "\""):
                let start = index + 1
                var end = start
                var escaped = false
                while end < count, bytes[end] != UInt8(ascii: "\"") {
                    if bytes[end] == UInt8(ascii: "\\") { escaped = true; end += 1 }
                    end += 1
                }
                let raw = UnsafeRawBufferPointer(rebasing: bytes[start..<min(end, count)])
                if expectingName, frames.last?.names != nil {
                    let name = escaped ? unescaped(raw) : String(decoding: raw, as: UTF8.self)
                    if escaped, let problem = escapeProblem(raw) { return Problem(path: path(name), problem: "is a name that \(problem)") }
                    guard frames[frames.count - 1].names!.insert(name).inserted else {
                        return Problem(path: path(name), problem: "is given more than once; give it once")
                    }
                    lastName = name
                    expectingName = false
                } else if escaped, let problem = escapeProblem(raw) {
                    return Problem(path: path(owner()), problem: problem)
                }
                index = end + 1
                continue
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                let isObject = bytes[index] == UInt8(ascii: "{")
                let name = owner()
                guard frames.count < maximumDepth else {
                    return Problem(path: path(name), problem: "is nested deeper than \(maximumDepth) levels of objects and arrays")
                }
                frames.append(Frame(names: isObject ? [] : nil, name: name))
                expectingName = isObject
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                if !frames.isEmpty { frames.removeLast() }
                expectingName = false
            case UInt8(ascii: ","):
                expectingName = frames.last?.names != nil
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                // A number starts a value: digits inside a bare word (a form's `a=eyJ0`) are no
                // number, and the decoder names what is wrong with such text.
                guard index == 0 || Self.precedesValue(bytes[index - 1]) else { break }
                var end = index
                while end < count, Self.isNumberByte(bytes[end]) { end += 1 }
                let number = UnsafeRawBufferPointer(rebasing: bytes[index..<end])
                // Outside any object or array, text that is no number is no JSON: the decoder says so.
                if frames.isEmpty, !isJSONNumber(number) { return nil }
                if let problem = numberProblem(number) {
                    return Problem(path: path(owner()), problem: problem)
                }
                index = end
                continue
            default:
                break
            }
            index += 1
        }
        return nil
    }

    public static func problem(in data: Data, root: String = "body") -> Problem? {
        data.withUnsafeBytes { problem(in: $0, root: root) }
    }

    /// Whether a value may follow `byte`: a structural character or white space.
    private static func precedesValue(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: ":"), UInt8(ascii: ","), UInt8(ascii: "["), UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"),
             UInt8(ascii: "\r"): true
        default: false
        }
    }

    /// What a string's escapes hold that PostgreSQL cannot store as text, or nil: `\u0000`, or a
    /// UTF-16 surrogate without its other half (no character at all).
    static func escapeProblem(_ raw: UnsafeRawBufferPointer) -> String? {
        func unit(at index: Int) -> UInt16? {
            guard index + 6 <= raw.count, raw[index] == UInt8(ascii: "\\"), raw[index + 1] == UInt8(ascii: "u") else { return nil }
            return UInt16(String(decoding: UnsafeRawBufferPointer(rebasing: raw[(index + 2)..<(index + 6)]), as: UTF8.self), radix: 16)
        }
        var index = 0
        while index < raw.count {
            guard raw[index] == UInt8(ascii: "\\") else { index += 1; continue }
            guard let value = unit(at: index) else { index += 2; continue }
            switch value {
            case 0:
                return "holds \\u0000, which cannot be stored as text"
            case 0xD800...0xDBFF:
                guard let low = unit(at: index + 6), (0xDC00...0xDFFF).contains(low) else {
                    return "holds a lone UTF-16 surrogate (\\u\(String(value, radix: 16, uppercase: true))), which is no character"
                }
                index += 12
            case 0xDC00...0xDFFF:
                return "holds a lone UTF-16 surrogate (\\u\(String(value, radix: 16, uppercase: true))), which is no character"
            default:
                index += 6
            }
        }
        return nil
    }

    private static func isNumberByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "+"), UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"): true
        default: false
        }
    }

    /// Why `Decimal` cannot hold the number written `text` exactly, or nil: more than 38
    /// significant digits (it would round them), or an exponent its parser refuses.
    static func numberProblem(_ text: UnsafeRawBufferPointer) -> String? {
        // Foundation's parser takes some numbers JSON does not have (`01`, `1.`, `-`, `1e`),
        // each as something else: refused here, as any JSON parser refuses them.
        guard isJSONNumber(text) else {
            return "is \(String(decoding: text.prefix(40), as: UTF8.self)), which is no JSON number (RFC 8259: no leading zeros, digits after a point and in an exponent)"
        }
        var significant = 0  // digits from the first non-zero one, trailing zeros counted apart
        var zeros = 0  // zeros after the last non-zero digit
        var digits = 0  // every digit written before the exponent
        var index = 0
        if index < text.count, text[index] == UInt8(ascii: "-") { index += 1 }
        while index < text.count {
            let byte = text[index]
            if byte == UInt8(ascii: ".") {
                // The point counts for nothing here: significant digits run across it.
            } else if (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) {
                digits += 1
                if byte == UInt8(ascii: "0") {
                    if significant > 0 { zeros += 1 }
                } else {
                    significant += zeros + 1
                    zeros = 0
                }
            } else {
                break  // the exponent
            }
            index += 1
        }
        guard significant <= 38 else {
            return "has \(significant) significant digits; the ledger keeps numbers of up to 38 exactly (send it as a string)"
        }
        // Foundation's parser keeps the digits as written and refuses an exponent it cannot store:
        // where one may be out of its range (an exponent is written, or many digits), it is asked.
        guard index < text.count || digits > 38 else { return nil }
        guard (try? decoder.decode(Decimal.self, from: Data(text))) != nil else {
            return "is beyond the range of numbers the ledger keeps"
        }
        return nil
    }

    /// Whether `text` is a number as JSON writes one: `-? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?`.
    static func isJSONNumber(_ text: UnsafeRawBufferPointer) -> Bool {
        var index = 0
        func digits() -> Int {
            let start = index
            while index < text.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(text[index]) { index += 1 }
            return index - start
        }
        func take(_ byte: UInt8) -> Bool {
            guard index < text.count, text[index] == byte else { return false }
            index += 1
            return true
        }
        _ = take(UInt8(ascii: "-"))
        if take(UInt8(ascii: "0")) {
            // A zero alone: no digit may follow it.
        } else if digits() == 0 {
            return false
        }
        if take(UInt8(ascii: ".")), digits() == 0 { return false }
        if take(UInt8(ascii: "e")) || take(UInt8(ascii: "E")) {
            if !take(UInt8(ascii: "+")) { _ = take(UInt8(ascii: "-")) }
            if digits() == 0 { return false }
        }
        return index == text.count
    }

    /// Foundation's, as the routes decode: for a number that may be out of range, an escaped name.
    private static let decoder = JSONDecoder()

    /// A name written with escapes (`\u0061`), as the decoder reads it.
    private static func unescaped(_ raw: UnsafeRawBufferPointer) -> String {
        let quoted = Data([UInt8(ascii: "\"")] + raw + [UInt8(ascii: "\"")])
        return (try? decoder.decode(String.self, from: quoted)) ?? String(decoding: raw, as: UTF8.self)
    }
}
