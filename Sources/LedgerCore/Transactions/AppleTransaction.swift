import Foundation

/// An Apple transaction as verification established it: the same shape whether it came from a
/// StoreKit 2 signed transaction, a legacy receipt or a server notification.
public struct AppleTransaction: Codable, Sendable, Equatable {
    public var transactionId: TransactionID
    public var originalTransactionId: String?
    public var productId: ProductID
    public var purchaseDate: Date
    /// `Production` or `Sandbox` (Apple's names).
    public var environment: String
    public var bundleId: String
    public var quantity: Int
    public var appAccountToken: UUID?
    public var appTransactionId: String?
    public var inAppOwnershipType: String?
    /// Decimal string in `currency` (Apple sends milli-units; converted on the way in).
    public var price: String?
    public var currency: String?
    /// `jws` or `receipt`.
    public var format: ReceiptFormat
    /// SHA-256 of the proof as it was sent, hex: which upload proved it.
    public var receiptSha256: String
    /// Apple's product type: `Consumable`, `Non-Consumable`, `Auto-Renewable Subscription` or
    /// `Non-Renewing Subscription` (absent in legacy receipts, which do not say).
    public var type: String?
    /// An auto-renewable subscription's: the end of the period this transaction paid for.
    public var expiresDate: Date?
    /// An auto-renewable subscription's: Apple's id of the billing period, the same however the
    /// transaction reaches the ledger (`webOrderLineItemId`).
    public var webOrderLineItemId: String?
    /// `PURCHASE` or `RENEWAL` (Apple's `transactionReason`).
    public var transactionReason: String?
    /// The subscription group of an auto-renewable subscription (`subscriptionGroupIdentifier`).
    public var subscriptionGroupIdentifier: String?
    /// The App Store storefront's country as Apple signed it, ISO 3166-1 alpha-3 (`USA`); absent
    /// in legacy receipts, which do not say.
    public var storefront: String?
    /// An auto-renewable subscription's: Apple's `isUpgraded`, true once the customer upgraded to
    /// another product of the group, whose new period (bought later) replaced this one's service.
    public var isUpgraded: Bool?

    public init(
        transactionId: TransactionID, originalTransactionId: String?, productId: ProductID, purchaseDate: Date,
        environment: String, bundleId: String, quantity: Int = 1, appAccountToken: UUID? = nil, appTransactionId: String? = nil,
        inAppOwnershipType: String? = nil, price: String? = nil, currency: String? = nil, format: ReceiptFormat, receiptSha256: String,
        type: String? = nil, expiresDate: Date? = nil, webOrderLineItemId: String? = nil, transactionReason: String? = nil,
        subscriptionGroupIdentifier: String? = nil, storefront: String? = nil, isUpgraded: Bool? = nil
    ) {
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.productId = productId
        self.purchaseDate = purchaseDate
        self.environment = environment
        self.bundleId = bundleId
        self.quantity = quantity
        self.appAccountToken = appAccountToken
        self.appTransactionId = appTransactionId
        self.inAppOwnershipType = inAppOwnershipType
        self.price = price
        self.currency = currency
        self.format = format
        self.receiptSha256 = receiptSha256
        self.type = type
        self.expiresDate = expiresDate
        self.webOrderLineItemId = webOrderLineItemId
        self.transactionReason = transactionReason
        self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
        self.storefront = storefront
        self.isUpgraded = isUpgraded
    }

    /// The end of the service this transaction pays for now: its `expiresDate`, none once it was
    /// upgraded (the upgrade's period, bought later, ended its service then).
    public var periodEnd: Date? { isUpgraded == true ? nil : expiresDate }
}

/// The event types of a transaction's stream (`transaction-<transactionId>`).
public enum TransactionEventType: String, Codable, Sendable, CaseIterable {
    /// Entered the unmatched pool, with everything known of it.
    case unmatched = "transaction-unmatched"
    /// Left the pool: tied to an order.
    case matched = "transaction-matched"
    /// An App Store Server Notification about it arrived while it had no order.
    case notificationReceived = "notification-received"
    /// The ledger's answer to Apple's `CONSUMPTION_REQUEST` about it while it had no order.
    case consumptionAnswer = "consumption-answer"
    /// Apple ended a family member's shared access to it: no order changes, no money moves.
    case familyShareRevoked = "family-share-revoked"
}

/// One event of a transaction's stream with its typed body.
public enum TransactionEvent: Sendable, Equatable {
    case unmatched(TransactionUnmatched)
    case matched(TransactionMatched)
    case notificationReceived(NotificationReceived)
    case consumptionAnswer(ConsumptionAnswer)
    case familyShareRevoked(FamilyShareRevoked)

    public var type: TransactionEventType {
        switch self {
        case .unmatched: .unmatched
        case .matched: .matched
        case .notificationReceived: .notificationReceived
        case .consumptionAnswer: .consumptionAnswer
        case .familyShareRevoked: .familyShareRevoked
        }
    }

    /// The event of `type` whose body `body` reads.
    public init(type: TransactionEventType, body: some EventBodyReader) throws {
        switch type {
        case .unmatched: self = .unmatched(try body.read(TransactionUnmatched.self))
        case .matched: self = .matched(try body.read(TransactionMatched.self))
        case .notificationReceived: self = .notificationReceived(try body.read(NotificationReceived.self))
        case .consumptionAnswer: self = .consumptionAnswer(try body.read(ConsumptionAnswer.self))
        case .familyShareRevoked: self = .familyShareRevoked(try body.read(FamilyShareRevoked.self))
        }
    }
}

