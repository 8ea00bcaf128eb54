import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging

/// The notification backfill: the App Store Server Notifications Apple sent while the ledger
/// was away (Get Notification History), each applied through the path a live one takes, so one
/// applied before is applied once (its `notificationUUID` is its event's id). Its request and the
/// pagination token of the last page applied are kept (`apple_notification_backfill`): a stopped
/// backfill resumes where it stopped. It never asks further back than Apple keeps history in the
/// client's environment. When Apple refuses the stored position (start date too far back, token
/// invalid or expired) it starts again once, without the token, from a date Apple allows; any other
/// refusal stops the run, and its request is abandoned so that no later run repeats it. One
/// server at a time runs it (under its lease). A backfill is one app's in one environment, with
/// its key at that environment's host (Apple's history is per app and environment), and keeps
/// its own request and position.
public struct NotificationBackfill: Sendable {
    /// The `appendedBy` of what a backfill inside `ledger serve` records.
    public static let appendedBy = "notification-backfill"
    let api: LazyAppStoreServerAPI
    /// The app whose history this reads (nil: the ledger's first app).
    public let app: BundleID?
    let verifier: AppleProofVerifier
    let notifications: NotificationLedger
    let state: NotificationBackfillState
    let leases: Leases
    let logger: Logger
    /// The environment the API client asks, which sets how far back Apple keeps history.
    public var environment: AppleEnvironment
    /// Told the reason (Apple's error name) each time a run drops its stored position and starts
    /// again: the server counts them (`ledger_notification_backfill_restarts_total`).
    public var restarted: (@Sendable (String) -> Void)?
    /// How much earlier than the last notification recorded a backfill starts (Apple's history
    /// is by the time it sent a notification, which may be a little before its signed date).
    public var overlap: TimeInterval = 3600
    public var maximumPages = 10_000

    /// `app`'s backfill (nil: the API client's one app when it is made from settings, else the
    /// ledger's first app) in `environment` (nil: the API client's, `environment(baseURL:configured:)`
    /// with its settings' `environment`). `state` is re-keyed to the app and environment.
    public init(
        api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, notifications: NotificationLedger, state: NotificationBackfillState,
        leases: Leases, logger: Logger, app: BundleID? = nil, environment: AppleEnvironment? = nil
    ) {
        let environment = Self.environment(baseURL: api.settings?.baseURL ?? "", configured: environment ?? api.settings?.environment)
        self.environment = environment
        self.app = app ?? api.settings.map { BundleID(unchecked: $0.bundleID) }
        self.api = api
        self.verifier = verifier
        self.notifications = notifications
        self.state = NotificationBackfillState(database: state.database, bundleId: self.app, environment: environment.rawValue)
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
        /// Apple refused the stored position and the run started again without it, from a date
        /// Apple allows: Apple's error name (`StartDateTooFarInPast`, `InvalidPaginationToken`,
        /// `PaginationTokenExpired`).
        public var restarted: String?
        /// Apple refused the request and the run stopped: its error, and Apple's errorCode. The
        /// request is abandoned; the next run asks afresh.
        public var refusal: String?
        public var appleErrorCode: Int?
        public init() {}
    }

    /// How far back Get Notification History goes: 180 days in production, 30 in the sandbox
    /// (and Xcode or local testing, which have no history at Apple).
    public static func keeps(_ environment: AppleEnvironment) -> TimeInterval {
        (environment == .production ? 180 : 30) * 86_400
    }

    /// The environment the API client asks: Apple's sandbox or production host by its base URL;
    /// any other host (a stand-in, a proxy) is `configured`'s, else the sandbox, whose shorter
    /// history Apple never refuses.
    public static func environment(baseURL: String, configured: AppleEnvironment?) -> AppleEnvironment {
        AppStoreServerAPI.environment(ofHost: baseURL) ?? configured ?? .sandbox
    }

    /// Apple's refusals of a stored position, by errorCode: the run starts again without it.
    static let restartReasons = [4000012: "StartDateTooFarInPast", 4000014: "InvalidPaginationToken", 4000017: "PaginationTokenExpired"]

    /// Apple's answer to this request, which it would give again: a 4xx other than 401 (the key,
    /// which the operator can mend), 429 and Apple's "not found, try again" codes, and a page
    /// that names the token it was asked with again.
    static func isRefusal(_ error: AppStoreServerAPIError) -> Bool {
        if error.code == "apple-api-position-unmoved" { return true }
        guard let status = error.status, (400..<500).contains(status), status != 401, status != 429, !error.isAppleAway else { return false }
        return ![4040002, 4040004, 4040006].contains(error.appleErrorCode ?? 0)
    }

