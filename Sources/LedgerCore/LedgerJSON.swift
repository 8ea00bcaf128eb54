import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The ledger's JSON conventions: ISO 8601 dates (fractional seconds accepted), sorted keys.
public enum LedgerJSON {
    /// One decoder for every caller: its settings never change after this, and a decoder per call
    /// cost the rebuild about a tenth of its time.
    public static let decoder: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            let container = try decoder.singleValueContainer()
            let text = try container.decode(String.self)
            guard let date = parseDate(text) else {
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "not an ISO 8601 date-time: \(text)")
            }
            return date
        }
        return decoder
    }()

    public static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(formatDate(date))
        }
        return encoder
    }()

    /// Parses `2026-01-01T10:00:00Z`, `2026-01-01T10:00:00.123456Z` or `2026-01-01T10:00:00+08:00`;
    /// years before 1970 are refused (no App Store date is older, and the rebuild uses year 1 as "none").
    ///
    /// Hand-written: Foundation's ISO8601DateFormatter costs a formatter per call on Linux (it was
    /// the server's largest cost per request) and is not safe to share between threads there.
    public static func parseDate(_ text: String) -> Date? {
        let bytes = Array(text.utf8)
        func number(_ from: Int, _ count: Int) -> Int? {
            guard from + count <= bytes.count else { return nil }
            var value = 0
            for byte in bytes[from..<(from + count)] {
                guard (0x30...0x39).contains(byte) else { return nil }
                value = value * 10 + Int(byte - 0x30)
            }
            return value
        }
        guard bytes.count >= 20, bytes[4] == 0x2D, bytes[7] == 0x2D, bytes[10] == 0x54 || bytes[10] == 0x74,
              bytes[13] == 0x3A, bytes[16] == 0x3A,
              let year = number(0, 4), let month = number(5, 2), let day = number(8, 2),
              let hour = number(11, 2), let minute = number(14, 2), let second = number(17, 2),
              year >= 1970, (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second < 61
        else { return nil }
        var index = 19
        var fraction = 0.0
        if index < bytes.count, bytes[index] == 0x2E {
            index += 1
            var digits = 0
            var divisor = 1.0
            let start = index
            while index < bytes.count, (0x30...0x39).contains(bytes[index]), index - start < 9 {
                digits = digits * 10 + Int(bytes[index] - 0x30)
                divisor *= 10
                index += 1
            }
            guard index > start else { return nil }
            fraction = Double(digits) / divisor
        }
        guard index < bytes.count else { return nil }
        var offset = 0
        switch bytes[index] {
        case 0x5A, 0x7A:
            index += 1
        case 0x2B, 0x2D:
            guard let hours = number(index + 1, 2), bytes.count > index + 3, bytes[index + 3] == 0x3A,
                  let minutes = number(index + 4, 2), hours < 24, minutes < 60 else { return nil }
            offset = (hours * 3600 + minutes * 60) * (bytes[index] == 0x2D ? -1 : 1)
            index += 6
        default:
            return nil
        }
        guard index == bytes.count else { return nil }
        var parts = tm()
        parts.tm_year = Int32(year - 1900)
        parts.tm_mon = Int32(month - 1)
        parts.tm_mday = Int32(day)
        parts.tm_hour = Int32(hour)
        parts.tm_min = Int32(minute)
        parts.tm_sec = Int32(second)
        let seconds = timegm(&parts)
        // timegm normalises impossible dates (February 30th): refuse them instead.
        guard parts.tm_mday == Int32(day), parts.tm_mon == Int32(month - 1) else { return nil }
        return Date(timeIntervalSince1970: Double(seconds - offset) + fraction)
    }

    /// Formats in UTC with milliseconds: `2026-11-21T10:00:00.123Z`.
    public static func formatDate(_ date: Date) -> String {
        let interval = date.timeIntervalSince1970
        var whole = time_t(interval.rounded(.down))
        var milliseconds = Int(((interval - Double(whole)) * 1000).rounded())
        if milliseconds >= 1000 { milliseconds -= 1000; whole += 1 }
        var parts = tm()
        gmtime_r(&whole, &parts)
        let year = Int(parts.tm_year) + 1900
        if (0...9999).contains(year) {
            // Written digit by digit into the string's own storage: the interpolation of padded
            // parts below made fourteen strings for each date (0.8% of the server's CPU).
            return String(unsafeUninitializedCapacity: 24) { text in
                func put(_ value: Int, _ width: Int, at offset: Int) {
                    var value = value
                    for index in stride(from: offset + width - 1, through: offset, by: -1) {
                        text[index] = UInt8(0x30 + value % 10)
                        value /= 10
                    }
                }
                put(year, 4, at: 0)
                put(Int(parts.tm_mon) + 1, 2, at: 5)
                put(Int(parts.tm_mday), 2, at: 8)
                put(Int(parts.tm_hour), 2, at: 11)
                put(Int(parts.tm_min), 2, at: 14)
                put(Int(parts.tm_sec), 2, at: 17)
                put(milliseconds, 3, at: 20)
                (text[4], text[7], text[10]) = (UInt8(ascii: "-"), UInt8(ascii: "-"), UInt8(ascii: "T"))
                (text[13], text[16], text[19], text[23]) = (UInt8(ascii: ":"), UInt8(ascii: ":"), UInt8(ascii: "."), UInt8(ascii: "Z"))
                return 24
            }
        }
        func pad(_ value: Int32, _ width: Int) -> String {
            let text = String(value)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(Int32(milliseconds), 3))Z"
    }

    /// A decoding failure as an input error naming the field.
    public static func inputError(_ error: any Error, field: String) -> LedgerInputError {
        guard let error = error as? DecodingError else {
            return LedgerInputError(field: field, problem: "is not valid JSON")
        }
        func path(_ context: DecodingError.Context) -> String {
            let keys = context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }
            return keys.isEmpty ? field : keys.joined(separator: ".")
        }
        switch error {
        case .keyNotFound(let key, let context):
            let parent = path(context)
            return LedgerInputError(field: parent == field ? key.stringValue : "\(parent).\(key.stringValue)", problem: "is missing")
        case .typeMismatch(let type, let context):
            return LedgerInputError(field: path(context), problem: "must be \(describe(type))")
        case .valueNotFound(let type, let context):
            return LedgerInputError(field: path(context), problem: "must be \(describe(type)), not null")
        case .dataCorrupted(let context):
            if context.codingPath.isEmpty { return LedgerInputError(field: field, problem: "is not valid JSON") }
            let reason = (context.underlyingError as? LedgerInputError)?.problem ?? context.debugDescription
            return LedgerInputError(field: path(context), problem: reason.isEmpty ? "is invalid" : reason)
        @unknown default:
            return LedgerInputError(field: field, problem: "is invalid")
        }
    }

    static func describe(_ type: Any.Type) -> String {
        switch type {
        case is String.Type: "a string"
        case is Int.Type, is Int64.Type: "an integer"
        case is Bool.Type: "true or false"
        case is Double.Type: "a number"
        default: "\(type)".contains("Dictionary") ? "an object" : "a \(type)"
        }
    }
}
