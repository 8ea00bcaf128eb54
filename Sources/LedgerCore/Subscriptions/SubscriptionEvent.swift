import Foundation

/// The event types of a subscription's stream (`subscription-<originalTransactionId>`).
public enum SubscriptionEventType: String, Codable, Sendable, CaseIterable {
    /// The subscription became known: the purchase that started it arrived.
    case started = "subscription-started"
    /// One billed period (its `webOrderLineItemId`): the start, a renewal, a billing recovery, a
    /// restore, an upgrade or crossgrade, a resubscribe, an offer.
    case period = "subscription-period"
    /// What Apple said of the subscription's renewal: a lifecycle notification, or a status read
    /// from Apple's Get All Subscription Statuses.
    case renewalChanged = "subscription-renewal-changed"
    /// Apple refunded or revoked one period.
    case periodRefunded = "subscription-period-refunded"
    /// Apple reversed the refund of one period.
    case periodRefundReversed = "subscription-period-refund-reversed"
    /// A family member's shared access to the subscription ended (`FAMILY_REVOKE`).
    case familyShareRevoked = "subscription-family-share-revoked"
    /// The subscription's user became known after it started without one (Apple's notification
    /// came before the client's upload): the user its start is now held for.
    case userRecorded = "subscription-user-recorded"
}

/// One event of a subscription's stream with its typed body.
public enum SubscriptionEvent: Sendable, Equatable {
    case started(SubscriptionStarted)
    case period(SubscriptionPeriodRecorded)
    case renewalChanged(SubscriptionRenewalChanged)
    case periodRefunded(SubscriptionPeriodRefunded)
    case periodRefundReversed(SubscriptionPeriodRefundReversed)
    case familyShareRevoked(SubscriptionFamilyShareRevoked)
    case userRecorded(SubscriptionUserRecorded)

    public var type: SubscriptionEventType {
        switch self {
        case .started: .started
        case .period: .period
        case .renewalChanged: .renewalChanged
        case .periodRefunded: .periodRefunded
        case .periodRefundReversed: .periodRefundReversed
        case .familyShareRevoked: .familyShareRevoked
        case .userRecorded: .userRecorded
        }
    }

    /// The event of `type` whose body `body` reads.
    public init(type: SubscriptionEventType, body: some EventBodyReader) throws {
        switch type {
        case .started: self = .started(try body.read(SubscriptionStarted.self))
        case .period: self = .period(try body.read(SubscriptionPeriodRecorded.self))
        case .renewalChanged: self = .renewalChanged(try body.read(SubscriptionRenewalChanged.self))
        case .periodRefunded: self = .periodRefunded(try body.read(SubscriptionPeriodRefunded.self))
        case .periodRefundReversed: self = .periodRefundReversed(try body.read(SubscriptionPeriodRefundReversed.self))
        case .familyShareRevoked: self = .familyShareRevoked(try body.read(SubscriptionFamilyShareRevoked.self))
        case .userRecorded: self = .userRecorded(try body.read(SubscriptionUserRecorded.self))
        }
    }
}

extension SubscriptionEvent: Encodable {
    /// The body alone (the type is stored beside it).
    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .started(let body): try body.encode(to: encoder)
        case .period(let body): try body.encode(to: encoder)
        case .renewalChanged(let body): try body.encode(to: encoder)
        case .periodRefunded(let body): try body.encode(to: encoder)
        case .periodRefundReversed(let body): try body.encode(to: encoder)
        case .familyShareRevoked(let body): try body.encode(to: encoder)
        case .userRecorded(let body): try body.encode(to: encoder)
        }
    }
}

/// `subscription-started`: the transaction that started it (the one whose `transactionId` is the
/// subscription's `originalTransactionId`), or for a family member's subscription the member's
/// first shared transaction, and whose subscription it is.
public struct SubscriptionStarted: Codable, Sendable, Equatable {
    public var originalTransactionId: String
    public var transaction: AppleTransaction
    /// The customer: the claiming user, the order's, or the Apple account's linked user.
    public var userId: UserID?
    /// A family member's access to another's subscription: never revenue, never an order's.
    public var familyShared: Bool

    public init(originalTransactionId: String, transaction: AppleTransaction, userId: UserID?, familyShared: Bool) {
        self.originalTransactionId = originalTransactionId
        self.transaction = transaction
        self.userId = userId
        self.familyShared = familyShared
    }
}

