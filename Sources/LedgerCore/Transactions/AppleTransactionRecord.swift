import Foundation

/// An Apple transaction as the ledger knows it: a row of the `apple_transactions` projection,
/// either waiting in the pool or claimed by the one order it belongs to.
public struct AppleTransactionRecord: Sendable, Equatable {
    /// Where the transaction stands.
    public enum Status: String, Sendable, CaseIterable {
        /// In the pool: verified, tied to no order, free to be paired.
        case unmatched
        /// In the pool, refunded or revoked by Apple before any order took it: never granted.
        case refunded
        /// Tied to its order (`orderId`).
        case claimed
        /// A later period of an auto-renewable subscription (`subscription-renewal`): recorded on
        /// its subscription (or waiting for it to arrive), never an order's.
        case renewal
        /// A family member's shared access (`family-shared`): an entitlement, never an order's.
        case shared
        /// In the pool, held for support (`account-conflict`): the user its client claimed is not
        /// the user the ledger knows for its Apple account or its token. No automatic path pairs
        /// it; support does, with a reason.
        case conflict
        /// A restore of an earlier purchase (`restore`): never an order's, its money the original's.
        case restore
    }

    public var transactionId: TransactionID
    public var orderId: OrderID?
    public var userId: UserID?
    public var productId: ProductID
    public var purchaseDate: Date
    public var environment: String?
    public var status: Status
    /// When the ledger first heard of it, and when its row last changed.
    public var receivedAt: Date
    public var updatedAt: Date
    public var originalTransactionId: String?
    public var appTransactionId: String?
    public var appAccountToken: UUID?
    public var matchedBy: MatchedBy?
    /// The `transaction-unmatched` body as stored, for a transaction that went through the pool.
    public var verification: Data?
    /// The app the transaction belongs to: the bundle id Apple signed, or (claimed straight from
    /// a `receipt-received` that names none) its order's. Nil only in a ledger that holds no app.
    public var bundleId: BundleID?
    /// The storefront's country Apple signed (ISO 3166-1 alpha-3); nil when it did not say.
    public var storefront: String?

    public init(
        transactionId: TransactionID, orderId: OrderID?, userId: UserID?, productId: ProductID, purchaseDate: Date,
        environment: String?, status: Status, receivedAt: Date, updatedAt: Date, originalTransactionId: String?,
        appTransactionId: String?, appAccountToken: UUID?, matchedBy: MatchedBy?, verification: Data?, bundleId: BundleID? = nil,
        storefront: String? = nil
    ) {
        self.transactionId = transactionId
        self.orderId = orderId
        self.userId = userId
        self.productId = productId
        self.purchaseDate = purchaseDate
        self.environment = environment
        self.status = status
        self.receivedAt = receivedAt
        self.updatedAt = updatedAt
        self.originalTransactionId = originalTransactionId
        self.appTransactionId = appTransactionId
        self.appAccountToken = appAccountToken
        self.matchedBy = matchedBy
        self.verification = verification
        self.bundleId = bundleId
        self.storefront = storefront
    }

    /// Waiting in the pool with nothing against it: the only state an order may take it from.
    public var isPooled: Bool { orderId == nil && status == .unmatched }

    /// Waiting in the pool for support to decide between two users (`conflict`).
    public var isHeldForSupport: Bool { orderId == nil && status == .conflict }

    /// The row `transaction-unmatched` makes (`data`: that event's body as stored).
    static func pooled(_ body: TransactionUnmatched, data: Data, at date: Date) -> Self {
        let transaction = body.transaction
        return Self(
            transactionId: transaction.transactionId, orderId: nil, userId: body.userId, productId: transaction.productId,
            purchaseDate: transaction.purchaseDate, environment: transaction.environment, status: poolStatus(reason: body.reason), receivedAt: date,
            updatedAt: date, originalTransactionId: transaction.originalTransactionId,
            appTransactionId: transaction.appTransactionId, appAccountToken: transaction.appAccountToken, matchedBy: nil,
            verification: data, bundleId: BundleID(unchecked: transaction.bundleId), storefront: transaction.storefront)
    }