extension TransactionEvent: Encodable {
    /// The body alone (the type is stored beside it).
    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .unmatched(let body): try body.encode(to: encoder)
        case .matched(let body): try body.encode(to: encoder)
        case .notificationReceived(let body): try body.encode(to: encoder)
        case .consumptionAnswer(let body): try body.encode(to: encoder)
        case .familyShareRevoked(let body): try body.encode(to: encoder)
        }
    }
}

/// `transaction-unmatched`: a verified transaction with no usable order.
public struct TransactionUnmatched: Codable, Sendable, Equatable {
    public var transaction: AppleTransaction
    /// The user the proof came from, when known.
    public var userId: UserID?
    /// The order id the proof named, when it named one that could not take it.
    public var claimedOrderId: OrderID?
    /// Why it could not be tied: `no-order`, `unknown-order`, `user-mismatch`, `order-closed`,
    /// `product-mismatch`, `purchased-before-order`, `account-conflict` (held for support, see
    /// `knownUserId`), `notification`, `family-share-revoked` (a family member's transaction the
    /// ledger first heard of when Apple revoked it), or `undone: <support's reason>`.
    public var reason: String
    /// The orders support undid a pairing of it with: the reconciler never pairs it with them again.
    public var undoneOrderIds: [OrderID]?
    /// With `account-conflict`: the user the ledger knows for the transaction's Apple account (its
    /// link, or an earlier transaction of it tied to that user's order) or for its
    /// appAccountToken, who is not the claimed `userId`.
    public var knownUserId: UserID?

    public init(
        transaction: AppleTransaction, userId: UserID?, claimedOrderId: OrderID?, reason: String, undoneOrderIds: [OrderID]? = nil,
        knownUserId: UserID? = nil
    ) {
        self.transaction = transaction
        self.userId = userId
        self.claimedOrderId = claimedOrderId
        self.reason = reason
        self.undoneOrderIds = undoneOrderIds
        self.knownUserId = knownUserId
    }
}

/// `transaction-matched`: the transaction left the pool for an order.
public struct TransactionMatched: Codable, Sendable, Equatable {
    public var orderId: OrderID
    public var matchedBy: MatchedBy
    /// How many open orders could have taken it (1 for direct evidence).
    public var candidates: Int
    /// The reconciler's rule (`queue-order`, `creation-order`, `recovery`), or how it was tied otherwise.
    public var rule: String?
    /// The reconciler's candidates that it did not choose (present when there were any).
    public var otherCandidates: [OrderID]?

    public init(orderId: OrderID, matchedBy: MatchedBy, candidates: Int, rule: String? = nil, otherCandidates: [OrderID]? = nil) {
        self.orderId = orderId
        self.matchedBy = matchedBy
        self.candidates = candidates
        self.rule = rule
        self.otherCandidates = otherCandidates
    }
}

/// An App Store Server Notification as it is recorded on a stream (`notification-received`).
public struct NotificationReceived: Codable, Sendable, Equatable {
    public var notificationUUID: UUID
    public var notificationType: String
    public var subtype: String?
    public var transactionId: TransactionID?
    public var signedDate: Date
    /// Why the customer asked for a refund (`CONSUMPTION_REQUEST` only): Apple's
    /// `consumptionRequestReason`, such as `UNINTENDED_PURCHASE` or `FULFILLMENT_ISSUE`.
    public var consumptionRequestReason: String?
    /// A `REFUND` or `REVOKE` recorded on the stream of a transaction no order holds: what Apple
    /// signed of it, so that the period it takes back is refunded when the transaction's
    /// subscription becomes known (a renewal that waited for its start).
    public var refund: Refunded?
    /// A `REFUND` or `REVOKE` that arrived after Apple reversed it (Apple retried it, or a backfill
    /// found it): a `REFUND_REVERSED` of its transaction signed after its revocation was recorded
    /// first, or the same refund (revoked at the same time) was recorded already and reversed
    /// since. It takes nothing back. Absent otherwise.
    public var reversedBefore: Bool?
    /// The environment Apple signed the notification's transaction in (absent in events recorded
    /// before it was kept): Apple's calls about the notification, such as a consumption answer,
    /// go to that environment's host, whatever a backend claimed for the transaction. For a
    /// notification without a transaction, the environment it names.
    public var environment: String?
    /// The app a notification without a transaction names (`TEST`, a `RENEWAL_EXTENSION`
    /// summary): whose notification backfill it counts for. Absent otherwise, and in events
    /// recorded before it was kept.
    public var bundleId: String?
    /// A lifecycle notification (`DID_RENEW`, `DID_FAIL_TO_RENEW`, …) about a renewal waiting for
    /// its subscription's start: the renewal info Apple signed with it, and the period's end as its
    /// signed transaction said, so that the start records what it said on the subscription
    /// (`subscription-renewal-changed`). Absent otherwise.
    public var renewalInfo: RenewalInfo?
    public var periodEnd: Date?

    /// Whether this notification takes its transaction back: a refund or revocation Apple had not
    /// reversed before it arrived.
    public var takesBack: Bool { AppleTransactionRecord.isRefund(notificationType) && reversedBefore != true }

    public init(
        notificationUUID: UUID, notificationType: String, subtype: String?, transactionId: TransactionID?, signedDate: Date,
        consumptionRequestReason: String? = nil, refund: Refunded? = nil, environment: String? = nil, bundleId: String? = nil
    ) {
        self.notificationUUID = notificationUUID
        self.notificationType = notificationType
        self.subtype = subtype
        self.transactionId = transactionId
        self.signedDate = signedDate
        self.consumptionRequestReason = consumptionRequestReason
        self.refund = refund
        self.environment = environment
        self.bundleId = bundleId
    }
}