/// How a period was billed, as the reports count it.
public enum SubscriptionPeriodKind: String, Codable, Sendable, CaseIterable {
    /// The first period: the purchase that started the subscription (its order's revenue).
    case start = "subscription-start"
    /// Every later period.
    case renewal = "subscription-renewal"
}

/// `subscription-period`: one billed period, recorded once per `webOrderLineItemId` (its event id
/// is named after it) however it arrives: a client's upload, a notification, a history sweep.
public struct SubscriptionPeriodRecorded: Codable, Sendable, Equatable {
    public var transaction: AppleTransaction
    public var kind: SubscriptionPeriodKind

    public init(transaction: AppleTransaction, kind: SubscriptionPeriodKind) {
        self.transaction = transaction
        self.kind = kind
    }

    /// The period's key: Apple's `webOrderLineItemId`, else the transaction's id.
    public var periodKey: String { transaction.webOrderLineItemId ?? transaction.transactionId.rawValue }
}

/// What Apple's signed renewal info (`JWSRenewalInfoDecodedPayload`) says, the fields the ledger
/// keeps.
public struct RenewalInfo: Codable, Sendable, Equatable {
    /// `autoRenewStatus`: true when the subscription renews at the end of its period.
    public var autoRenew: Bool?
    public var autoRenewProductId: String?
    public var productId: String?
    /// `expirationIntent`: why it expired (1 cancelled, 2 billing error, 3 price increase refused,
    /// 4 product not for sale, 5 other).
    public var expirationIntent: Int?
    public var gracePeriodExpiresDate: Date?
    public var isInBillingRetryPeriod: Bool?
    public var priceIncreaseStatus: Int?
    public var renewalDate: Date?
    public var signedDate: Date?

    public init(
        autoRenew: Bool? = nil, autoRenewProductId: String? = nil, productId: String? = nil, expirationIntent: Int? = nil,
        gracePeriodExpiresDate: Date? = nil, isInBillingRetryPeriod: Bool? = nil, priceIncreaseStatus: Int? = nil,
        renewalDate: Date? = nil, signedDate: Date? = nil
    ) {
        self.autoRenew = autoRenew
        self.autoRenewProductId = autoRenewProductId
        self.productId = productId
        self.expirationIntent = expirationIntent
        self.gracePeriodExpiresDate = gracePeriodExpiresDate
        self.isInBillingRetryPeriod = isInBillingRetryPeriod
        self.priceIncreaseStatus = priceIncreaseStatus
        self.renewalDate = renewalDate
        self.signedDate = signedDate
    }
}

/// `subscription-renewal-changed`: a lifecycle notification about the subscription
/// (`DID_CHANGE_RENEWAL_STATUS`, `DID_FAIL_TO_RENEW`, `EXPIRED`, …; its UUID is the event's id, so
/// it is applied once), or Apple's status read by a catch-up (no notification).
public struct SubscriptionRenewalChanged: Codable, Sendable, Equatable {
    /// The notification, absent for a status read from Apple.
    public var notification: NotificationReceived?
    /// Apple's `status` from Get All Subscription Statuses (1 active … 5 revoked), for a status read.
    public var appleStatus: Int?
    /// The signed renewal info it carried, verified.
    public var renewalInfo: RenewalInfo?
    /// The period's end as the signed transaction now says (`RENEWAL_EXTENDED` moves it); none
    /// for a transaction Apple marks upgraded, whose period no longer counts.
    public var expiresDate: Date?
    /// The purchase date of the transaction it is about: about a period older than the latest one
    /// recorded (an upgrade replaced it, a renewal followed it), it changes nothing. Absent in
    /// events stored before the ledger kept it.
    public var purchaseDate: Date?

    public init(
        notification: NotificationReceived?, appleStatus: Int? = nil, renewalInfo: RenewalInfo?, expiresDate: Date?, purchaseDate: Date? = nil
    ) {
        self.notification = notification
        self.appleStatus = appleStatus
        self.renewalInfo = renewalInfo
        self.expiresDate = expiresDate
        self.purchaseDate = purchaseDate
    }
}

/// `subscription-period-refunded`: Apple refunded or revoked one period (`REFUND`, `REVOKE`, or
/// the refund catch-up); only that period's money goes back.
public struct SubscriptionPeriodRefunded: Codable, Sendable, Equatable {
    public var transactionId: TransactionID
    public var periodKey: String
    public var revocationDate: Date
    public var revocationReason: Int?
    public var revocationType: RevocationType?
    public var revocationPercentage: Int?
    public var notificationType: String?
    public var notificationUUID: UUID?

