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

    /// Decodes and checks an event body of `type`, naming the first problem found.
    public static func decode(type: OrderEventType, data: Data) throws(LedgerInputError) -> OrderEvent {
        do {
            let event: OrderEvent = switch type {
            case .created: .created(try LedgerJSON.decoder.decode(OrderCreated.self, from: data))
            case .paymentAdded: .paymentAdded(try LedgerJSON.decoder.decode(PaymentAdded.self, from: data))
            case .receiptReceived: .receiptReceived(try LedgerJSON.decoder.decode(ReceiptReceived.self, from: data))
            case .verified: .verified(try LedgerJSON.decoder.decode(Verified.self, from: data))
            case .delivered: try noFields(data, .delivered)
            case .finished: try noFields(data, .finished)
            case .refunded: .refunded(try LedgerJSON.decoder.decode(Refunded.self, from: data))
            case .refundReversed: try noFields(data, .refundReversed)
            case .failed: .failed(try LedgerJSON.decoder.decode(Failed.self, from: data))
            case .notificationReceived: .notificationReceived(try LedgerJSON.decoder.decode(NotificationReceived.self, from: data))
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
    private static func noFields(_ data: Data, _ event: OrderEvent) throws -> OrderEvent {
        _ = try LedgerJSON.decoder.decode(NoFields.self, from: data)
        return event
    }

    /// The body as JSON, for events the ledger writes itself.
    public func encodedData() -> Data {
        let encoder = LedgerJSON.encoder
        let data: Data? = switch self {
        case .created(let body): try? encoder.encode(body)
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
