import Foundation

/// What a verified Apple transaction is to the ledger, decided before any order is looked at:
/// only a purchase of its own pays an order. A subscription's later periods belong to the
/// subscription, and a family member's shared access to nobody's order (issue 40).
public enum TransactionRole: Sendable, Equatable {
    /// A purchase that pays an order: a consumable, a non-consumable or a non-renewing
    /// subscription the customer bought.
    case purchase
    /// The purchase that starts an auto-renewable subscription (its `transactionId` is its
    /// `originalTransactionId`): it pays its order as any purchase does, and starts the
    /// subscription's stream.
    case subscriptionStart(originalTransactionId: String)
    /// A later transaction of a subscription (renewal, billing recovery, restore, upgrade or
    /// crossgrade, resubscribe, offer): recorded on the subscription, never paying an order.
    case subscriptionPeriod(originalTransactionId: String)
    /// A family member's access to another's purchase (`FAMILY_SHARED`): an entitlement, never
    /// paying an order, never paired; `subscription` names the member's subscription when the
    /// shared product is an auto-renewable one.
    case familyShared(subscription: String?)
    /// A later transaction of a purchase that is no subscription's (its `originalTransactionId`
    /// is another's): StoreKit's restore of a non-consumable, which gives the customer again what
    /// the original purchase paid for, and pays nothing itself. Never an order's, never pooled.
    case restore(originalTransactionId: String)

    /// Whether an order may take the transaction.
    public var paysOrder: Bool {
        switch self {
        case .purchase, .subscriptionStart: true
        case .subscriptionPeriod, .familyShared, .restore: false
        }
    }

    /// The subscription the transaction is recorded on, if any.
    public var subscription: String? {
        switch self {
        case .purchase, .restore: nil
        case .subscriptionStart(let id), .subscriptionPeriod(let id): id
        case .familyShared(let id): id
        }
    }

    /// The role of `transaction`, whose product the catalog says is `catalogType` (nil: the catalog
    /// is silent, and Apple's `type` decides). A subscription transaction without what a
    /// subscription needs is refused with the field it lacks.
    public static func of(_ transaction: AppleTransaction, catalogType: ProductType?) throws(LedgerInputError) -> TransactionRole {
        let type = catalogType ?? transaction.type.flatMap(ProductType.init(appleType:))
        guard type == .autoRenewable else {
            if transaction.isFamilyShared { return .familyShared(subscription: nil) }
            if let original = transaction.originalTransactionId, !original.isEmpty, original != transaction.transactionId.rawValue {
                return .restore(originalTransactionId: original)
            }
            return .purchase
        }
        guard let original = transaction.originalTransactionId, !original.isEmpty else {
            throw LedgerInputError(field: "originalTransactionId", problem: "an auto-renewable subscription's transaction must carry one")
        }
        guard transaction.expiresDate != nil else {
            throw LedgerInputError(field: "expiresDate", problem: "an auto-renewable subscription's transaction must carry one")
        }
        if transaction.isFamilyShared { return .familyShared(subscription: original) }
        return original == transaction.transactionId.rawValue
            ? .subscriptionStart(originalTransactionId: original)
            : .subscriptionPeriod(originalTransactionId: original)
    }
}
