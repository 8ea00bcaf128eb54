import Foundation

/// A subscription as its stream leaves it: a row of the `subscriptions` projection, with its
/// billed periods (`subscription_periods`). Its status is not stored: `status(at:)` computes it
/// from these facts and the time asked, so a missed `EXPIRED` never keeps it active past its
/// expiry and grace.
public struct Subscription: Sendable, Equatable {
    public var originalTransactionId: String
    public var bundleId: BundleID?
    public var environment: String
    public var userId: UserID?
    /// The product of the latest period (an upgrade or crossgrade changes it).
    public var productId: ProductID
    public var subscriptionGroup: String?
    public var familyShared: Bool
    public var startedAt: Date
    /// The end of the latest billed period (or as `RENEWAL_EXTENDED` moved it).
    public var expiresAt: Date?
    public var autoRenew: Bool?
    public var autoRenewProductId: String?
    public var expirationIntent: Int?
    public var gracePeriodExpiresAt: Date?
    public var inBillingRetry: Bool
    /// Apple said `EXPIRED`: no grace or retry keeps it, until a new period arrives.
    public var expired: Bool
    /// Refunded or revoked (its latest period), or a family member's share ended.
    public var revokedAt: Date?
    /// When Apple signed the renewal info `autoRenew` and the other renewal fields come from.
    public var renewalSignedAt: Date?
    public var version: Int64
    public var updatedAt: Date
    public var periods: [Period]

    public init(
        originalTransactionId: String, bundleId: BundleID?, environment: String, userId: UserID?, productId: ProductID,
        subscriptionGroup: String?, familyShared: Bool, startedAt: Date, expiresAt: Date?, autoRenew: Bool?,
        autoRenewProductId: String?, expirationIntent: Int?, gracePeriodExpiresAt: Date?, inBillingRetry: Bool, expired: Bool,
        revokedAt: Date?, renewalSignedAt: Date? = nil, version: Int64, updatedAt: Date, periods: [Period]
    ) {
        self.originalTransactionId = originalTransactionId
        self.bundleId = bundleId
        self.environment = environment
        self.userId = userId
        self.productId = productId
        self.subscriptionGroup = subscriptionGroup
        self.familyShared = familyShared
        self.startedAt = startedAt
        self.expiresAt = expiresAt
        self.autoRenew = autoRenew
        self.autoRenewProductId = autoRenewProductId
        self.expirationIntent = expirationIntent
        self.gracePeriodExpiresAt = gracePeriodExpiresAt
        self.inBillingRetry = inBillingRetry
        self.expired = expired
        self.revokedAt = revokedAt
        self.renewalSignedAt = renewalSignedAt
        self.version = version
        self.updatedAt = updatedAt
        self.periods = periods
    }

    /// One billed period.
    public struct Period: Sendable, Equatable {
        public var periodKey: String
        public var transactionId: TransactionID
        public var kind: SubscriptionPeriodKind
        public var productId: ProductID
        public var purchaseDate: Date
        public var expiresAt: Date?
        public var price: String?
        public var currency: String?
        public var refundedAt: Date?
        /// Thousandths of a percent refunded (nil with `refundedAt`: all of it).
        public var refundPercentage: Int?

        public init(
            periodKey: String, transactionId: TransactionID, kind: SubscriptionPeriodKind, productId: ProductID, purchaseDate: Date,
            expiresAt: Date?, price: String?, currency: String?, refundedAt: Date? = nil, refundPercentage: Int? = nil
        ) {
            self.periodKey = periodKey
            self.transactionId = transactionId
            self.kind = kind
            self.productId = productId
            self.purchaseDate = purchaseDate
            self.expiresAt = expiresAt
            self.price = price
            self.currency = currency
            self.refundedAt = refundedAt
            self.refundPercentage = refundPercentage
        }
    }

    /// Where a subscription stands at a time.
    public enum Status: String, Codable, Sendable, CaseIterable {
        case active
        case gracePeriod = "grace-period"
        case billingRetry = "billing-retry"
        case expired
        case revoked
    }

    /// How long Apple keeps retrying a renewal that failed to bill: 60 days after the period's
    /// end (or until the customer fixes the billing or cancels), then `EXPIRED` (`BILLING_RETRY`).
    public static let billingRetryLimit: TimeInterval = 60 * 86_400

    /// The status at `now`, from the facts alone. A retry Apple never said ended (its `EXPIRED`
    /// lost) ends with Apple's 60 days.
    public func status(at now: Date) -> Status {
        if revokedAt != nil { return .revoked }
        if let expiresAt, now < expiresAt, !expired { return .active }
        if !expired, let grace = gracePeriodExpiresAt, now < grace { return .gracePeriod }
        if !expired, inBillingRetry, let expiresAt, now < expiresAt.addingTimeInterval(Self.billingRetryLimit) { return .billingRetry }
        return .expired
    }

