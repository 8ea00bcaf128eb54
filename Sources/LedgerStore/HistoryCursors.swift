import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// Where each Apple account's history sweep stopped (`apple_history_cursors`): Apple's
/// `revision` for the next request and the start date every request of the account repeats; and
/// which accounts are due a sweep.
public struct HistoryCursors: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// One account due a sweep.
    public struct DueAccount: Sendable {
        /// The id history is asked by: the appTransactionId, else a transaction id of the account.
        public let id: String
        public let user: UserID
        /// The user's oldest open order.
        public let oldestOpenOrder: Date
        /// The account's app (its user's orders'; nil: a ledger without apps) and environment (`Production`,
        /// `Sandbox`; nil: unknown), whose key and host its history is asked with.
        public var bundleId: BundleID? = nil
        public var environment: String? = nil
    }

    /// The accounts of users with an open order older than `openFor` seconds (of `user` alone,
    /// when given; of the apps `apps` alone, any case, when given, as user ids are per app):
    /// those they linked, those named by their transactions, and for a user with neither (an
    /// account named only by a backend's unverified claim does not count) but with transactions
    /// of an unknown account, held by orders or pooled, the earliest one's id in each
    /// environment, one Apple signed before a claim.
    public func dueAccounts(user: UserID?, apps: [BundleID]? = nil, openFor: TimeInterval) async throws -> [DueAccount] {
        let apps = apps?.map { $0.rawValue.lowercased() }
        let rows = try await database.query(
            """
            WITH due AS (
                SELECT bundle_id, user_id, min(created_at) AS oldest FROM orders
                 WHERE state IN ('created', 'payment-added') AND created_at <= now() - make_interval(secs => \(openFor))
                   AND (\(user?.rawValue)::text IS NULL OR user_id = \(user?.rawValue)::text)
                   AND (\(apps)::text[] IS NULL OR lower(bundle_id) = ANY(\(apps)::text[]))
                 GROUP BY bundle_id, user_id),
            accounts AS (
                SELECT substr(e.stream_id, length('apple-account-') + 1) AS account_id, d.user_id, d.oldest, 0 AS strength,
                       d.bundle_id, e.data->>'environment' AS environment, false AS claimed
                  FROM due d JOIN events e ON e.type = 'account-linked' AND e.data->>'userId' = d.user_id
                 -- A link made before links named their app is the ledger's first app's.
                 WHERE d.bundle_id IS NULL
                    OR lower(coalesce(e.data->>'bundleId', (SELECT f.bundle_id FROM ledger_first_app f))) = lower(d.bundle_id)
                UNION ALL
                -- A backend's own claim (its order not verified yet) names an account Apple may not know.
                -- (Each due user's orders by the index on user_id, not a hash of every order: the
                -- OFFSET keeps the planner from making a join of it.)
                SELECT t.app_transaction_id, d.user_id, d.oldest, 1, d.bundle_id, t.environment, t.claimed
                  FROM due d CROSS JOIN LATERAL (
                       SELECT t.app_transaction_id, t.environment, o.state = 'receipt-received' AS claimed
                         FROM orders o JOIN apple_transactions t ON t.order_id = o.order_id
                        WHERE o.user_id = d.user_id AND o.bundle_id IS NOT DISTINCT FROM d.bundle_id AND t.app_transaction_id IS NOT NULL
                       OFFSET 0) t
                UNION ALL
                SELECT t.app_transaction_id, d.user_id, d.oldest, 1, d.bundle_id, t.environment, false
                  FROM due d JOIN apple_transactions t ON t.user_id = d.user_id AND t.order_id IS NULL AND t.bundle_id IS NOT DISTINCT FROM d.bundle_id
                 WHERE t.app_transaction_id IS NOT NULL),
            -- For a user without an account that is not only a claim's: one transaction per
            -- environment (each keeps its own history, a host each), the user's orders' or pooled,
            -- one Apple signed before a backend's claim.
            fallback AS (
                SELECT DISTINCT ON (d.bundle_id, d.user_id, coalesce(t.environment, 'Production'))
                       t.transaction_id AS account_id, d.user_id, d.oldest, 2 AS strength, d.bundle_id, t.environment, t.claimed
                  FROM due d CROSS JOIN LATERAL (
                       SELECT t.transaction_id, t.environment, t.purchase_date, o.state = 'receipt-received' AS claimed
                         FROM orders o JOIN apple_transactions t ON t.order_id = o.order_id
                        WHERE o.user_id = d.user_id AND o.bundle_id IS NOT DISTINCT FROM d.bundle_id
                       UNION ALL
                       SELECT t.transaction_id, t.environment, t.purchase_date, false
                         FROM apple_transactions t WHERE t.order_id IS NULL AND t.user_id = d.user_id AND t.bundle_id IS NOT DISTINCT FROM d.bundle_id) t
                 WHERE NOT EXISTS (SELECT FROM accounts a WHERE a.user_id = d.user_id AND a.bundle_id IS NOT DISTINCT FROM d.bundle_id AND NOT a.claimed)
                 ORDER BY d.bundle_id, d.user_id, coalesce(t.environment, 'Production'), t.claimed, t.purchase_date)
            SELECT DISTINCT ON (account_id) account_id, user_id, oldest, bundle_id, environment
              FROM (SELECT * FROM accounts UNION ALL SELECT * FROM fallback) a
             ORDER BY account_id, strength, claimed, oldest
            """)
        var accounts: [DueAccount] = []
        for try await (id, user, oldest, bundle, environment) in rows.decode((String, String, Date, String?, String?).self) {
            accounts.append(DueAccount(
                id: id, user: UserID(unchecked: user), oldestOpenOrder: oldest, bundleId: bundle.map(BundleID.init(unchecked:)),
                environment: environment))
        }
        return accounts
    }

    /// Where an account's sweep starts: the revision stored, and the start date its first request
    /// sent (which every later one repeats).
    public struct Cursor: Sendable, Equatable {
        public let revision: String?
        public let startDate: Date

        public init(revision: String?, startDate: Date) {
            self.revision = revision
            self.startDate = startDate
        }
    }

    /// The account's cursor, made on its first sweep with `startDate` (kept from then on), and
    /// its app and environment.
    public func open(
        _ account: String, user: UserID, startDate: Date, bundleId: BundleID? = nil, environment: String? = nil
    ) async throws -> Cursor {
        let rows = try await database.query(
            """
            INSERT INTO apple_history_cursors AS c (account_id, user_id, start_date, bundle_id, environment)
            VALUES (\(account), \(user.rawValue), \(startDate), \(bundleId?.rawValue), \(environment))
            ON CONFLICT (account_id) DO UPDATE SET start_date = coalesce(c.start_date, EXCLUDED.start_date),
                bundle_id = coalesce(EXCLUDED.bundle_id, c.bundle_id), environment = coalesce(EXCLUDED.environment, c.environment)
            RETURNING revision, start_date
            """)
        for try await (revision, start) in rows.decode((String?, Date).self) { return Cursor(revision: revision, startDate: start) }
        // (An upsert answers its row; this is never reached.)
        return Cursor(revision: nil, startDate: startDate)
    }

    /// Drops the account's stored revision (Apple no longer takes it): its next read starts
    /// from its start date, and a page held back keeps it there.
    public func forgetRevision(_ account: String) async throws {
        try await database.query("UPDATE apple_history_cursors SET revision = NULL WHERE account_id = \(account)")
    }

    /// Records a page read: the account's cursor moves to `revision` unless `holdingBack` (a page
    /// held an entry that did not verify: the next sweep reads it again), and `found` more
    /// transactions were new to the ledger.
    public func advance(_ account: String, to revision: String, holdingBack: Bool, found: Int) async throws {
        try await database.query(
            """
            UPDATE apple_history_cursors
               SET revision = CASE WHEN \(holdingBack) THEN revision ELSE \(revision) END, swept_at = now(), found = found + \(found)
             WHERE account_id = \(account)
            """)
    }
}
