import Foundation

/// `created`: the order exists.
public struct OrderCreated: Codable, Sendable, Equatable {
    public var userId: UserID
    public var productId: ProductID
    public var quantity: Int
    public var price: String?
    public var currency: String?
    public var appAccountToken: UUID
    /// The app the order belongs to, resolved when it was created; absent in events written
    /// before the ledger knew apps, or while it held none (the ledger's first app's, then).
    public var bundleId: BundleID?
    /// When the order was created, for an order of a team's history that another backend created
    /// before the ledger (never a client's to set: the API takes no such member). Absent for an
    /// order created through the ledger, created when its event was recorded.
    public var createdAt: Date?
    /// `user` when the token is its user's (the app's `appAccountTokens`), shared by the user's
    /// orders; absent when it names this order alone.
    public var appAccountTokenScope: AppAccountTokenScope?

    public init(
        userId: UserID, productId: ProductID, quantity: Int = 1, price: String? = nil, currency: String? = nil,
        appAccountToken: UUID = UUID(), bundleId: BundleID? = nil, createdAt: Date? = nil,
        appAccountTokenScope: AppAccountTokenScope? = nil
    ) {
        self.appAccountTokenScope = appAccountTokenScope
        self.userId = userId
        self.productId = productId
        self.quantity = quantity
        self.price = price
        self.currency = currency
        self.appAccountToken = appAccountToken
        self.bundleId = bundleId
        self.createdAt = createdAt
    }

    enum CodingKeys: String, CodingKey {
        case userId, productId, quantity, price, currency, appAccountToken, bundleId, createdAt, appAccountTokenScope
    }

    /// Writes the token in lower case, as the API shows it.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(userId, forKey: .userId)
        try container.encode(productId, forKey: .productId)
        try container.encode(quantity, forKey: .quantity)
        try container.encodeIfPresent(price, forKey: .price)
        try container.encodeIfPresent(currency, forKey: .currency)
        try container.encode(appAccountToken.uuidString.lowercased(), forKey: .appAccountToken)
        try container.encodeIfPresent(bundleId, forKey: .bundleId)
        try container.encodeIfPresent(createdAt, forKey: .createdAt)
        try container.encodeIfPresent(appAccountTokenScope, forKey: .appAccountTokenScope)
    }
}

/// `payment-added`: the client put the payment into the StoreKit queue.
public struct PaymentAdded: Codable, Sendable, Equatable {
    public var queuedAt: Date
    public init(queuedAt: Date) { self.queuedAt = queuedAt }
}

/// How a transaction was tied to its order.
public enum MatchedBy: String, Codable, Sendable, CaseIterable {
    case applicationUsername, appAccountToken, reconciler, support
    /// Granted by the team's backend before the ledger, and imported (docs/import.md).
    case imported
}

/// The form a proof of purchase came in.
public enum ReceiptFormat: String, Codable, Sendable, CaseIterable {
    case jws, receipt
    /// No proof: a line of an imported history (docs/import.md).
    case imported
}

/// `receipt-received`: proof of an Apple transaction for this order arrived.
public struct ReceiptReceived: Codable, Sendable, Equatable {
    public var transactionId: TransactionID
    public var productId: ProductID
    public var purchaseDate: Date
    public var receiptSha256: String
    public var format: ReceiptFormat
    public var matchedBy: MatchedBy
    /// What verification learnt of the transaction, when the ledger wrote the event itself.
    public var originalTransactionId: String?
    public var appTransactionId: String?
    public var appAccountToken: UUID?
    public var environment: String?
    /// The bundle id Apple signed for the transaction, when the ledger verified it: the app of
    /// the transaction's row (else its order's), which must be its order's (`app-mismatch`).
    public var bundleId: BundleID?
    /// The storefront's country Apple signed (ISO 3166-1 alpha-3), when it said.
    public var storefront: String?

    public init(
        transactionId: TransactionID, productId: ProductID, purchaseDate: Date, receiptSha256: String, format: ReceiptFormat,
        matchedBy: MatchedBy, originalTransactionId: String? = nil, appTransactionId: String? = nil,
        appAccountToken: UUID? = nil, environment: String? = nil, bundleId: BundleID? = nil, storefront: String? = nil
    ) {
        self.transactionId = transactionId
        self.productId = productId
        self.purchaseDate = purchaseDate
        self.receiptSha256 = receiptSha256
        self.format = format
        self.matchedBy = matchedBy
        self.originalTransactionId = originalTransactionId
        self.appTransactionId = appTransactionId
        self.appAccountToken = appAccountToken
        self.environment = environment
        self.bundleId = bundleId
        self.storefront = storefront
    }
}

/// `verified`: the transaction was verified and matches the order.
public struct Verified: Codable, Sendable, Equatable {
    public var transactionId: TransactionID?
    public var environment: String?
    public init(transactionId: TransactionID? = nil, environment: String? = nil) {
        self.transactionId = transactionId
        self.environment = environment
    }
}

/// `refunded`: Apple refunded or revoked the transaction, wholly or in part, as its signed
/// transaction says (Apple's `revocationType` and `revocationPercentage`).
///
/// Events stored before the ledger read Apple's type held the notification's type (`REFUND`,
/// `REVOKE`) in `revocationType`: such a value is read as `notificationType`, with
/// `revocationType` absent, which means a full refund.
public struct Refunded: Codable, Sendable, Equatable {
    public var revocationDate: Date
    public var revocationReason: Int?
    /// Apple's `revocationType`; absent: a full refund.
    public var revocationType: RevocationType?
    /// Apple's `revocationPercentage`: thousandths of a percent refunded (0...100000), with
    /// `REFUND_PRORATED`.
    public var revocationPercentage: Int?
    /// The notification that said so (`REFUND`, `REVOKE`); absent when the refund catch-up found
    /// the refund in Apple's refund history, or a client wrote the event without one.
    public var notificationType: String?

