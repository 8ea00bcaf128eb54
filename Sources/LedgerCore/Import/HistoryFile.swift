import Foundation

/// A file of a team's history (docs/import.md), read line by line: CSV with a header, or JSON
/// Lines (one object per line). Each line gives its fields, or why it cannot be read.
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
    let bytes: [UInt8]
    /// The CSV header's column names, in order.
    let header: [String]
    /// Where the records after the header start, and the line they start on.
    let start: (offset: Int, line: Int)

    /// Reads `data` as `format`. A CSV file's header must name known columns, each once: else the
    /// file is refused, naming the column.
    public init(_ data: Data, format: Format) throws(LedgerInputError) {
        self.format = format
        bytes = [UInt8](data)
        guard format == .csv else {
            header = []
            start = (0, 1)
            return
        }
        var reader = CSVReader(bytes: bytes, offset: 0, line: 1)
        guard let (_, names) = reader.next() else { throw LedgerInputError(field: "header", problem: "is missing: the file is empty") }
        let header = names.map { $0.trimmingCharacters(in: .whitespaces) }
        for name in header where !HistoryRecord.columns.contains(name) {
            throw LedgerInputError(field: name, problem: "is not a column of an import; use \(HistoryRecord.columns.joined(separator: ", "))")
        }
        if let twice = header.first(where: { name in header.filter { $0 == name }.count > 1 }) {
            throw LedgerInputError(field: twice, problem: "is a column twice in the header")
        }
        self.header = header
        start = (reader.offset, reader.line)
    }

    /// The lines after the header, in order; blank lines are skipped.
    public var lines: some Sequence<Line> {
        var csv = CSVReader(bytes: bytes, offset: start.offset, line: start.line)
        var offset = 0
        var number = 0
        return AnySequence<Line> { [format, header, bytes] in
            AnyIterator<Line> {
                switch format {
                case .csv:
                    guard let (line, values) = csv.next() else { return nil }
                    guard values.count == header.count else {
                        return Line(number: line, fields: .failure(LedgerInputError(
                            field: "line", problem: "has \(values.count) fields; the header has \(header.count)")))
                    }
                    var fields: [String: String] = [:]
                    for (name, value) in zip(header, values) where !value.isEmpty { fields[name] = value }
                    return Line(number: line, fields: .success(fields))
                case .jsonLines:
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
        }
    }

    /// One JSON object's members as text: strings as they are, numbers as written, null as absent.
    static func jsonFields(_ data: Data) -> Result<[String: String], LedgerInputError> {
        guard let object = try? JSONDecoder().decode([String: Member].self, from: data) else {
            return .failure(LedgerInputError(field: "line", problem: "is not a JSON object of strings (or, for price, a number)"))
        }
        var fields: [String: String] = [:]
        for (name, member) in object {
            switch member {
            case .null: continue
            case .text(let text): fields[name] = text
            case .number(let number): fields[name] = "\(number)"
            }
        }
        return .success(fields)
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

/// RFC 4180 records: fields separated by commas, quoted with `"` (a quote inside doubled), records
/// ended by LF or CRLF; a quoted field may span lines.
struct CSVReader {
    let bytes: [UInt8]
    var offset: Int
    var line: Int

    /// The next non-blank record and the line it starts on.
    mutating func next() -> (Int, [String])? {
        while offset < bytes.count {
            let first = line
            var fields: [String] = []
            var field: [UInt8] = []
            var quoted = false
            var ended = false
            while offset < bytes.count, !ended {
                let byte = bytes[offset]
                offset += 1
                if quoted {
                    if byte == UInt8(ascii: "\"") {
                        if offset < bytes.count, bytes[offset] == UInt8(ascii: "\"") {
                            field.append(byte)
                            offset += 1
                        } else {
                            quoted = false
                        }
                    } else {
                        if byte == UInt8(ascii: "\n") { line += 1 }
                        field.append(byte)
                    }
                    continue
                }
                switch byte {
                case UInt8(ascii: "\""): quoted = true
                case UInt8(ascii: ","):
                    fields.append(String(decoding: field, as: UTF8.self))
                    field.removeAll(keepingCapacity: true)
                case UInt8(ascii: "\n"):
                    line += 1
                    ended = true
                case UInt8(ascii: "\r") where offset < bytes.count && bytes[offset] == UInt8(ascii: "\n"):
                    continue
                default: field.append(byte)
                }
            }
            fields.append(String(decoding: field, as: UTF8.self))
            if fields.count == 1, fields[0].trimmingCharacters(in: .whitespaces).isEmpty { continue }
            return (first, fields)
        }
        return nil
    }
}