    /// Backfills from `since` (nil: a stopped backfill's place, else from the last notification
    /// the ledger recorded, less `overlap`) to now; `progress` gets the notifications seen.
    public func run(
        since: Date? = nil, metadata: Data = Data(#"{"appendedBy":"\#(NotificationBackfill.appendedBy)"}"#.utf8),
        progress: (@Sendable (Int) -> Void)? = nil
    ) async throws -> Summary {
        var summary = Summary()
        let ran: Void? = try await leases.withLease(leaseName, for: Self.lease) { lease in
            var request = try await begin(since: since)
            while true {
                (summary.startDate, summary.endDate, summary.resumed) = (request.start, request.end, request.token != nil)
                do {
                    return try await read(request, under: lease, metadata: metadata, into: &summary, progress: progress)
                } catch let error as AppStoreServerAPIError where Self.isRefusal(error) {
                    if summary.restarted == nil, let reason = error.appleErrorCode.flatMap({ Self.restartReasons[$0] }) {
                        // Once per run: a second refusal of the new request would be refused again.
                        summary.restarted = reason
                        logger.warning("notification backfill: Apple refused the stored position; starting again without it", metadata: [
                            "backfill.reason": "\(reason)", "backfill.start": "\(request.start)", "apple.error_code": "\(error.appleErrorCode ?? 0)"])
                        restarted?(reason)
                        request = try await restart(after: reason)
                        continue
                    }
                    summary.refusal = error.description
                    summary.appleErrorCode = error.appleErrorCode
                    try await state.abandon(because: error.description)
                    logger.error("notification backfill stopped: Apple refused its request; the next run asks afresh", metadata: [
                        "error": "\(error.code)", "error.message": "\(error.description)", "backfill.start": "\(request.start)",
                        "backfill.end": "\(request.end)"])
                    return
                }
            }
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

    /// One server at a time runs an app's backfill in an environment.
    var leaseName: String { "notification-backfill/\(app?.rawValue.lowercased() ?? "")/\(environment.rawValue)" }

    /// The earliest start date Apple takes now, with `margin` to spare (an hour: a run that
    /// starts at the limit may read pages for a while, each asking with the same start).
    func earliest(margin: TimeInterval = 3600) -> Date { Date().addingTimeInterval(-Self.keeps(environment) + margin) }

    /// The request to run, recorded (the caller holds the lease): a stopped one's, unless
    /// `since` is given or it was abandoned; one that starts further back than Apple keeps now
    /// (a start set at Apple's limit, which has moved on since) is asked again from the earliest
    /// date Apple takes (with the hour a new start keeps to spare), without its token, rather
    /// than from the last notification recorded, which may be later than what it left unread. Else a new one from the latest of the last notification recorded and
    /// the end of the last backfill, less `overlap` (a ledger that recorded neither: from its
    /// first event), to now, never further back than Apple keeps.
    private func begin(since: Date?) async throws -> Request {
        let earliest = earliest()
        let stored = try await state.read()
        let request: Request
        if since == nil, let start = stored.startDate, let end = stored.endDate, !stored.finished, !stored.abandoned {
            // Apple's limit itself, not the margin a new start keeps: a start set at the limit
            // an hour ago is still resumed (should Apple refuse it, the run starts again).
            request = start >= self.earliest(margin: 0)
                ? Request(start: start, end: end, token: stored.paginationToken)
                : Request(start: earliest, end: Date(), token: nil)
        } else {
            let from = since ?? ([stored.lastNotification, stored.finished ? stored.endDate : nil].compactMap { $0 }.max()?.addingTimeInterval(-overlap)
                ?? stored.firstEvent ?? Date())
            // A second at least: the dates are stored to the microsecond, and a resumed request
            // must still start before it ends.
            let end = Date()
            request = Request(start: min(max(from, earliest), end.addingTimeInterval(-1)), end: end, token: nil)
        }
        try await state.begin(startDate: request.start, endDate: request.end, paginationToken: request.token)
        return request
    }

    /// The request after Apple refused the stored position, recorded: from the earliest date
    /// Apple takes (a day inside it when Apple said the start was too far back, as its reckoning
    /// of the limit may differ from ours) to now, without a token. Notifications read again are
    /// applied once, so starting that far back loses nothing and costs only pages.
    private func restart(after reason: String) async throws -> Request {
        let start = reason == Self.restartReasons[4000012] ? earliest(margin: 86_400) : earliest()
        let request = Request(start: start, end: Date(), token: nil)
        try await state.begin(startDate: request.start, endDate: request.end, paginationToken: nil)
        return request
    }

    /// Reads the pages from the request's token on, applies each notification, and keeps the
    /// next page's token once a page is applied.
    private func read(
        _ request: Request, under lease: Lease, metadata: Data, into summary: inout Summary, progress: (@Sendable (Int) -> Void)?
    ) async throws {
        let client = try await api.client(for: app, environment: environment)
        var token = request.token
        // The positions asked in this read: one named again ends it.
        var seen = Set<String>()
        for _ in 0..<maximumPages {
            let page = try await client.notificationHistory(startDate: request.start, endDate: request.end, paginationToken: token)
            summary.pages += 1
            for item in page.notificationHistory {
                summary.notifications += 1
                guard let signed = item.signedPayload else {
                    summary.refused += 1
                    logger.warning("a notification in Apple's notification history came without its signed payload")
                    continue
                }
                let notification: VerifiedNotification
                do {
                    notification = try await verifier.notification(signed: signed)
                } catch {
                    if error.isRetryable { throw error }
                    summary.refused += 1
                    logger.warning("a notification in Apple's notification history was refused", metadata: [
                        "error": "\(error.code)", "error.message": "\(error.message)"])
                    continue
                }
                do {
                    if try await notifications.apply(notification, metadata: metadata).appended { summary.applied += 1 } else { summary.repeated += 1 }
                } catch let error as LedgerInputError {
                    // A subscription transaction the intake refuses (issue 40): nothing of it is recorded.
                    summary.refused += 1
                    logger.warning("a notification in Apple's notification history was refused", metadata: [
                        "error": "\(error.code)", "error.message": "\(error)"])
                }
            }
            progress?(summary.notifications)
            let done = !page.hasMore || page.paginationToken == nil
            try AppStoreServerAPIError.requireMoved(page.paginationToken, from: token, hasMore: !done, reading: "notification history", seen: &seen)
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
