import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// Where each Apple account's refund history was last read (`apple_refund_cursors`): Apple's
/// `revision` and when; and which accounts are due a read.
public struct RefundCursors: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// An account: its key (appTransactionId, else original transaction id) and a transaction id
    /// of it to ask Apple by.
    public struct DueAccount: Sendable, Equatable {
        public let key: String
        public let transactionId: String
        /// Its app (nil: the ledger's first app) and environment (`Production`, `Sandbox`), whose
        /// key and host its refund history is asked with.
        public var bundleId: BundleID? = nil
        public var environment: String? = nil
        /// Asked by a backend's own claim, not yet verified (the account has no granted
        /// transaction in the look-back): Apple may know no such transaction.
        public var claimed = false
    }

    /// The accounts with transactions granted in the last `lookbackDays`, or claimed by a backend
    /// for an order not yet verified (a refund takes that claim back), whose refund history was
    /// not read in the last `recheckAfter` seconds (`all`: however recently), by key.
    public func dueAccounts(lookbackDays: Int, recheckAfter: TimeInterval, all: Bool) async throws -> [DueAccount] {
        let rows = try await database.query(
            """
            SELECT a.account_id, a.transaction_id, a.bundle_id, a.environment, a.claimed FROM (
                SELECT DISTINCT ON (account_id) account_id, transaction_id, bundle_id, environment, claimed FROM (
                    SELECT coalesce(t.app_transaction_id, t.original_transaction_id, t.transaction_id) AS account_id,
                           t.transaction_id, t.purchase_date, t.bundle_id, t.environment, o.state = 'receipt-received' AS claimed
                      FROM apple_transactions t JOIN orders o ON o.order_id = t.order_id
                     WHERE o.state IN ('receipt-received', 'verified', 'delivered', 'finished')
                       AND t.purchase_date >= now() - make_interval(days => \(lookbackDays)::int)) granted
                 -- Asked by a granted transaction, what Apple signed, before a backend's unchecked claim.
                 ORDER BY account_id, claimed, purchase_date DESC) a
              LEFT JOIN apple_refund_cursors c ON c.account_id = a.account_id
             WHERE \(all) OR c.checked_at IS NULL OR c.checked_at < now() - make_interval(secs => \(recheckAfter))
             ORDER BY a.account_id
            """)
        var accounts: [DueAccount] = []
        for try await (key, transaction, bundle, environment, claimed) in rows.decode((String, String, String?, String?, Bool).self) {
            accounts.append(DueAccount(
                key: key, transactionId: transaction, bundleId: bundle.map(BundleID.init(unchecked:)), environment: environment, claimed: claimed))
        }
        return accounts
    }

    /// The revision the account's next read starts from (nil: its first read), its cursor made
    /// on first use (with its app and environment).
    public func revision(of account: String, bundleId: BundleID? = nil, environment: String? = nil) async throws -> String? {
        let rows = try await database.query(
            """
            INSERT INTO apple_refund_cursors AS c (account_id, bundle_id, environment) VALUES (\(account), \(bundleId?.rawValue), \(environment))
            ON CONFLICT (account_id) DO UPDATE SET bundle_id = coalesce(EXCLUDED.bundle_id, c.bundle_id),
                environment = coalesce(EXCLUDED.environment, c.environment)
            RETURNING revision
            """)
        for try await revision in rows.decode(String?.self) { return revision }
        return nil
    }

    /// Records the account read now, its cursor where it was: Apple knows nothing to read of it.
    public func checked(_ account: String) async throws {
        try await database.query("UPDATE apple_refund_cursors SET checked_at = now() WHERE account_id = \(account)")
    }

    /// Drops the account's stored revision (Apple no longer takes it): its next read starts from
    /// the first page, and a page held back keeps it there.
    public func forgetRevision(_ account: String) async throws {
        try await database.query("UPDATE apple_refund_cursors SET revision = NULL WHERE account_id = \(account)")
    }

    /// Records a page read now: the cursor moves to `revision` unless `holdingBack` (a page held
    /// an entry that did not verify: the next read starts before it again).
    public func advance(_ account: String, to revision: String, holdingBack: Bool) async throws {
        try await database.query(
            """
            UPDATE apple_refund_cursors
               SET revision = CASE WHEN \(holdingBack) THEN revision ELSE \(revision) END, checked_at = now()
             WHERE account_id = \(account)
            """)
    }
}
