import Foundation

/// The ledger's JSON conventions: ISO 8601 dates (fractional seconds accepted), sorted keys.
public enum LedgerJSON {
    public static var decoder: JSONDecoder {
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
    }

    public static var encoder: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(formatDate(date))
        }
        return encoder
    }

    /// Parses `2026-01-01T10:00:00Z` or `2026-01-01T10:00:00.123+08:00`.
    public static func parseDate(_ text: String) -> Date? {
        let fractional = ISO8601DateFormatter()
        fractional.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        if let date = fractional.date(from: text) { return date }
        let plain = ISO8601DateFormatter()
        plain.formatOptions = [.withInternetDateTime]
        return plain.date(from: text)
    }

    /// Formats with milliseconds in UTC.
    public static func formatDate(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
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
