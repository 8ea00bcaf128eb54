import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// The notification backfill's request and where its pages stopped, for one app and
/// environment (its row of `apple_notification_backfill`), so that a stopped backfill resumes
/// with the same dates and Apple's pagination token; and a request Apple refused, which is never
/// resumed.
public struct NotificationBackfillState: Sendable {
    public let database: Database
    /// The app (nil: the ledger's first app, as rows written before apps are) and environment
    /// (`Production` or `Sandbox`) whose backfill this is.
    public let bundleId: BundleID?
    public let environment: String

    public init(database: Database, bundleId: BundleID? = nil, environment: String = "Production") {
        self.database = database
        self.bundleId = bundleId
        self.environment = environment
    }

    /// The row's key, as the unique index `apple_notification_backfill_app` has it.
    private var app: String { bundleId?.rawValue.lowercased() ?? "" }

    /// What is stored, with what the next backfill's start is reckoned from.
    public struct Stored: Sendable, Equatable {
        public var startDate: Date?
        public var endDate: Date?
        /// The next page's token of a backfill that stopped before its end.
        public var paginationToken: String?
        public var finished: Bool
        /// Apple refused the request: the next backfill asks afresh instead of resuming it.
        public var abandoned = false
        /// The signed date of the last notification the ledger recorded, if any.
        public var lastNotification: Date?
        /// When the ledger recorded its first event, if any.
        public var firstEvent: Date?
    }

    /// The stored request (the row made on first use). The last notification is the last of
    /// this app's and environment's: one about a transaction of them, or about none that names
    /// them (one recorded before notifications named theirs counts for every app and environment).
    public func read() async throws -> Stored {
        try await database.query(
            """
            INSERT INTO apple_notification_backfill (bundle_id, environment) VALUES (\(bundleId?.rawValue), \(environment))
            ON CONFLICT ((coalesce(lower(bundle_id), '')), environment) DO NOTHING
            """)
        let rows = try await database.query(
            """
            SELECT start_date, end_date, pagination_token, finished_at IS NOT NULL, abandoned_at IS NOT NULL,
                   (SELECT (e.data->>'signedDate')::timestamptz FROM events e
                     WHERE e.type = 'notification-received'
                       AND (e.data->>'environment' IS NULL OR e.data->>'environment' = \(environment))
                       AND (e.data->>'bundleId' IS NULL OR lower(e.data->>'bundleId') =
                            lower(coalesce(\(bundleId?.rawValue)::text, (SELECT f.bundle_id FROM ledger_first_app f))))
                       AND NOT EXISTS (SELECT FROM apple_transactions t
                                        WHERE t.transaction_id = e.data->>'transactionId'
                                          AND (t.environment IS DISTINCT FROM \(environment)
                                               OR lower(t.bundle_id) IS DISTINCT FROM
                                                  lower(coalesce(\(bundleId?.rawValue)::text, (SELECT f.bundle_id FROM ledger_first_app f)))))
                     ORDER BY e.global_position DESC LIMIT 1),
                   (SELECT recorded_at FROM events ORDER BY global_position LIMIT 1)
              FROM apple_notification_backfill
             WHERE coalesce(lower(bundle_id), '') = \(app) AND environment = \(environment)
            """)
        for try await (start, end, token, finished, abandoned, last, first) in rows.decode((Date?, Date?, String?, Bool, Bool, Date?, Date?).self) {
            return Stored(
                startDate: start, endDate: end, paginationToken: token, finished: finished, abandoned: abandoned, lastNotification: last,
                firstEvent: first)
        }
        return Stored(finished: false)
    }

    /// Records the request a backfill runs: from `startDate` to `endDate`, from `paginationToken`
    /// (nil: a new request, not finished yet).
    public func begin(startDate: Date, endDate: Date, paginationToken: String?) async throws {
        try await database.query(
            """
            UPDATE apple_notification_backfill
               SET start_date = \(startDate), end_date = \(endDate), pagination_token = \(paginationToken),
                   finished_at = CASE WHEN \(paginationToken == nil) THEN NULL ELSE finished_at END,
                   abandoned_at = NULL, abandoned_because = NULL
             WHERE coalesce(lower(bundle_id), '') = \(app) AND environment = \(environment)
            """)
    }

    /// Records that Apple refused the request (`because`: its error): it is kept for support but
    /// never resumed, and its token is dropped.
    public func abandon(because reason: String) async throws {
        try await database.query(
            """
            UPDATE apple_notification_backfill
               SET pagination_token = NULL, finished_at = NULL, abandoned_at = now(), abandoned_because = \(reason)
             WHERE coalesce(lower(bundle_id), '') = \(app) AND environment = \(environment)
            """)
    }

    /// Records a page applied: the next page's token, or the request finished (`done`).
    public func advance(paginationToken: String?, done: Bool) async throws {
        try await database.query(
            """
            UPDATE apple_notification_backfill
               SET pagination_token = CASE WHEN \(done) THEN NULL ELSE \(paginationToken) END,
                   finished_at = CASE WHEN \(done) THEN now() END
             WHERE coalesce(lower(bundle_id), '') = \(app) AND environment = \(environment)
            """)
    }
}
