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

    /// The subscriptions of `ids` the ledger holds, as the caller's transaction sees them (the
    /// caller holds their streams' locks), each with those of its periods whose key is the one
    /// given beside its id (the one a renewal would add) and its latest period by purchase date
    /// (which `Subscription.evolve` weighs a new period against): one round trip for many (the
    /// renewal groups' writer waits for each).
    public func subscriptions(_ ids: [String], periodKeys: [String], in transaction: DatabaseTransaction) async throws -> [String: Subscription] {
        guard !ids.isEmpty else { return [:] }
        let rows = try await transaction.connection.atomicallyGuardedExecute(
            GroupRead(ids: ids, periodKeys: periodKeys), logger: database.logger)
        var found: [String: Subscription] = [:]
        for row in rows {
            let r = row.makeRandomAccess()
            let subscription = try Self.subscription(r)
            let period = try r[Self.columnCount].decode(String?.self) == nil ? nil : try Self.period(r, at: Self.columnCount)
            found[subscription.originalTransactionId, default: subscription].periods += period.map { [$0] } ?? []
        }
        return found
    }

    /// `subscriptions(_:periodKeys:in:)`'s read, prepared once per connection: planned each time,
    /// it took longer to plan than to run (0.7 ms against 0.3 for a group of 14).
    struct GroupRead: PostgresPreparedStatement {
        static let name = "ledger_subscriptions_for_renewals"
        static let sql = """
            SELECT \(subscriptionColumns), \(subscriptionPeriodColumns)
              FROM unnest($1::text[], $2::text[]) AS k(wanted_id, wanted_key)
              -- Each row looked up by its key, in subqueries a LIMIT keeps the planner from
              -- turning into joins: as joins, a plan made while the tables outgrew their
              -- statistics read both tables whole for every group (docs/performance.md).
              JOIN LATERAL (SELECT * FROM subscriptions x WHERE x.original_transaction_id = k.wanted_id LIMIT 1) s ON true
              -- The latest period found once per subscription: a key compared inside the join's
              -- condition was looked for again for each of its periods, a cost that grew with the
              -- square of a subscription's age (docs/performance.md).
              LEFT JOIN LATERAL (SELECT l.period_key FROM subscription_periods l
                                  WHERE l.original_transaction_id = k.wanted_id
                                  ORDER BY l.purchase_date DESC, l.period_key DESC LIMIT 1) latest ON true
              LEFT JOIN LATERAL (SELECT * FROM subscription_periods x
                                  WHERE x.original_transaction_id = k.wanted_id
                                    AND x.period_key IN (k.wanted_key, latest.period_key) LIMIT 2) p ON true
            """
        typealias Row = PostgresRow

        let ids: [String]
        let periodKeys: [String]

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 2)
            bindings.append(ids)
            bindings.append(periodKeys)
            return bindings
        }
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
        try await write([(subscription, before)], in: transaction)
    }

    /// `write(_:since:in:)` for several subscriptions (none twice), in one statement.
    public func write(_ rows: [(subscription: Subscription, before: Subscription?)], in transaction: DatabaseTransaction) async throws {
        var values = Values()
        var subscriptions: [String] = []
        var periods: [String] = []
        for (s, before) in rows {
            // Times rounded as the rebuild's COPY stores them (`PostgresTime.Bound`), so that a rebuilt row equals this one.
            let t = PostgresTime.bound
            try subscriptions.append(Values.row([
                values.cell(s.originalTransactionId), values.cell(s.bundleId?.rawValue), values.cell(s.environment),
                values.cell(s.userId?.rawValue), values.cell(s.productId.rawValue), values.cell(s.subscriptionGroup),
                values.cell(s.familyShared), values.cell(t(s.startedAt)), values.cell(t(s.expiresAt)),
                values.cell(s.autoRenew), values.cell(s.autoRenewProductId), values.cell(s.expirationIntent),
                values.cell(t(s.gracePeriodExpiresAt)), values.cell(s.inBillingRetry), values.cell(s.expired),
                values.cell(t(s.revokedAt)), values.cell(s.version), values.cell(t(s.updatedAt)), values.cell(t(s.renewalSignedAt)),
            ]))
            let known = before?.periods ?? []
            for p in s.periods where !known.contains(p) {
                try periods.append(Values.row([
                    values.cell(s.originalTransactionId), values.cell(p.periodKey), values.cell(p.transactionId.rawValue),
                    values.cell(p.kind.rawValue), values.cell(p.productId.rawValue), values.cell(t(p.purchaseDate)),
                    values.cell(t(p.expiresAt)), values.cell(p.price) + "::numeric", values.cell(p.currency), values.cell(t(p.refundedAt)),
                    values.cell(p.refundPercentage),
                ]))
            }
        }
        guard !subscriptions.isEmpty else { return }
        let upsert = """
            INSERT INTO subscriptions (original_transaction_id, bundle_id, environment, user_id, product_id, subscription_group,
                                       family_shared, started_at, expires_at, auto_renew, auto_renew_product_id, expiration_intent,
                                       grace_period_expires_at, in_billing_retry, expired, revoked_at, version, updated_at,
                                       renewal_signed_at)
            VALUES \(subscriptions.joined(separator: ", "))
            ON CONFLICT (original_transaction_id) DO UPDATE SET
                bundle_id = EXCLUDED.bundle_id, environment = EXCLUDED.environment, user_id = EXCLUDED.user_id,
                product_id = EXCLUDED.product_id, subscription_group = EXCLUDED.subscription_group,
                family_shared = EXCLUDED.family_shared, started_at = EXCLUDED.started_at, expires_at = EXCLUDED.expires_at,
                auto_renew = EXCLUDED.auto_renew, auto_renew_product_id = EXCLUDED.auto_renew_product_id,
                expiration_intent = EXCLUDED.expiration_intent, grace_period_expires_at = EXCLUDED.grace_period_expires_at,
                in_billing_retry = EXCLUDED.in_billing_retry, expired = EXCLUDED.expired, revoked_at = EXCLUDED.revoked_at,
                version = EXCLUDED.version, updated_at = EXCLUDED.updated_at, renewal_signed_at = EXCLUDED.renewal_signed_at
            """
        guard !periods.isEmpty else {
            try await transaction.connection.guardedQuery(values.query(upsert), logger: database.logger)
            return
        }
        // The periods' key to their subscription is checked at the statement's end, when the
        // subscription the same statement adds is there.
        try await transaction.connection.guardedQuery(values.query(
            """
            WITH written AS (
            \(upsert)
            )
            INSERT INTO subscription_periods (original_transaction_id, period_key, transaction_id, kind, product_id, purchase_date,
                                              expires_at, price, currency, refunded_at, refund_percentage)
            VALUES \(periods.joined(separator: ", "))
            ON CONFLICT (original_transaction_id, period_key) DO UPDATE SET
                refunded_at = EXCLUDED.refunded_at, refund_percentage = EXCLUDED.refund_percentage
            """), logger: database.logger)
    }

    /// The bound values of a multi-row `INSERT … VALUES` (a NULL takes its column's type).
    private struct Values {
        var binds = PostgresBindings()

        /// `value` bound: its placeholder.
        mutating func cell<Value: PostgresThrowingDynamicTypeEncodable>(_ value: Value?) throws -> String {
            try binds.append(value)
            return "$\(binds.count)"
        }

        static func row(_ cells: [String]) -> String {
            "(" + cells.joined(separator: ", ") + ")"
        }

        /// `sql`, whose placeholders are this one's cells.
        func query(_ sql: String) -> PostgresQuery {
            PostgresQuery(unsafeSQL: sql, binds: binds)
        }
    }

    static let columns = """
        original_transaction_id, bundle_id, environment, user_id, product_id, subscription_group, family_shared, started_at, \
        expires_at, auto_renew, auto_renew_product_id, expiration_intent, grace_period_expires_at, in_billing_retry, expired, \
        revoked_at, version, updated_at, renewal_signed_at
        """
    static let periodColumns = """
        period_key, transaction_id, kind, product_id, purchase_date, expires_at, price::text, currency, refunded_at, refund_percentage
        """

    /// `columns` and `periodColumns` qualified by the tables' names in a join (`s`, `p`).
    static let subscriptionColumns = qualified(columns, by: "s")
    static let subscriptionPeriodColumns = qualified(periodColumns, by: "p")

    private static func qualified(_ list: String, by table: String) -> String {
        list.split(separator: ",").map { "\(table).\($0.trimmingCharacters(in: .whitespaces))" }.joined(separator: ", ")
    }

    /// How many `columns` there are: where columns that follow them begin.
    static let columnCount = columns.split(separator: ",").count

    static func decode(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [Subscription] {
        var subscriptions: [Subscription] = []
        for try await row in rows { subscriptions.append(try subscription(row.makeRandomAccess())) }
        return subscriptions
    }

    /// The subscription in `columns`, from column 0 on (without its periods).
    static func subscription(_ r: PostgresRandomAccessRow) throws -> Subscription {
        Subscription(
            originalTransactionId: try r[0].decode(String.self), bundleId: try r[1].decode(String?.self).map(BundleID.init(unchecked:)),
            environment: try r[2].decode(String.self), userId: try r[3].decode(String?.self).map(UserID.init(unchecked:)),
            productId: ProductID(unchecked: try r[4].decode(String.self)), subscriptionGroup: try r[5].decode(String?.self),
            familyShared: try r[6].decode(Bool.self), startedAt: try r[7].decode(Date.self), expiresAt: try r[8].decode(Date?.self),
            autoRenew: try r[9].decode(Bool?.self), autoRenewProductId: try r[10].decode(String?.self),
            expirationIntent: try r[11].decode(Int?.self), gracePeriodExpiresAt: try r[12].decode(Date?.self),
            inBillingRetry: try r[13].decode(Bool.self), expired: try r[14].decode(Bool.self), revokedAt: try r[15].decode(Date?.self),
            renewalSignedAt: try r[18].decode(Date?.self), version: try r[16].decode(Int64.self), updatedAt: try r[17].decode(Date.self),
            periods: [])
    }

    static func decodePeriods(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [Subscription.Period] {
        var periods: [Subscription.Period] = []
        for try await row in rows { periods.append(try period(row.makeRandomAccess(), at: 0)) }
        return periods
    }

    /// The period in `periodColumns` from column `at` on.
    static func period(_ r: PostgresRandomAccessRow, at: Int) throws -> Subscription.Period {
        Subscription.Period(
            periodKey: try r[at].decode(String.self), transactionId: TransactionID(unchecked: try r[at + 1].decode(String.self)),
            kind: SubscriptionPeriodKind(rawValue: try r[at + 2].decode(String.self)) ?? .renewal,
            productId: ProductID(unchecked: try r[at + 3].decode(String.self)), purchaseDate: try r[at + 4].decode(Date.self),
            expiresAt: try r[at + 5].decode(Date?.self), price: try r[at + 6].decode(String?.self), currency: try r[at + 7].decode(String?.self),
            refundedAt: try r[at + 8].decode(Date?.self), refundPercentage: try r[at + 9].decode(Int?.self))
    }
}
