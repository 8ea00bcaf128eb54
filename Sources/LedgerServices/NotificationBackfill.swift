import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging

/// The notification backfill: the App Store Server Notifications Apple sent while the ledger
/// was away (Get Notification History), each applied through the path a live one takes, so one
/// applied before is applied once (its `notificationUUID` is its event's id). Its request and the
/// pagination token of the last page applied are kept (`apple_notification_backfill`): a stopped
/// backfill resumes where it stopped. One server at a time runs it (under its lease).
public struct NotificationBackfill: Sendable {
    let api: LazyAppStoreServerAPI
    let verifier: AppleProofVerifier
    let notifications: NotificationLedger
    let state: NotificationBackfillState
    let leases: Leases
    let logger: Logger
    /// How far back Apple keeps notification history.
    public static let appleKeeps: TimeInterval = 180 * 86_400
    /// How much earlier than the last notification recorded a backfill starts (Apple's history
    /// is by the time it sent a notification, which may be a little before its signed date).
    public var overlap: TimeInterval = 3600
    public var maximumPages = 10_000

    public init(
        api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, notifications: NotificationLedger, state: NotificationBackfillState,
        leases: Leases, logger: Logger
    ) {
        self.api = api
        self.verifier = verifier
        self.notifications = notifications
        self.state = state
        self.leases = leases
        self.logger = logger
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
        let ran: Void? = try await leases.withLease("notification-backfill", for: Self.lease) { lease in
            let request = try await begin(since: since)
            (summary.startDate, summary.endDate, summary.resumed) = (request.start, request.end, request.token != nil)
            try await read(request, under: lease, metadata: metadata, into: &summary, progress: progress)
        }
        guard ran != nil else {
            summary.busy = true
            return summary
        }
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

    /// The request to run, recorded (the caller holds the lease): a stopped one's, unless
    /// `since` is given, else a new one from the latest of the last notification recorded and the
    /// end of the last backfill, less `overlap` (a ledger that recorded neither: from its first
    /// event), to now, never further back than Apple keeps.
    private func begin(since: Date?) async throws -> Request {
        let earliest = Date().addingTimeInterval(-Self.appleKeeps + 60)
        let stored = try await state.read()
        var request: Request
        if since == nil, let start = stored.startDate, let end = stored.endDate, !stored.finished {
            request = Request(start: start, end: end, token: stored.paginationToken)
        } else {
            let from = since ?? ([stored.lastNotification, stored.finished ? stored.endDate : nil].compactMap { $0 }.max()?.addingTimeInterval(-overlap)
                ?? stored.firstEvent ?? Date())
            request = Request(start: max(from, earliest), end: Date(), token: nil)
        }
        if request.start >= request.end { request = Request(start: request.end.addingTimeInterval(-1), end: request.end, token: nil) }
        try await state.begin(startDate: request.start, endDate: request.end, paginationToken: request.token)
        return request
    }

    /// Reads the pages from the request's token on, applies each notification, and keeps the
    /// next page's token once a page is applied.
    private func read(
        _ request: Request, under lease: Lease, metadata: Data, into summary: inout Summary, progress: (@Sendable (Int) -> Void)?
    ) async throws {
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
            guard try await leases.renew(lease, for: Self.lease) else {
                logger.warning("the notification backfill lost its lease; another server goes on")
                return
            }
            try await state.advance(paginationToken: token, done: done)
            if done {
                summary.finished = true
                return
            }
            try Task.checkCancellation()
        }
    }
}
