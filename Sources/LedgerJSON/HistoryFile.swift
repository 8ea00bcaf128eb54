import CSV
import Foundation
import LedgerCore

/// A file of a team's history (docs/import.md), read line by line: CSV with a header (read by
/// CSV.swift), or JSON Lines (one object per line). Each line gives its fields, or why it cannot
/// be read.
public struct HistoryFile: Sendable {
    public enum Format: String, Sendable {
        case csv
        case jsonLines = "jsonl"

        /// The format a file's name says: `.csv`, else `.jsonl` or `.ndjson`; nil for another.
        public init?(path: String) {
            switch URL(fileURLWithPath: path).pathExtension.lowercased() {
            case "csv": self = .csv
            case "jsonl", "ndjson": self = .jsonLines
            default: return nil
            }
        }
    }

    /// A line's fields, or why the line cannot be read.
    public struct Line: Sendable {
        public let number: Int
        public let fields: Result<[String: String], LedgerInputError>
    }

    public let format: Format
    let data: Data

    /// Reads `data` as `format`. A CSV file's header must name known columns, each once: else the
    /// file is refused, naming the column.
    public init(_ data: Data, format: Format) throws(LedgerInputError) {
        self.format = format
        // A byte-order mark (spreadsheets write one) is no part of the first column's name.
        self.data = data.starts(with: [0xEF, 0xBB, 0xBF]) ? data.dropFirst(3) : data
        // Readers take bytes that are not UTF-8 as U+FFFD (a JSON line's string then reads as no
        // string at all): the file is refused whole, naming the line, before any of it is imported.
        if let line = Self.firstLineNotUTF8(self.data, format: format) {
            throw LedgerInputError(field: "line \(line)", problem: "is not UTF-8 text; save the file as UTF-8")
        }
        guard format == .csv else { return }
        guard self.data.contains(where: { !($0 == 0x20 || $0 == 0x09 || $0 == 0x0D || $0 == 0x0A) }) else {
            throw LedgerInputError(field: "header", problem: "is missing: the file is empty")
        }
        // The CSV reader would also stop at a misplaced quote without a word (a quoted field then
        // runs to the file's end): that file is refused whole too.
        if let line = Self.misquotedLine(self.data) {
            throw LedgerInputError(
                field: "line \(line)",
                problem: "has a quoted value that does not end where it should: a quote inside quotes is written twice (\"\"), and a closing quote is followed by a comma or the line's end")
        }
        let reader: CSVReader
        do { reader = try CSVReader(string: String(decoding: self.data, as: UTF8.self), hasHeaderRow: true) } catch {
            throw LedgerInputError(field: "header", problem: "cannot be read as CSV: the first line must name the columns, separated by commas")
        }
        guard let names = reader.headerRow, names != [""] else {
            throw LedgerInputError(field: "header", problem: "is missing: the first line is blank; it must name the columns")
        }
        let header = names.map { $0.trimmingCharacters(in: .whitespaces) }
        if let blank = header.firstIndex(of: "") {
            throw LedgerInputError(field: "header", problem: "has no name for column \(blank + 1) (a comma too many?)")
        }
        for name in header where !HistoryRecord.columns.contains(name) {
            throw LedgerInputError(field: name, problem: "is not a column of an import; use \(HistoryRecord.columns.joined(separator: ", "))")
        }
        if let twice = header.first(where: { name in header.filter { $0 == name }.count > 1 }) {
            throw LedgerInputError(field: twice, problem: "is a column twice in the header")
        }
    }

    /// The lines after the header, in order; blank lines are skipped. A CSV record's number is the
    /// line it starts on (a quoted field may hold line breaks).
    public var lines: some Sequence<Line> {
        AnySequence<Line> { [format, data] in
            switch format {
            case .csv: Self.csvLines(data)
            case .jsonLines: Self.jsonLines(data)
            }
        }
    }

    /// Whether `byte`, followed by `next`, ends a line: LF, or CR alone (CRLF ends at its LF), as
    /// the CSV reader ends them.
    static func endsLine(_ byte: UInt8, before next: UInt8?) -> Bool {
        byte == UInt8(ascii: "\n") || (byte == UInt8(ascii: "\r") && next != UInt8(ascii: "\n"))
    }

    /// The line of the first byte that is not UTF-8, or nil, numbered as `format`'s reader numbers
    /// them (JSON Lines end at LF alone).
    static func firstLineNotUTF8(_ data: Data, format: Format) -> Int? {
        guard String(validating: data, as: UTF8.self) == nil else { return nil }
        var (number, start) = (1, data.startIndex)
        var index = data.startIndex
        while index < data.endIndex {
            let next = data.index(after: index)
            let ends = format == .csv
                ? Self.endsLine(data[index], before: next == data.endIndex ? nil : data[next]) : data[index] == UInt8(ascii: "\n")
            if ends {
                if String(validating: data[start..<index], as: UTF8.self) == nil { return number }
                number += 1
                start = next
            }
            index = next
        }
        return number
    }

    /// The line of the first quoted value RFC 4180 would not end there: a closing quote followed
    /// by anything but a comma or a line break, or a quote never closed (the line it opened on).
    /// A quote inside an unquoted value is a character of it, as the reader takes it.
    static func misquotedLine(_ data: Data) -> Int? {
        data.withUnsafeBytes { bytes in
            let (quote, comma, cr, lf) = (UInt8(ascii: "\""), UInt8(ascii: ","), UInt8(ascii: "\r"), UInt8(ascii: "\n"))
            var line = 1
            var opened = 0
            var atStart = true
            var quoted = false
            var index = 0
            while index < bytes.count {
                let byte = bytes[index]
                if Self.endsLine(byte, before: index + 1 < bytes.count ? bytes[index + 1] : nil) { line += 1 }
                if quoted {
                    if byte == quote {
                        if index + 1 < bytes.count, bytes[index + 1] == quote {
                            index += 2
                            continue
                        }
                        quoted = false
                        atStart = false
                        if index + 1 < bytes.count, ![comma, cr, lf].contains(bytes[index + 1]) { return line }
                    }
                } else if byte == quote, atStart {
                    quoted = true
                    opened = line
                } else {
                    atStart = byte == comma || byte == cr || byte == lf
                }
                index += 1
            }
            return quoted ? opened : nil
        }
    }

