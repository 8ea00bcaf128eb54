import Foundation
import LedgerCore
import LedgerStore

/// A subscription as the API shows it: its facts, its status at the time of the request, the
/// order that bought it, and (for `GET /v1/subscriptions/{originalTransactionId}`) its periods.
struct SubscriptionResponse: Encodable, Sendable {
    let subscription: Subscription
    let orderId: OrderID?
    let status: Subscription.Status
    let withPeriods: Bool

    init(_ subscription: Subscription, orderId: OrderID?, at now: Date, withPeriods: Bool = false) {
        self.subscription = subscription
        self.orderId = orderId
        self.status = subscription.status(at: now)
        self.withPeriods = withPeriods
    }

    enum CodingKeys: String, CodingKey {
        case originalTransactionId, userId, productId, bundleId, environment, subscriptionGroup, status, familyShared, startedAt
        case expiresDate, autoRenew, autoRenewProductId, gracePeriodExpiresDate, inBillingRetry, expirationIntent, revokedAt, orderId
        case updatedAt, periods
    }

    func encode(to encoder: any Encoder) throws {
        let s = subscription
        var json = encoder.container(keyedBy: CodingKeys.self)
        try json.encode(s.originalTransactionId, forKey: .originalTransactionId)
        try json.encode(s.userId, forKey: .userId)
        try json.encode(s.productId, forKey: .productId)
        try json.encode(s.bundleId, forKey: .bundleId)
        try json.encode(s.environment, forKey: .environment)
        try json.encode(s.subscriptionGroup, forKey: .subscriptionGroup)
        try json.encode(status.rawValue, forKey: .status)
        try json.encode(s.familyShared, forKey: .familyShared)
        try json.encode(s.startedAt, forKey: .startedAt)
        try json.encode(s.expiresAt, forKey: .expiresDate)
        try json.encode(s.autoRenew, forKey: .autoRenew)
        try json.encode(s.autoRenewProductId, forKey: .autoRenewProductId)
        try json.encode(s.gracePeriodExpiresAt, forKey: .gracePeriodExpiresDate)
        try json.encode(s.inBillingRetry, forKey: .inBillingRetry)
        try json.encode(s.expirationIntent, forKey: .expirationIntent)
        try json.encode(s.revokedAt, forKey: .revokedAt)
        try json.encode(orderId, forKey: .orderId)
        try json.encode(s.updatedAt, forKey: .updatedAt)
        if withPeriods { try json.encode(s.periods.map(PeriodResponse.init), forKey: .periods) }
    }

    /// One billed period of the subscription's history.
    struct PeriodResponse: Encodable {
        let period: Subscription.Period

        init(_ period: Subscription.Period) { self.period = period }

        enum CodingKeys: String, CodingKey {
            case periodKey, transactionId, kind, productId, purchaseDate, expiresDate, price, currency, refundedAt, refundPercentage
        }

        func encode(to encoder: any Encoder) throws {
            var json = encoder.container(keyedBy: CodingKeys.self)
            try json.encode(period.periodKey, forKey: .periodKey)
            try json.encode(period.transactionId, forKey: .transactionId)
            try json.encode(period.kind.rawValue, forKey: .kind)
            try json.encode(period.productId, forKey: .productId)
            try json.encode(period.purchaseDate, forKey: .purchaseDate)
            try json.encode(period.expiresAt, forKey: .expiresDate)
            try json.encode(period.price, forKey: .price)
            try json.encode(period.currency, forKey: .currency)
            try json.encode(period.refundedAt, forKey: .refundedAt)
            try json.encode(period.refundPercentage, forKey: .refundPercentage)
        }
    }
}

/// `GET /v1/users/{userId}/subscriptions`: the user's subscriptions, own and family-shared, newest first.
struct SubscriptionList: Encodable, Sendable {
    let userId: UserID
    let subscriptions: [SubscriptionResponse]
}

/// `GET /v1/users/{userId}/entitlements`: what the user may use now.
struct EntitlementList: Encodable, Sendable {
    let userId: UserID
    /// Those of the user's subscriptions that are active or in their grace period.
    let subscriptions: [SubscriptionResponse]
    let nonConsumables: [NonConsumableResponse]
}

/// A non-consumable the user holds, bought or shared with them.
struct NonConsumableResponse: Encodable, Sendable {
    let held: EntitlementStore.NonConsumable

    init(_ held: EntitlementStore.NonConsumable) { self.held = held }

    enum CodingKeys: String, CodingKey { case productId, bundleId, source, orderId, transactionId, purchaseDate, environment }

    func encode(to encoder: any Encoder) throws {
        var json = encoder.container(keyedBy: CodingKeys.self)
        try json.encode(held.productId, forKey: .productId)
        try json.encode(held.bundleId, forKey: .bundleId)
        try json.encode(held.source.rawValue, forKey: .source)
        try json.encode(held.orderId, forKey: .orderId)
        try json.encode(held.transactionId, forKey: .transactionId)
        try json.encode(held.purchaseDate, forKey: .purchaseDate)
        try json.encode(held.environment, forKey: .environment)
    }
}
