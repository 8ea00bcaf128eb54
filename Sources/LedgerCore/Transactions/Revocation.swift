import Foundation

/// Apple's `revocationType`: how the App Store refunded or revoked a transaction.
public enum RevocationType: String, Codable, Sendable, CaseIterable {
    /// The whole amount went back to the customer.
    case refundFull = "REFUND_FULL"
    /// A share of it did: `revocationPercentage`.
    case refundProrated = "REFUND_PRORATED"
    /// A family member's shared access ended; nobody was refunded.
    case familyRevoke = "FAMILY_REVOKE"
}

/// What Apple's signed transaction says of its refund or revocation: `revocationDate`,
/// `revocationReason`, `revocationType` and `revocationPercentage`.
public struct Revocation: Sendable, Equatable {
    public var date: Date
    public var reason: Int?
    /// Absent when Apple sent none (transactions signed before Apple had the field) or one the
    /// ledger does not know: a full refund.
    public var type: RevocationType?
    /// Thousandths of a percent refunded (0...100000), with `REFUND_PRORATED`.
    public var percentage: Int?

    public init(date: Date, reason: Int? = nil, type: RevocationType? = nil, percentage: Int? = nil) {
        self.date = date
        self.reason = reason
        self.type = type
        self.percentage = percentage
    }

    /// Whether this ends a family member's shared access to `transaction` rather than refunding a
    /// purchase: Apple says `FAMILY_REVOKE`, or the transaction is a family member's
    /// (`FAMILY_SHARED`: each member has transactions of their own, which nobody paid for). The
    /// purchaser's own transaction, refunded, comes with a refund of its own.
    public func endsFamilyShare(of transaction: AppleTransaction) -> Bool {
        type == .familyRevoke || transaction.isFamilyShared
    }
}

extension AppleTransaction {
    /// A family member's access to another's purchase (Apple's `inAppOwnershipType`
    /// `FAMILY_SHARED`), not a purchase of its own.
    public var isFamilyShared: Bool { inAppOwnershipType == "FAMILY_SHARED" }
}
