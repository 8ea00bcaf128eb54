import Foundation

/// `family-share-revoked`, on the transaction's own stream: Apple ended a family member's shared
/// access to a purchase (`revocationType` `FAMILY_REVOKE`, or a refund or revocation of a
/// `FAMILY_SHARED` transaction). Nobody paid for that transaction, so no order changes and no
/// money moves: an order that holds it stays as it was (the ledger does not model family
/// entitlements), and one waiting in the pool is never granted.
public struct FamilyShareRevoked: Codable, Sendable, Equatable {
    public var transactionId: TransactionID
    /// The order that holds the transaction, left as it was.
    public var orderId: OrderID?
    /// Apple's `inAppOwnershipType` of the transaction.
    public var inAppOwnershipType: String?
    public var revocationDate: Date
    public var revocationReason: Int?
    public var revocationType: RevocationType?
    public var revocationPercentage: Int?
    /// The notification that said so (`REVOKE`, `REFUND`), with its UUID; absent when the refund
    /// catch-up read it from Apple's refund history.
    public var notificationType: String?
    public var notificationUUID: UUID?

    public init(
        transactionId: TransactionID, orderId: OrderID?, inAppOwnershipType: String?, revocation: Revocation,
        notificationType: String?, notificationUUID: UUID?
    ) {
        self.transactionId = transactionId
        self.orderId = orderId
        self.inAppOwnershipType = inAppOwnershipType
        self.revocationDate = revocation.date
        self.revocationReason = revocation.reason
        self.revocationType = revocation.type
        self.revocationPercentage = revocation.percentage
        self.notificationType = notificationType
        self.notificationUUID = notificationUUID
    }
}