    /// What `event` (version `version` of the stream, recorded at `date`) makes of the
    /// subscription (nil: not started). The only statement of these rules: the writer applies them
    /// to the row it read, `projections rebuild` to the rows it folds. An event before
    /// `subscription-started` changes nothing.
    public static func evolve(_ subscription: Subscription?, _ event: SubscriptionEvent, version: Int64, at date: Date) -> Subscription? {
        if case .started(let body) = event {
            guard subscription == nil else { return subscription }
            let t = body.transaction
            return Subscription(
                originalTransactionId: body.originalTransactionId, bundleId: BundleID(unchecked: t.bundleId), environment: t.environment,
                userId: body.userId, productId: t.productId, subscriptionGroup: t.subscriptionGroupIdentifier,
                familyShared: body.familyShared, startedAt: t.purchaseDate, expiresAt: nil, autoRenew: nil, autoRenewProductId: nil,
                expirationIntent: nil, gracePeriodExpiresAt: nil, inBillingRetry: false, expired: false, revokedAt: nil,
                version: version, updatedAt: date, periods: [])
        }
        guard var next = subscription else { return nil }
        next.version = version
        next.updatedAt = date
        switch event {
        case .started:
            return subscription
        case .period(let body):
            let t = body.transaction
            let key = body.periodKey
            guard !next.periods.contains(where: { $0.periodKey == key }) else { return next }
            let latest = next.periods.map(\.purchaseDate).max()
            next.periods.append(Period(
                periodKey: key, transactionId: t.transactionId, kind: body.kind, productId: t.productId, purchaseDate: t.purchaseDate,
                expiresAt: t.expiresDate, price: t.price, currency: t.currency))
            // The latest period Apple signed, by purchase date, not by end: an upgrade to a product
            // of a shorter period ends earlier than the period it replaced, and is the one that
            // counts from then on. A period Apple marks upgraded never decides.
            if let end = t.periodEnd, latest.map({ Self.ms(t.purchaseDate) >= Self.ms($0) }) ?? true {
                // The latest period: it decides the product, and a paid period ends any retry.
                next.expiresAt = end
                next.productId = t.productId
                next.inBillingRetry = false
                next.gracePeriodExpiresAt = nil
                next.expired = false
                // A revocation that was no period's refund (a family member's share revoked,
                // Apple's status 5) stands against a period bought before it that arrived late;
                // a refund's revocation ends with the later period that replaces the refunded one.
                if let revoked = next.revokedAt, Self.ms(t.purchaseDate) < Self.ms(revoked),
                   !next.periods.contains(where: { $0.refundedAt.map { Self.ms($0) == Self.ms(revoked) } ?? false }) {
                } else {
                    next.revokedAt = nil
                }
                // Apple's reason for an expiry: none while a paid period runs.
                next.expirationIntent = nil
            }
        case .renewalChanged(let body):
            // When Apple signed what this says of renewal, against what the ledger held before it.
            let signed = body.renewalInfo?.signedDate
            let fresh = signed != nil && !Self.isOlder(signed, than: subscription?.renewalSignedAt)
            if let purchased = body.purchaseDate, let latest = next.periods.map(\.purchaseDate).max(), Self.ms(purchased) < Self.ms(latest) {
                // About a period a later one replaced (an upgrade to a shorter period ends before
                // the period it replaced, so its end alone cannot tell): older news, nothing changes.
                return next
            }
            if let end = body.expiresDate, let known = next.expiresAt, Self.ms(end) < Self.ms(known) {
                // About an earlier period than the latest one recorded (Apple's notifications may
                // arrive out of order): what it says of renewal is older than what that period
                // brought, so it changes nothing but the version.
                return next
            }
            if let end = body.expiresDate, next.expiresAt.map({ Self.ms(end) > Self.ms($0) }) ?? true {
                // A later end (a renewal whose period is not recorded, RENEWAL_EXTENDED): service
                // goes on, as a new period's would.
                next.expiresAt = end
                next.inBillingRetry = false
                next.gracePeriodExpiresAt = nil
                next.expired = false
            }
            // Renewal info Apple signed before the one held (a notification that arrived late)
            // is older news: the renewal fields stay.
            if let info = body.renewalInfo, !Self.isOlder(info.signedDate, than: next.renewalSignedAt) {
                next.renewalSignedAt = info.signedDate ?? next.renewalSignedAt
                next.autoRenew = info.autoRenew ?? next.autoRenew
                next.autoRenewProductId = info.autoRenewProductId ?? next.autoRenewProductId
                // Apple's renewal info carries `expirationIntent` only once the subscription expired:
                // fresher info without it (a resubscribe, a billing recovery) clears it.
                next.expirationIntent = info.expirationIntent
                next.gracePeriodExpiresAt = info.gracePeriodExpiresDate
                // Apple's EXPIRED ended billing retry: renewal info saying otherwise starts none.
                next.inBillingRetry = !next.expired && (info.isInBillingRetryPeriod ?? next.inBillingRetry)
            }
            switch body.notification?.notificationType {
            case "DID_FAIL_TO_RENEW":
                // Apple retries billing until it says EXPIRED: a failure signed before the
                // renewal news held (arriving after that EXPIRED, say) starts no retry.
                if !next.expired, body.renewalInfo.map({ !Self.isOlder($0.signedDate, than: subscription?.renewalSignedAt) }) ?? true {
                    next.inBillingRetry = true
                }
            case "GRACE_PERIOD_EXPIRED":
                next.gracePeriodExpiresAt = nil
            case "EXPIRED":
                next.expired = true
                next.inBillingRetry = false
                next.gracePeriodExpiresAt = nil
            case "DID_CHANGE_RENEWAL_STATUS":
                if body.renewalInfo?.autoRenew == nil, let subtype = body.notification?.subtype {
                    next.autoRenew = subtype == "AUTO_RENEW_ENABLED" ? true : subtype == "AUTO_RENEW_DISABLED" ? false : next.autoRenew
                }
            default:
                break
            }
            switch body.appleStatus {
            case 1 where fresh:
                // Active, as Apple signed it after the renewal news the ledger held: a revocation
                // before that signature, without a refund of the latest period (Apple's status 5
                // read before), no longer stands, nor an expiry.
                if let signed, let revoked = next.revokedAt, Self.ms(signed) > Self.ms(revoked),
                   !next.periods.indices.contains(where: { next.isLatest($0) && next.periods[$0].refundedAt != nil }) {
                    next.revokedAt = nil
                }
                next.expired = false
            case 2: next.expired = true
            case 5: next.revokedAt = next.revokedAt ?? date
            default: break
            }
        case .periodRefunded(let body):
            guard let index = next.periods.firstIndex(where: { $0.periodKey == body.periodKey }) else { return next }
            next.periods[index].refundedAt = body.revocationDate
            next.periods[index].refundPercentage = body.revocationType == .refundProrated ? body.revocationPercentage : nil
            // Refunding the period that pays for now ends the service; an earlier one's refund
            // takes that period's money back only.
            if next.isLatest(index) { next.revokedAt = body.revocationDate }
        case .periodRefundReversed(let body):
            guard let index = next.periods.firstIndex(where: { $0.periodKey == body.periodKey }) else { return next }
            next.periods[index].refundedAt = nil
            next.periods[index].refundPercentage = nil
            if next.isLatest(index) { next.revokedAt = nil }
        case .familyShareRevoked(let body):
            next.revokedAt = body.revocationDate
        case .userRecorded(let body):
            next.userId = body.userId
        }
        return next
    }

