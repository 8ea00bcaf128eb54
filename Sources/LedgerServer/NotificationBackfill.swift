import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging
import PostgresNIO

/// The notification backfill: the App Store Server Notifications Apple sent while the ledger
/// was away (Get Notification History), each applied through the path a live one takes, so one
/// applied before is applied once (its `notificationUUID` is its event's id). Its request and the
/// pagination token of the last page applied are kept (`apple_notification_backfill`): a stopped
/// backfill resumes where it stopped. One server at a time runs it (a lease on that row).
public struct NotificationBackfill: Sendable {
    let api: LazyAppStoreServerAPI
    let verifier: AppleProofVerifier
    let notifications: NotificationLedger
    /// How far back Apple keeps notification history.
    public static let appleKeeps: TimeInterval = 180 * 86_400
    /// How much earlier than the last notification recorded a backfill starts (Apple's history
    /// is by the time it sent a notification, which may be a little before its signed date).
    public var overlap: TimeInterval = 3600
    public var maximumPages = 10_000
    var database: Database { notifications.receipts.orders.database }
    var logger: Logger { database.logger }

    public init(api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, notifications: NotificationLedger) {
        self.api = api
        self.verifier = verifier
        self.notifications = notifications
    }

    /// What a backfill did.
    public struct Summary: Codable, Sendable, Equatable {
        public var startDate: Date?
        public var endDate: Date?
        /// It went on from where a stopped one was.
        public var resumed = false
        /// Another server was running it: nothing done here.
        public var busy = false
        public var pages = 0
        public var notifications = 0
        /// Notifications new to the ledger, and those applied before (live, or by a backfill).
        public var applied = 0
        public var repeated = 0
        /// Notifications that failed verification: logged, not applied.
        public var refused = 0
        /// All of Apple's history for the dates was read.
        public var finished = false
        public init() {}
    }

    /// Backfills from `since` (nil: a stopped backfill's place, else from the last notification
    /// the ledger recorded, less `overlap`) to now; `progress` gets the notifications seen.
    public func run(
        since: Date? = nil, metadata: Data = Data(#"{"appendedBy":"notification-backfill"}"#.utf8),
        progress: (@Sendable (Int) -> Void)? = nil
    ) async throws -> Summary {
        var summary = Summary()
        guard let request = try await claim(since: since) else {
            summary.busy = true
            return summary
        }
        (summary.startDate, summary.endDate, summary.resumed) = (request.start, request.end, request.token != nil)
        do {
            try await read(request, metadata: metadata, into: &summary, progress: progress)
        } catch {
            _ = try? await database.query("UPDATE apple_notification_backfill SET claimed_until = NULL")
            throw error
        }
        _ = try await database.query("UPDATE apple_notification_backfill SET claimed_until = NULL")
        if summary.notifications > 0 {
            logger.info("notification backfill", metadata: [
                "backfill.notifications": "\(summary.notifications)", "backfill.applied": "\(summary.applied)",
                "backfill.refused": "\(summary.refused)", "backfill.finished": "\(summary.finished)"])
        }
        return summary
    }

    struct Request {
        let start: Date
        let end: Date
        let token: String?
    }

    static let lease: TimeInterval = 600

    /// The request to run, under the lease; nil when another server holds it.
    private func claim(since: Date?) async throws -> Request? {
        let earliest = Date().addingTimeInterval(-Self.appleKeeps + 60)
        return try await database.transaction { connection in
            let rows = try await connection.guardedQuery(
                """
                SELECT start_date, end_date, pagination_token, finished_at IS NOT NULL, coalesce(claimed_until > now(), false),
                       (SELECT (data->>'signedDate')::timestamptz FROM events WHERE type = 'notification-received'
                         ORDER BY global_position DESC LIMIT 1),
                       (SELECT recorded_at FROM events ORDER BY global_position LIMIT 1)
                  FROM apple_notification_backfill FOR UPDATE
                """, logger: logger)
            var found: (start: Date?, end: Date?, token: String?, finished: Bool, claimed: Bool, lastNotification: Date?, firstEvent: Date?)?
            for try await row in rows.decode((Date?, Date?, String?, Bool, Bool, Date?, Date?).self) { found = row }
            guard let (start, end, token, finished, claimed, lastNotification, firstEvent) = found, !claimed else { return nil }
            var request: Request
            if since == nil, let start, let end, !finished {
                request = Request(start: start, end: end, token: token)
            } else {
                // From the latest of: the last notification recorded, the end of the last
                // backfill; a ledger that recorded neither, from its first event.
                let from = since ?? ([lastNotification, finished ? end : nil].compactMap { $0 }.max()?.addingTimeInterval(-overlap)
                    ?? firstEvent ?? Date())
                request = Request(start: max(from, earliest), end: Date(), token: nil)
            }
            if request.start >= request.end { request = Request(start: request.end.addingTimeInterval(-1), end: request.end, token: nil) }
            let fresh = request.token == nil
            _ = try await connection.guardedQuery(
                """
                UPDATE apple_notification_backfill
                   SET start_date = \(request.start), end_date = \(request.end), pagination_token = \(request.token),
                       claimed_until = now() + make_interval(secs => \(Self.lease)),
                       finished_at = CASE WHEN \(fresh) THEN NULL ELSE finished_at END
                """, logger: logger)
            return request
        }
    }

    /// Reads the pages from the request's token on, applies each notification, and keeps the
    /// next page's token once a page is applied.
    private func read(_ request: Request, metadata: Data, into summary: inout Summary, progress: (@Sendable (Int) -> Void)?) async throws {
        let client = try await api.client()
        var token = request.token
        for _ in 0..<maximumPages {
            let page = try await client.notificationHistory(startDate: request.start, endDate: request.end, paginationToken: token)
            summary.pages += 1
            for item in page.notificationHistory {
                summary.notifications += 1
                let notification: VerifiedNotification
                do {
                    notification = try await verifier.notification(signed: item.signedPayload)
                } catch {
                    if error.isRetryable { throw error }
                    summary.refused += 1
                    logger.warning("a notification in Apple's notification history was refused", metadata: [
                        "error": "\(error.code)", "error.message": "\(error.message)"])
                    continue
                }
                if try await notifications.apply(notification, metadata: metadata).appended { summary.applied += 1 } else { summary.repeated += 1 }
            }
            progress?(summary.notifications)
            let done = !page.hasMore || page.paginationToken == nil
            token = page.paginationToken
            _ = try await database.query(
                """
                UPDATE apple_notification_backfill
                   SET pagination_token = CASE WHEN \(done) THEN NULL ELSE \(token) END,
                       finished_at = CASE WHEN \(done) THEN now() END,
                       claimed_until = now() + make_interval(secs => \(Self.lease))
                """)
            if done {
                summary.finished = true
                return
            }
            try Task.checkCancellation()
        }
    }
}