    /// The row `receipt-received` makes for the transaction it claims for `order`, when the
    /// ledger did not know the transaction.
    static func claimed(_ receipt: ReceiptReceived, by order: Order, at date: Date) -> Self {
        Self(
            transactionId: receipt.transactionId, orderId: order.orderId, userId: order.userId, productId: receipt.productId,
            purchaseDate: receipt.purchaseDate, environment: receipt.environment, status: .claimed, receivedAt: date,
            updatedAt: date, originalTransactionId: receipt.originalTransactionId, appTransactionId: receipt.appTransactionId,
            appAccountToken: receipt.appAccountToken, matchedBy: receipt.matchedBy, verification: nil,
            bundleId: receipt.bundleId ?? order.bundleId, storefront: receipt.storefront)
    }

    /// `claim` of a transaction that had waited as `self` in the pool: the order's fields from
    /// the claim, what Apple said of the transaction from the pool (whose record is the verified
    /// one), filled in from the claim where the pool had nothing.
    func taken(by claim: Self) -> Self {
        var row = self
        row.orderId = claim.orderId
        row.userId = claim.userId
        row.status = claim.status
        row.matchedBy = claim.matchedBy
        row.updatedAt = claim.updatedAt
        row.environment = environment ?? claim.environment
        row.originalTransactionId = originalTransactionId ?? claim.originalTransactionId
        row.appTransactionId = appTransactionId ?? claim.appTransactionId
        row.appAccountToken = appAccountToken ?? claim.appAccountToken
        row.bundleId = bundleId ?? claim.bundleId
        row.storefront = storefront ?? claim.storefront
        return row
    }

    /// The reasons that put a transaction that never pays an order into the pool, each with its status.
    public static let subscriptionRenewalReason = "subscription-renewal"
    public static let familySharedReason = "family-shared"
    /// A restore of an earlier purchase (`TransactionRole.restore`): kept, never an order's.
    public static let restoreReason = "restore"
    public static let accountConflictReason = "account-conflict"
    /// A family member's transaction the ledger first heard of when Apple revoked it: refunded at once.
    public static let familyShareRevokedReason = "family-share-revoked"
    /// Apple refunded or revoked a purchase a backend claimed before its order was verified: the
    /// claim is taken back, and the transaction waits refunded (a reversal frees it).
    public static let refundedBeforeVerifiedReasons: Set<String> = ["transaction-refunded", "transaction-revoked"]

    /// The status `transaction-unmatched` with `reason` gives: `renewal`, `shared` and `restore`
    /// for what never pays an order, `conflict` and `refunded` for what waits so, else `unmatched`.
    public static func poolStatus(reason: String) -> Status {
        switch reason {
        case subscriptionRenewalReason: .renewal
        case familySharedReason: .shared
        case restoreReason: .restore
        case accountConflictReason: .conflict
        case _ where refundedBeforeVerifiedReasons.contains(reason): .refunded
        default: .unmatched
        }
    }

    /// Whether Apple's notification of `notificationType` takes a purchase back (`REFUND`, `REVOKE`).
    public static func isRefund(_ notificationType: String) -> Bool {
        notificationType == "REFUND" || notificationType == "REVOKE"
    }

    /// What a notification does to this transaction while it waits in the pool: `REFUND` and
    /// `REVOKE` keep it from ever being granted, `REFUND_REVERSED` puts it back as its pool entry
    /// left it (`statusAfterReversal`); other types change nothing.
    func poolStatus(after notificationType: String) -> Status? {
        if Self.isRefund(notificationType) { return .refunded }
        return notificationType == "REFUND_REVERSED" ? statusAfterReversal : nil
    }

    /// The status `REFUND_REVERSED` gives back to a row that waits in the pool: the one its pool
    /// entry (`verification`, the stored `transaction-unmatched`) gave it. A transaction held for
    /// support is held again, never free for the reconciler, and a restore is one again. A family member's transaction stays
    /// refunded: its access ended by a revocation, which no reversed refund gives back, and it
    /// never pays an order.
    private var statusAfterReversal: Status {
        guard let verification, let entry = try? JSONDecoder().decode(PoolEntry.self, from: verification) else { return .unmatched }
        if entry.transaction?.inAppOwnershipType == "FAMILY_SHARED" || entry.reason == Self.familyShareRevokedReason {
            return .refunded
        }
        switch Self.poolStatus(reason: entry.reason) {
        case .conflict: return .conflict
        case .restore: return .restore
        default: return .unmatched
        }
    }

    /// What `statusAfterReversal` reads of a stored `transaction-unmatched`.
    private struct PoolEntry: Decodable {
        struct Ownership: Decodable { var inAppOwnershipType: String? }
        var reason: String
        var transaction: Ownership?
    }
}
