// LedgerJSON: the JSON the ledger stores and answers (event bodies written and read, times).

import Foundation
import LedgerCore

/// The JSON the ledger stores and answers: Foundation's `JSONEncoder` and `JSONDecoder`, keys
/// sorted, times in ISO 8601 (written in UTC with milliseconds; read with or without a fraction,
/// in UTC or with an offset).
public enum EventCoding {
    /// One encoder and one decoder for every caller: their settings never change after this.
    public static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        encoder.dateEncodingStrategy = .custom { date, encoder in
            var container = encoder.singleValueContainer()
            try container.encode(formatDate(date))
        }
        return encoder
    }()

    public static let decoder: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .custom { decoder in
            let container = try decoder.singleValueContainer()
            let text = try container.decode(String.self)
            guard let date = parseDate(text) else {
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "must be an ISO 8601 time such as 2026-11-21T10:00:00Z (a real day and time, from 1970 to 9999)")
            }
            return date
        }
        return decoder
    }()

    private static let dateFormat = Date.ISO8601FormatStyle(includingFractionalSeconds: true)

    /// `2026-11-21T10:00:00.123Z`.
    public static func formatDate(_ date: Date) -> String { date.addingTimeInterval(0.000_000_5).formatted(dateFormat) }

    /// An ISO 8601 time (`2026-11-21T10:00:00Z`, `…:00.123456Z`, `…:00+08:00`), or nil; times
    /// outside 1970 to 9999 are refused (no App Store time is older: such a time is a client's
    /// mistake; a later one could not be read back), and so are days and times no calendar has
    /// (`2026-11-31`, `T25:00`), which the format style would roll over into the next ones.
    public static func parseDate(_ text: String) -> Date? {
        guard let date = try? dateFormat.parse(text), CalendarTime.isInRange(date), CalendarTime.isCalendarTime(text) else { return nil }
        return date
    }

    /// The typed body of a stored event: what the projections read of it.
    public static func body(stream: StreamID, type: String, data: Data) throws -> EventBody {
        try body(stream: stream, type: type, reader: JSONReader(data: data))
    }

    /// `body(stream:type:data:)` for a body read from the log as text, through
    /// `StoredBodyDecoder`: the same answers, faster.
    public static func body(stream: StreamID, type: String, text: String) throws -> EventBody {
        try body(stream: stream, type: type, reader: StoredReader(text: text))
    }

    private static func body(stream: StreamID, type: String, reader: some EventBodyReader) throws -> EventBody {
        if stream.isOrder, let type = OrderEventType(rawValue: type) {
            return .order(try OrderEvent(type: type, body: reader))
        }
        if stream.isTransaction, let type = TransactionEventType(rawValue: type) {
            return .transaction(try TransactionEvent(type: type, body: reader))
        }
        if stream.isSubscription, let type = SubscriptionEventType(rawValue: type) {
            return .subscription(try SubscriptionEvent(type: type, body: reader))
        }
        return .opaque(type: type)
    }

    /// A client's order event of `type`, read from `data` (which is stored as sent).
    public static func orderEvent(_ type: OrderEventType, from data: Data) throws(LedgerInputError) -> OrderEvent {
        let event: OrderEvent
        do {
            event = try OrderEvent(type: type, body: JSONReader(data: data))
        } catch {
            throw inputError(error, field: "data")
        }
        try event.validateNew()
        return event
    }

    /// An event the ledger writes itself, as it is stored, with its body read back from that JSON:
    /// the body a replay of the log folds (times keep milliseconds in JSON).
    public static func newEvent(_ event: OrderEvent, id: EventID, metadata: Data) throws -> NewEvent {
        switch event {
        case .delivered, .finished, .refundReversed:
            // No fields: the encoder's `{}`, and the body the log's `{}` reads back as.
            return NewEvent(id: id, body: .order(event), data: emptyBody, metadata: metadata)
        default: break
        }
        let data = try encoder.encode(event)
        return NewEvent(id: id, body: .order(try OrderEvent(type: event.type, body: StoredReader(text: String(decoding: data, as: UTF8.self)))), data: data, metadata: metadata)
    }

    private static let emptyBody = Data("{}".utf8)

    /// `newEvent` for an event of a transaction's stream.
    public static func newEvent(_ event: TransactionEvent, id: EventID, metadata: Data) throws -> NewEvent {
        let data = try encoder.encode(event)
        return NewEvent(id: id, body: .transaction(try TransactionEvent(type: event.type, body: StoredReader(text: String(decoding: data, as: UTF8.self)))), data: data, metadata: metadata)
    }

    /// `newEvent` for an event of a subscription's stream.
    public static func newEvent(_ event: SubscriptionEvent, id: EventID, metadata: Data) throws -> NewEvent {
        let data = try encoder.encode(event)
        return NewEvent(id: id, body: .subscription(try SubscriptionEvent(type: event.type, body: StoredReader(text: String(decoding: data, as: UTF8.self)))), data: data, metadata: metadata)
    }

    /// An event no projection reads (an Apple account's link, a notification kept apart), with
    /// `body` as its JSON. (Not inlined: inlined into an async caller, its typed-throwing
    /// `NewEvent` init crashes Swift 6.3's optimiser while it splits that caller's coroutine.)
    @inline(never)
    public static func newEvent(type: String, _ body: some Encodable, id: EventID, metadata: Data) throws -> NewEvent {
        try NewEvent(id: id, type: type, data: encoder.encode(body), metadata: metadata)
    }

    /// Reads a body from JSON text.
    struct JSONReader: EventBodyReader {
        let data: Data
        func read<Body: Decodable>(_ type: Body.Type) throws -> Body { try EventCoding.decoder.decode(type, from: data) }
    }

    /// Reads a stored body from the log's text.
    struct StoredReader: EventBodyReader {
        let text: String
        func read<Body: Decodable>(_ type: Body.Type) throws -> Body { try StoredBodyDecoder.decode(type, from: text) }
    }

    /// A decoding failure as an input error naming the field (nested fields as a dotted path;
    /// `within`: the member the body was read from, left out of the path).
    public static func inputError(_ error: any Error, field: String, within member: String? = nil) -> LedgerInputError {
        if let error = error as? LedgerInputError { return error }
        guard let error = error as? DecodingError else {
            return LedgerInputError(field: field, problem: "is not valid JSON")
        }
        func path(_ context: DecodingError.Context) -> String {
            var keys = context.codingPath.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }
            if let member, keys.first == member { keys.removeFirst() }
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
            var reason = (context.underlyingError as? LedgerInputError)?.problem ?? context.debugDescription
            // Foundation's own words for a UUID it cannot read.
            if reason.hasPrefix("Attempted to decode UUID") { reason = "must be a UUID (8-4-4-4-12 hexadecimal digits)" }
            return LedgerInputError(field: path(context), problem: reason.isEmpty ? "is invalid" : reason)
        @unknown default:
            return LedgerInputError(field: field, problem: "is invalid")
        }
    }

    static func describe(_ type: Any.Type) -> String {
        switch type {
        case is String.Type: "a string"
        case is Int.Type, is Int64.Type, is Int32.Type: "an integer"
        case is Bool.Type: "true or false"
        case is Double.Type, is Float.Type, is Decimal.Type: "a number"
        default:
            // Containers as JSON names them (the decoder reports `Array<Any>` for a list).
            if "\(type)".contains("Dictionary") { "an object" } else if "\(type)".hasPrefix("Array") || "\(type)".hasPrefix("Set") { "an array" } else { "a \(type)" }
        }
    }
}

extension AppleTransactionRecord {
    /// The verified transaction as the pool recorded it (`transaction-unmatched`), for a
    /// transaction that went through the pool.
    public func verifiedTransaction() throws -> AppleTransaction? {
        try pooled()?.transaction
    }

    /// What the pool recorded of it (`transaction-unmatched`, the latest): the verified
    /// transaction, its users, why it waited. Nil for a transaction that never went through the pool.
    public func pooled() throws -> TransactionUnmatched? {
        try verification.map { try StoredBodyDecoder.decode(TransactionUnmatched.self, from: String(decoding: $0, as: UTF8.self)) }
    }
}