    public init(transactionId: TransactionID, periodKey: String, revocation: Revocation, notificationType: String?, notificationUUID: UUID?) {
        self.transactionId = transactionId
        self.periodKey = periodKey
        self.revocationDate = revocation.date
        self.revocationReason = revocation.reason
        self.revocationType = revocation.type
        self.revocationPercentage = revocation.percentage
        self.notificationType = notificationType
        self.notificationUUID = notificationUUID
    }
}

extension SubscriptionPeriodRefunded {
    /// The refund of period `periodKey` that `notifications` leave standing: those recorded on the
    /// stream of its transaction `transactionId` (`REFUND`, `REVOKE`, `REFUND_REVERSED`, in the
    /// log's order) while it waited for its subscription's start. The last refund not reversed
    /// after it (nor before it arrived, `reversedBefore`), with the notification that said it
    /// (whose UUID names the event); nil when none stands. A refund recorded before the ledger
    /// kept Apple's revocation with it is dated by its notification.
    public static func standing(
        after notifications: [NotificationReceived], transactionId: TransactionID, periodKey: String
    ) -> (refund: SubscriptionPeriodRefunded, notification: UUID)? {
        var standing: NotificationReceived?
        for notification in notifications {
            if notification.takesBack {
                standing = notification
            } else if notification.notificationType == "REFUND_REVERSED" {
                standing = nil
            }
        }
        guard let told = standing else { return nil }
        let refund = told.refund
        let revocation = Revocation(
            date: refund?.revocationDate ?? told.signedDate, reason: refund?.revocationReason, type: refund?.revocationType,
            percentage: refund?.revocationPercentage)
        // Read in Apple's refund history, no notification said it (as `Refunded` records it).
        let notified = refund.map { $0.notificationType != nil } ?? true
        return (SubscriptionPeriodRefunded(
            transactionId: transactionId, periodKey: periodKey, revocation: revocation,
            notificationType: notified ? told.notificationType : nil, notificationUUID: notified ? told.notificationUUID : nil),
                told.notificationUUID)
    }
}

/// `subscription-period-refund-reversed`: Apple reversed a period's refund (`REFUND_REVERSED`).
public struct SubscriptionPeriodRefundReversed: Codable, Sendable, Equatable {
    public var transactionId: TransactionID
    public var periodKey: String
    public var notificationUUID: UUID?
    /// When Apple signed the `REFUND_REVERSED` (absent before it was kept): a refund revoked
    /// before it that arrives later refunds nothing.
    public var signedDate: Date?

    public init(transactionId: TransactionID, periodKey: String, notificationUUID: UUID?, signedDate: Date? = nil) {
        self.transactionId = transactionId
        self.periodKey = periodKey
        self.notificationUUID = notificationUUID
        self.signedDate = signedDate
    }
}

/// `subscription-family-share-revoked`: the family member's access ended; nobody is refunded.
public struct SubscriptionFamilyShareRevoked: Codable, Sendable, Equatable {
    public var transactionId: TransactionID
    public var revocationDate: Date
    public var notificationUUID: UUID?

    public init(transactionId: TransactionID, revocationDate: Date, notificationUUID: UUID?) {
        self.transactionId = transactionId
        self.revocationDate = revocationDate
        self.notificationUUID = notificationUUID
    }
}

/// `subscription-user-recorded`: whose subscription it is from now on: learnt after it started
/// without a user (a `SUBSCRIBED` notification before the client's upload), the user of the order
/// that took its start (`orderId`), or the one its start's pool entry, or a family member's share,
/// was resolved to; changed when its start pays another user's order, or no order any more.
public struct SubscriptionUserRecorded: Codable, Sendable, Equatable {
    /// The subscription's user from now on; nil: none (the pairing of its start with an order
    /// was undone, and the start waits in the pool for no one, or for support).
    public var userId: UserID?
    /// The transaction that made the user known: the start, or the member's shared transaction.
    public var transactionId: TransactionID
    public var orderId: OrderID?

    public init(userId: UserID?, transactionId: TransactionID, orderId: OrderID?) {
        self.userId = userId
        self.transactionId = transactionId
        self.orderId = orderId
    }
}
