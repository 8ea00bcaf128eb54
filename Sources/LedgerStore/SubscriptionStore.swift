import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// The subscriptions projection (`subscriptions`, `subscription_periods`): each subscription as
/// its stream leaves it (`Subscription.evolve`), written in the transaction that appends the
/// stream's events, under the stream's lock.
public struct SubscriptionStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// The subscription whose `originalTransactionId` is `id`, with its periods, as the caller's
    /// transaction sees it (the caller holds the stream's lock).
    public func subscription(_ id: String, in transaction: DatabaseTransaction) async throws -> Subscription? {
        let rows = try await transaction.connection.guardedQuery(
            "SELECT \(unescaped: Self.columns) FROM subscriptions WHERE original_transaction_id = \(id)", logger: database.logger)
        guard var subscription = try await Self.decode(rows).first else { return nil }
        subscription.periods = try await Self.decodePeriods(transaction.connection.guardedQuery(
            "SELECT \(unescaped: Self.periodColumns) FROM subscription_periods WHERE original_transaction_id = \(id) ORDER BY purchase_date, period_key",
            logger: database.logger))
        return subscription
    }

    /// The subscription `id` with its periods, outside any transaction.
    public func subscription(_ id: String) async throws -> Subscription? {
        try await database.transaction { tx in try await subscription(id, in: tx) }
    }

    /// A user's subscriptions, own and family-shared, newest first; with `apps`, those of these
    /// apps alone. Periods are not read.
    public func subscriptions(of user: UserID, apps: [BundleID]? = nil) async throws -> [Subscription] {
        let apps = apps?.map(\.rawValue)
        let rows = try await database.query(
            """
            SELECT \(unescaped: Self.columns) FROM subscriptions
             WHERE user_id = \(user.rawValue) AND (\(apps)::text[] IS NULL OR bundle_id = ANY(\(apps)::text[]))
             ORDER BY started_at DESC, original_transaction_id
            """)
        return try await Self.decode(rows)
    }

    /// Writes `subscription` (as `Subscription.evolve` left it) and those of its periods that are
    /// new or changed since `before`, in the caller's transaction.
    public func write(_ subscription: Subscription, since before: Subscription?, in transaction: DatabaseTransaction) async throws {
        let s = subscription
        // Times rounded as the rebuild's COPY stores them (`PostgresTime.Bound`), so that a rebuilt row equals this one.
        let t = PostgresTime.bound
        try await transaction.connection.guardedQuery(
            """
            INSERT INTO subscriptions (original_transaction_id, bundle_id, environment, user_id, product_id, subscription_group,
                                       family_shared, started_at, expires_at, auto_renew, auto_renew_product_id, expiration_intent,
                                       grace_period_expires_at, in_billing_retry, expired, revoked_at, version, updated_at)
            VALUES (\(s.originalTransactionId), \(s.bundleId?.rawValue), \(s.environment), \(s.userId?.rawValue), \(s.productId.rawValue),
                    \(s.subscriptionGroup), \(s.familyShared), \(t(s.startedAt)), \(t(s.expiresAt)), \(s.autoRenew), \(s.autoRenewProductId),
                    \(s.expirationIntent), \(t(s.gracePeriodExpiresAt)), \(s.inBillingRetry), \(s.expired), \(t(s.revokedAt)), \(s.version),
                    \(t(s.updatedAt)))
            ON CONFLICT (original_transaction_id) DO UPDATE SET
                bundle_id = EXCLUDED.bundle_id, environment = EXCLUDED.environment, user_id = EXCLUDED.user_id,
                product_id = EXCLUDED.product_id, subscription_group = EXCLUDED.subscription_group,
                family_shared = EXCLUDED.family_shared, started_at = EXCLUDED.started_at, expires_at = EXCLUDED.expires_at,
                auto_renew = EXCLUDED.auto_renew, auto_renew_product_id = EXCLUDED.auto_renew_product_id,
                expiration_intent = EXCLUDED.expiration_intent, grace_period_expires_at = EXCLUDED.grace_period_expires_at,
                in_billing_retry = EXCLUDED.in_billing_retry, expired = EXCLUDED.expired, revoked_at = EXCLUDED.revoked_at,
                version = EXCLUDED.version, updated_at = EXCLUDED.updated_at
            """, logger: database.logger)
        let known = before?.periods ?? []
        for p in s.periods where !known.contains(p) {
            try await transaction.connection.guardedQuery(
                """
                INSERT INTO subscription_periods (original_transaction_id, period_key, transaction_id, kind, product_id, purchase_date,
                                                  expires_at, price, currency, refunded_at, refund_percentage)
                VALUES (\(s.originalTransactionId), \(p.periodKey), \(p.transactionId.rawValue), \(p.kind.rawValue), \(p.productId.rawValue),
                        \(t(p.purchaseDate)), \(t(p.expiresAt)), \(p.price)::numeric, \(p.currency), \(t(p.refundedAt)), \(p.refundPercentage))
                ON CONFLICT (original_transaction_id, period_key) DO UPDATE SET
                    refunded_at = EXCLUDED.refunded_at, refund_percentage = EXCLUDED.refund_percentage
                """, logger: database.logger)
        }
    }

    static let columns = """
        original_transaction_id, bundle_id, environment, user_id, product_id, subscription_group, family_shared, started_at, \
        expires_at, auto_renew, auto_renew_product_id, expiration_intent, grace_period_expires_at, in_billing_retry, expired, \
        revoked_at, version, updated_at
        """
    static let periodColumns = """
        period_key, transaction_id, kind, product_id, purchase_date, expires_at, price::text, currency, refunded_at, refund_percentage
        """

    static func decode(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [Subscription] {
        var subscriptions: [Subscription] = []
        for try await row in rows {
            let r = row.makeRandomAccess()
            subscriptions.append(Subscription(
                originalTransactionId: try r[0].decode(String.self), bundleId: try r[1].decode(String?.self).map(BundleID.init(unchecked:)),
                environment: try r[2].decode(String.self), userId: try r[3].decode(String?.self).map(UserID.init(unchecked:)),
                productId: ProductID(unchecked: try r[4].decode(String.self)), subscriptionGroup: try r[5].decode(String?.self),
                familyShared: try r[6].decode(Bool.self), startedAt: try r[7].decode(Date.self), expiresAt: try r[8].decode(Date?.self),
                autoRenew: try r[9].decode(Bool?.self), autoRenewProductId: try r[10].decode(String?.self),
                expirationIntent: try r[11].decode(Int?.self), gracePeriodExpiresAt: try r[12].decode(Date?.self),
                inBillingRetry: try r[13].decode(Bool.self), expired: try r[14].decode(Bool.self), revokedAt: try r[15].decode(Date?.self),
                version: try r[16].decode(Int64.self), updatedAt: try r[17].decode(Date.self), periods: []))
        }
        return subscriptions
    }

    static func decodePeriods(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [Subscription.Period] {
        var periods: [Subscription.Period] = []
        for try await (key, id, kind, product, purchased, expires, price, currency, refunded, percentage)
            in rows.decode((String, String, String, String, Date, Date?, String?, String?, Date?, Int?).self) {
            periods.append(Subscription.Period(
                periodKey: key, transactionId: TransactionID(unchecked: id), kind: SubscriptionPeriodKind(rawValue: kind) ?? .renewal,
                productId: ProductID(unchecked: product), purchaseDate: purchased, expiresAt: expires, price: price, currency: currency,
                refundedAt: refunded, refundPercentage: percentage))
        }
        return periods
    }
}