    public init(
        revocationDate: Date, revocationReason: Int? = nil, revocationType: RevocationType? = nil, revocationPercentage: Int? = nil,
        notificationType: String? = nil
    ) {
        self.revocationDate = revocationDate
        self.revocationReason = revocationReason
        self.revocationType = revocationType
        self.revocationPercentage = revocationPercentage
        self.notificationType = notificationType
    }

    /// The event for Apple's `revocation`, said by a notification of `notificationType` (nil: read
    /// from Apple's refund history).
    public init(_ revocation: Revocation, notificationType: String?) {
        self.init(
            revocationDate: revocation.date, revocationReason: revocation.reason, revocationType: revocation.type,
            revocationPercentage: revocation.percentage, notificationType: notificationType)
    }

    enum CodingKeys: String, CodingKey {
        case revocationDate, revocationReason, revocationType, revocationPercentage, notificationType
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        revocationDate = try container.decode(Date.self, forKey: .revocationDate)
        revocationReason = try container.decodeIfPresent(Int.self, forKey: .revocationReason)
        revocationPercentage = try container.decodeIfPresent(Int.self, forKey: .revocationPercentage)
        notificationType = try container.decodeIfPresent(String.self, forKey: .notificationType)
        let type = try container.decodeIfPresent(String.self, forKey: .revocationType)
        switch type.map(RevocationType.init(rawValue:)) {
        case nil:
            revocationType = nil
        case let known??:
            revocationType = known
        case .some(nil) where notificationType == nil:
            // Stored before Apple's type was read: the field held the notification's type.
            revocationType = nil
            notificationType = type
        case .some(nil):
            throw DecodingError.dataCorruptedError(
                forKey: .revocationType, in: container,
                debugDescription: "must be REFUND_FULL, REFUND_PRORATED or FAMILY_REVOKE")
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(revocationDate, forKey: .revocationDate)
        try container.encodeIfPresent(revocationReason, forKey: .revocationReason)
        try container.encodeIfPresent(revocationType, forKey: .revocationType)
        try container.encodeIfPresent(revocationPercentage, forKey: .revocationPercentage)
        try container.encodeIfPresent(notificationType, forKey: .notificationType)
    }
}

/// `pairing-undone`: support reversed the pairing of `transactionId` with the order before
/// delivery; the order is open again and the transaction back in the pool.
public struct PairingUndone: Codable, Sendable, Equatable {
    public var transactionId: TransactionID
    public var reason: String
    /// The state the order left (`receipt-received` or `verified`): a verified order's revenue
    /// leaves the report with it.
    public var fromState: OrderState
    public init(transactionId: TransactionID, reason: String, fromState: OrderState) {
        self.transactionId = transactionId
        self.reason = reason
        self.fromState = fromState
    }
}

/// `failed`: the order ended without delivery.
public struct Failed: Codable, Sendable, Equatable {
    public var reason: String
    public var detail: String?
    public init(reason: String, detail: String? = nil) {
        self.reason = reason
        self.detail = detail
    }
}

/// An event with no fields of its own (`delivered`, `finished`, `refund-reversed`); any fields a
/// caller sends with it are kept in the stored body.
public struct NoFields: Codable, Sendable, Equatable {
    public init() {}
}

extension OrderEvent {
    /// The environments a purchase is counted under, as Apple spells them: `given` in any case,
    /// or nil for any other name (the reports would count it under neither).
    public static func environmentName(_ given: String) -> String? {
        ["Production", "Sandbox"].first { $0.lowercased() == given.lowercased() }
    }

    /// Refuses an environment (`receipt-received`, `verified`) not spelled as Apple spells it:
    /// the reports count `Production` and `Sandbox` alone, and the log keeps the event's data as
    /// sent, so another spelling would be read as it was written whenever the log is read again.
    public func checkEnvironmentSpelling() throws(LedgerInputError) {
        let given: String?
        switch self {
        case .receiptReceived(let receipt): given = receipt.environment
        case .verified(let verified): given = verified.environment
        default: given = nil
        }
        guard let given, given != "Production", given != "Sandbox" else { return }
        let hint = Self.environmentName(given).map { "; write \($0), as Apple spells it" } ?? "; use Production or Sandbox"
        throw LedgerInputError(field: "data.environment", problem: "is \(given.debugDescription)\(hint)")
    }

    /// Refuses Apple transaction ids (`receipt-received`, `verified`) written as Apple never
    /// writes them (`TransactionID.checkSpelling`).
    public func checkTransactionIdSpelling() throws(LedgerInputError) {
        switch self {
        case .receiptReceived(let receipt):
            try TransactionID.checkSpelling(receipt.transactionId.rawValue, field: "data.transactionId")
            if let original = receipt.originalTransactionId { try TransactionID.checkSpelling(original, field: "data.originalTransactionId") }
        case .verified(let verified):
            if let id = verified.transactionId { try TransactionID.checkSpelling(id.rawValue, field: "data.transactionId") }
        default:
            break
        }
    }
}