    private static func csvLines(_ data: Data) -> AnyIterator<Line> {
        guard let reader = try? CSVReader(string: String(decoding: data, as: UTF8.self), hasHeaderRow: true) else {
            return AnyIterator { nil }
        }
        let header = (reader.headerRow ?? []).map { $0.trimmingCharacters(in: .whitespaces) }
        // The header's own line breaks (a quoted name) are not counted: no column's name has one.
        var line = 2
        return AnyIterator<Line> {
            while let values = reader.next() {
                let number = line
                line += 1 + values.reduce(0) { $0 + $1.utf8.reduce(0) { $1 == UInt8(ascii: "\n") ? $0 + 1 : $0 } }
                if values.count == 1, values[0].trimmingCharacters(in: .whitespaces).isEmpty { continue }
                guard values.count == header.count else {
                    return Line(number: number, fields: .failure(LedgerInputError(
                        field: "line", problem: "has \(values.count) fields; the header has \(header.count)")))
                }
                var fields: [String: String] = [:]
                for (name, value) in zip(header, values) where !value.isEmpty { fields[name] = value }
                return Line(number: number, fields: .success(fields))
            }
            return nil
        }
    }

    private static func jsonLines(_ data: Data) -> AnyIterator<Line> {
        let bytes = [UInt8](data)
        var offset = 0
        var number = 0
        return AnyIterator<Line> {
            while offset < bytes.count {
                number += 1
                let end = bytes[offset...].firstIndex(of: UInt8(ascii: "\n")) ?? bytes.count
                let text = bytes[offset..<end]
                offset = end + 1
                guard text.contains(where: { !($0 == 0x20 || $0 == 0x09 || $0 == 0x0D) }) else { continue }
                return Line(number: number, fields: Self.jsonFields(Data(text)))
            }
            return nil
        }
    }

    /// One JSON object's members as text: strings as they are, numbers as written, null as absent.
    static func jsonFields(_ data: Data) -> Result<[String: String], LedgerInputError> {
        if let shape = JSONShape.problem(in: data, root: "line") {
            return .failure(LedgerInputError(field: shape.path, problem: shape.problem))
        }
        let object: [String: Member]
        do {
            object = try JSONDecoder().decode([String: Member].self, from: data)
        } catch let DecodingError.typeMismatch(_, context) where !context.codingPath.isEmpty {
            return .failure(LedgerInputError(field: context.codingPath[0].stringValue, problem: "must be a string, a number or null"))
        } catch {
            return .failure(LedgerInputError(field: "line", problem: "is not a JSON object whose members are strings, numbers or null"))
        }
        var fields: [String: String] = [:]
        for (name, member) in object {
            switch member {
            case .null: continue
            case .text(let text): fields[name] = text
            case .number(let number):
                // An id a spreadsheet rounded to a number with a fraction or an exponent reads as
                // digits here, another id than Apple's: refused as its text would be.
                // A key the text spells with escapes is not found as written: refused as well.
                if name.hasSuffix("ransactionId") {
                    let written = numberText(of: name, in: data)
                    guard let written else {
                        return .failure(LedgerInputError(
                            field: name,
                            problem: "is a number under a name spelt with escapes, which the ledger cannot read as written; Apple's transaction ids are whole digit strings: write them as strings"))
                    }
                    if written.contains(where: { ".eE-+".contains($0) }) {
                        return .failure(LedgerInputError(
                            field: name,
                            problem: "is \(written), a number with a sign, a fraction or an exponent (a spreadsheet's rounding of a long id); Apple's transaction ids are whole digit strings: write them as strings"))
                    }
                }
                fields[name] = "\(number)"
            }
        }
        return .success(fields)
    }

    /// The number member `name` of a JSON object as written in `data`: the first `"name"` that is
    /// a key (a colon follows it; the same text as another member's string value is not), when
    /// a number follows it; nil when there is none (a key spelt with escapes).
    static func numberText(of name: String, in data: Data) -> String? {
        let text = String(decoding: data, as: UTF8.self)
        var from = text.startIndex
        while let key = text.range(of: "\"\(name)\"", range: from..<text.endIndex) {
            // JSON's white space: a space, a tab, a line feed, a carriage return.
            let space = { (c: Character) in c == " " || c == "\t" || c == "\n" || c == "\r" || c == "\r\n" }
            let rest = text[key.upperBound...].drop(while: space)
            if rest.first == ":" {
                let number = rest.dropFirst().drop(while: space).prefix(while: { "0123456789+-.eE".contains($0) })
                if !number.isEmpty { return String(number) }
            }
            from = key.upperBound
        }
        return nil
    }

    /// A member of a JSON Lines object: a string, a number or null.
    enum Member: Decodable {
        case text(String), number(Decimal), null

        init(from decoder: any Decoder) throws {
            let value = try decoder.singleValueContainer()
            if value.decodeNil() { self = .null } else if let text = try? value.decode(String.self) { self = .text(text) } else {
                self = .number(try value.decode(Decimal.self))
            }
        }
    }
}
