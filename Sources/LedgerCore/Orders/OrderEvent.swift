import Foundation

/// One order event with its typed body.
public enum OrderEvent: Sendable, Equatable {
    case created(OrderCreated)
    case paymentAdded(PaymentAdded)
    case receiptReceived(ReceiptReceived)
    case verified(Verified)
    case delivered
    case finished
    case refunded(Refunded)
    case refundReversed
    case failed(Failed)
    case notificationReceived(NotificationReceived)

    public var type: OrderEventType {
        switch self {
        case .created: .created
        case .paymentAdded: .paymentAdded
        case .receiptReceived: .receiptReceived
        case .verified: .verified
        case .delivered: .delivered
        case .finished: .finished
        case .refunded: .refunded
        case .refundReversed: .refundReversed
        case .failed: .failed
        case .notificationReceived: .notificationReceived
        }
    }

    /// Decodes and checks an event body of `type` a client sent, naming the first problem found:
    /// through `StoredJSON` where it can read it alone (the same answers as Foundation's decoder,
    /// which reads the rest).
    public static func decode(type: OrderEventType, data: Data) throws(LedgerInputError) -> OrderEvent {
        try decode(type: type, body: .data(data))
    }

    /// `decode(type:data:)` through Foundation's decoder alone: what the others must answer.
    static func decodeThroughFoundation(type: OrderEventType, data: Data) throws(LedgerInputError) -> OrderEvent {
        try decode(type: type, body: .foundation(data))
    }

    /// Decodes and checks a body the ledger stored (the log's jsonb as text) through `StoredJSON`:
    /// the same answers as `decode(type:data:)`, faster.
    public static func decodeStored(type: OrderEventType, text: String) throws(LedgerInputError) -> OrderEvent {
        try decode(type: type, body: .stored(text))
    }

    /// A body and the decoder it goes through.
    private enum Body {
        case data(Data)
        case stored(String)
        case foundation(Data)

        func decode<T: Decodable>(_ type: T.Type) throws -> T {
            switch self {
            case .data(let data): try StoredJSON.decode(type, from: data)
            case .stored(let text): try StoredJSON.decode(type, from: text)
            case .foundation(let data): try LedgerJSON.decoder.decode(type, from: data)
            }
        }
    }

    private static func decode(type: OrderEventType, body: Body) throws(LedgerInputError) -> OrderEvent {
        do {
            let event: OrderEvent = switch type {
            case .created: .created(try body.decode(OrderCreated.self))
            case .paymentAdded: .paymentAdded(try body.decode(PaymentAdded.self))
            case .receiptReceived: .receiptReceived(try body.decode(ReceiptReceived.self))
            case .verified: .verified(try body.decode(Verified.self))
            case .delivered: try noFields(body, .delivered)
            case .finished: try noFields(body, .finished)
            case .refunded: .refunded(try body.decode(Refunded.self))
            case .refundReversed: try noFields(body, .refundReversed)
            case .failed: .failed(try body.decode(Failed.self))
            case .notificationReceived: .notificationReceived(try body.decode(NotificationReceived.self))
            }
            try event.validate()
            return event
        } catch let error as LedgerInputError {
            throw error
        } catch {
            throw LedgerJSON.inputError(error, field: "data")
        }
    }

    /// Checks that a body without fields of its own is a JSON object.
    private static func noFields(_ body: Body, _ event: OrderEvent) throws -> OrderEvent {
        _ = try body.decode(NoFields.self)
        return event
    }

    /// The body as JSON, for events the ledger writes itself.
    public func encodedData() -> Data {
        let encoder = LedgerJSON.encoder
        let data: Data? = switch self {
        case .created(let body): Data(body.json.utf8)
        case .paymentAdded(let body): try? encoder.encode(body)
        case .receiptReceived(let body): try? encoder.encode(body)
        case .verified(let body): try? encoder.encode(body)
        case .refunded(let body): try? encoder.encode(body)
        case .failed(let body): try? encoder.encode(body)
        case .notificationReceived(let body): try? encoder.encode(body)
        case .delivered, .finished, .refundReversed: try? encoder.encode(NoFields())
        }
        return data ?? Data("{}".utf8)
    }

    /// The event as the log keeps it, and its JSON: the body decoded from the JSON the log stores,
    /// which a replay folds. (Dates keep milliseconds in JSON; a finer `Date` folded as given
    /// would leave a projection row that a replay does not give.)
    public func asStored() throws(LedgerInputError) -> (event: OrderEvent, data: Data) {
        let data = encodedData()
        return (try Self.decode(type: type, data: data), data)
    }

    /// Checks of values that decoding alone does not make.
    func validate() throws(LedgerInputError) {
        switch self {
        case .created(let body):
            guard (1...100).contains(body.quantity) else {
                throw LedgerInputError(field: "quantity", problem: "must be from 1 to 100")
            }
            if let price = body.price, !Self.isDecimal(price) {
                throw LedgerInputError(field: "price", problem: "must be a decimal string such as \"0.99\"")
            }
            if let currency = body.currency, !(currency.count == 3 && currency.allSatisfy { $0.isASCII && $0.isUppercase }) {
                throw LedgerInputError(field: "currency", problem: "must be an ISO 4217 code such as \"USD\"")
            }
        case .receiptReceived(let body):
            guard body.receiptSha256.count == 64, body.receiptSha256.allSatisfy(\.isHexDigit) else {
                throw LedgerInputError(field: "receiptSha256", problem: "must be 64 hexadecimal digits")
            }
        case .failed(let body):
            guard !body.reason.isEmpty, body.reason.count <= 64 else {
                throw LedgerInputError(field: "reason", problem: "must have 1 to 64 characters")
            }
        default:
            break
        }
    }

    /// A price as orders and the catalog take it: a decimal string such as "0.99".
    public static func isValidPrice(_ text: String) -> Bool { isDecimal(text) }

    /// An ISO 4217 currency code: three upper-case letters.
    public static func isValidCurrency(_ text: String) -> Bool {
        text.count == 3 && text.allSatisfy { $0.isASCII && $0.isUppercase }
    }

    static func isDecimal(_ text: String) -> Bool {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), text.count <= 32 else { return false }
        return parts.allSatisfy { !$0.isEmpty && $0.allSatisfy { $0.isASCII && $0.isNumber } }
    }
}