    /// Whether renewal info signed at `signed` is older than that signed at `held`, to Apple's
    /// millisecond (`held` is read back from PostgreSQL's microseconds); unknown times are never older.
    static func isOlder(_ signed: Date?, than held: Date?) -> Bool {
        guard let signed, let held else { return false }
        return ms(signed) < ms(held)
    }

    /// `date` to Apple's whole millisecond: Apple signs milliseconds, which a `Date` holds as a
    /// binary fraction and PostgreSQL gives back as microseconds, so two readings of one time
    /// may differ below it. Apple's times are compared in these.
    static func ms(_ date: Date) -> Double { (date.timeIntervalSince1970 * 1000).rounded() }

    /// Whether period `index` is the latest one bought (by purchase date, as `evolve` lets it
    /// decide the product and end): the one paying for the subscription's current term, even when
    /// `RENEWAL_EXTENDED` moved its end past the period's own, or when it is an upgrade that ends
    /// before the period it replaced. A period with no end (a start known from its order alone)
    /// pays for no term of its own.
    func isLatest(_ index: Int) -> Bool {
        guard periods[index].expiresAt != nil else { return false }
        let bought = periods[index].purchaseDate
        return !periods.contains { $0.expiresAt != nil && Self.ms($0.purchaseDate) > Self.ms(bought) }
    }
}
