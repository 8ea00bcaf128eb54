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
    case pairingUndone(PairingUndone)
    case consumptionAnswer(ConsumptionAnswer)

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
        case .pairingUndone: .pairingUndone
        case .consumptionAnswer: .consumptionAnswer
        }
    }

    /// The Apple transaction whose row this event may change (`Projection.apply`'s `claimed`):
    /// the one a receipt claims, the one an undone pairing releases, and the one a `verified`
    /// names (its environment, where no signed pool entry gave the row one).
    public var touchedTransaction: TransactionID? {
        switch self {
        case .receiptReceived(let receipt): receipt.transactionId
        case .pairingUndone(let undone): undone.transactionId
        case .verified(let verified): verified.transactionId
        default: nil
        }
    }

    /// The event of `type` whose body `body` reads, checked (`validate`): the one table of which
    /// body each type has, for every format the ledger reads (stored JSON, a request's field).
    public init(type: OrderEventType, body: some EventBodyReader) throws {
        switch type {
        case .created: self = .created(try body.read(OrderCreated.self))
        case .paymentAdded: self = .paymentAdded(try body.read(PaymentAdded.self))
        case .receiptReceived: self = .receiptReceived(try body.read(ReceiptReceived.self))
        case .verified: self = .verified(try body.read(Verified.self))
        case .delivered:
            if let percentage = try body.read(DeliveredFields.self).consumptionPercentage, !(0...100_000).contains(percentage) {
                throw LedgerInputError(field: "consumptionPercentage", problem: "must be from 0 to 100000 (thousandths of a percent)")
            }
            self = .delivered
        case .finished: _ = try body.read(NoFields.self); self = .finished
        case .refunded: self = .refunded(try body.read(Refunded.self))
        case .refundReversed: _ = try body.read(NoFields.self); self = .refundReversed
        case .failed: self = .failed(try body.read(Failed.self))
        case .notificationReceived: self = .notificationReceived(try body.read(NotificationReceived.self))
        case .pairingUndone: self = .pairingUndone(try body.read(PairingUndone.self))
        case .consumptionAnswer: self = .consumptionAnswer(try body.read(ConsumptionAnswer.self))
        }
        try validate()
    }

    /// Checks of values that decoding alone does not make.
    /// What a client may not send though the log may hold it (accepted before the rule): checked
    /// on a client's event alone, so that a stored one still folds into the projections.
    public func validateNew() throws(LedgerInputError) {
        // A reason is counted by in reports and dashboards: one line of text.
        if case .failed(let body) = self, body.reason.unicodeScalars.contains(where: { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) }) {
            throw LedgerInputError(field: "reason", problem: "contains a control character")
        }
        // A purchase the App Store cannot have made (a mistyped year): the reports would date a
        // sale by it. The bounds of an imported history's (HistoryRecord).
        if case .receiptReceived(let body) = self {
            if body.purchaseDate > Date().addingTimeInterval(86_400) {
                throw LedgerInputError(field: "data.purchaseDate", problem: "is in the future")
            }
            if body.purchaseDate < HistoryRecord.appStoreOpened {
                throw LedgerInputError(field: "data.purchaseDate", problem: "is before the App Store opened (2008-07-10)")
            }
            if body.appTransactionId?.isEmpty == true {
                throw LedgerInputError(field: "data.appTransactionId", problem: "is empty; leave it out when there is none")
            }
        }
    }

    public func validate() throws(LedgerInputError) {
        switch self {
        case .created(let body):
            guard (1...100).contains(body.quantity) else {
                throw LedgerInputError(field: "quantity", problem: "must be from 1 to 100")
            }
            if let price = body.price, !Self.isValidPrice(price) {
                throw LedgerInputError(field: "price", problem: "must be a decimal string such as \"0.99\", of at most 32 characters")
            }
            if let currency = body.currency, !Self.isValidCurrency(currency) {
                throw LedgerInputError(field: "currency", problem: "must be an ISO 4217 code such as \"USD\"")
            }
        case .receiptReceived(let body):
            guard body.receiptSha256.utf8.count == 64, body.receiptSha256.utf8.allSatisfy(Self.isASCIIHexDigit) else {
                throw LedgerInputError(field: "receiptSha256", problem: "must be 64 hexadecimal digits")
            }
        case .refunded(let body):
            if let percentage = body.revocationPercentage, !(0...100_000).contains(percentage) {
                throw LedgerInputError(field: "revocationPercentage", problem: "must be from 0 to 100000 (thousandths of a percent)")
            }
        case .failed(let body):
            guard !body.reason.isEmpty, body.reason.count <= 64 else {
                throw LedgerInputError(field: "reason", problem: "must have 1 to 64 characters")
            }
        default:
            break
        }
    }

    // The checks below read UTF-8 bytes, not Characters: every valid text is ASCII, and the
    // grapheme breaking of `Character` was a twentieth of the importer's time (perf, `bench import`).

    /// A price as orders and the catalog take it: a decimal string such as "0.99".
    public static func isValidPrice(_ text: String) -> Bool {
        let parts = text.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), text.utf8.count <= 32 else { return false }
        return parts.allSatisfy { !$0.isEmpty && $0.allSatisfy { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) } }
    }

    /// A valid price as the ledger keeps and shows it (as PostgreSQL's `numeric` reads it back):
    /// without the leading zeros of its whole part, `000.990` as `0.990`.
    public static func normalizedPrice(_ text: String) -> String {
        let whole = text.prefix { $0 != "." }
        let trimmed = whole.drop { $0 == "0" }
        return (trimmed.isEmpty ? "0" : String(trimmed)) + text.dropFirst(whole.count)
    }

    /// An ISO 4217 currency code: three upper-case letters.
    public static func isValidCurrency(_ text: String) -> Bool {
        text.utf8.count == 3 && text.utf8.allSatisfy { (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0) }
    }

    /// 0-9, a-f or A-F (a digest's hex digits; not their full-width forms, which `Character` takes).
    static func isASCIIHexDigit(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "f"), UInt8(ascii: "A")...UInt8(ascii: "F"): true
        default: false
        }
    }
}

/// Reads an event's body in some format: `OrderEvent.init(type:body:)` asks it for the body type
/// that the event type has.
public protocol EventBodyReader {
    func read<Body: Decodable>(_ type: Body.Type) throws -> Body
}

extension OrderEvent: Encodable {
    /// The body alone (the type is stored beside it); types without fields write `{}`.
    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .created(let body): try body.encode(to: encoder)
        case .paymentAdded(let body): try body.encode(to: encoder)
        case .receiptReceived(let body): try body.encode(to: encoder)
        case .verified(let body): try body.encode(to: encoder)
        case .refunded(let body): try body.encode(to: encoder)
        case .failed(let body): try body.encode(to: encoder)
        case .notificationReceived(let body): try body.encode(to: encoder)
        case .pairingUndone(let body): try body.encode(to: encoder)
        case .consumptionAnswer(let body): try body.encode(to: encoder)
        case .delivered, .finished, .refundReversed: try NoFields().encode(to: encoder)
        }
    }
}
