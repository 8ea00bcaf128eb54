import LedgerStore
import Logging
import PostgresNIO
import ServiceLifecycle
import Synchronization

/// Whether PostgreSQL answers, as the server last saw it. While it does not, the API answers 503
/// with `Retry-After` at once, and requests in flight are cancelled and answered 503 too, instead
/// of waiting for the database to come back (docs/architecture.md, "When PostgreSQL goes away").
///
/// A `DatabaseProbe` on a connection of its own decides, every `interval` (every 250 ms while
/// the database is down or a probe went unanswered, and at once when the probe's connection
/// closes or a request meets a connection failure). Down: a refused connection, or PostgreSQL
/// saying it shuts down, at once; or `missesBeforeDown` probes in a row unanswered within
/// `timeout` each. A slow database is not a down one: one or two late answers change nothing, a
/// missed probe's answer that comes late answers the next probe (`DatabaseProbe`), and a probe is
/// no miss when PostgreSQL answered the pool's work while it waited (`answers`).
public final class DatabaseHealth: Service, Sendable {
    private struct State {
        /// False until a probe has decided (readiness then probes itself).
        var known = false
        var downSince: ContinuousClock.Instant?
        /// Probes unanswered in a row.
        var misses = 0
        /// A probe went unanswered while the pool's work was answered, and that was logged.
        var slowTold = false
        /// Requests in progress: each one's cancel, called when the database goes down.
        var inFlight: [Int: @Sendable () -> Void] = [:]
        var nextRequest = 0
    }

    private let state = Mutex(State())
    private let probe: DatabaseProbe
    /// PostgreSQL's answers to the ledger's pool (nil: the probe alone decides).
    private let answers: DatabaseAnswers?
    private let wakeup: Wakeup
    let logger: Logger
    let interval: Duration
    let timeout: Duration
    let missesBeforeDown: Int

    /// Health of the server `configuration` reaches (the pool's server, credentials and TLS: the
    /// probe opens a connection of its own there), whose pool counts its `answers`.
    public init(
        probing configuration: PostgresConnection.Configuration, answers: DatabaseAnswers? = nil, logger: Logger,
        interval: Duration = .seconds(1), timeout: Duration = .seconds(2), missesBeforeDown: Int = 3
    ) {
        let wakeup = Wakeup()
        self.wakeup = wakeup
        self.answers = answers
        self.probe = DatabaseProbe(configuration, logger: logger, onClose: { wakeup.signal() })
        self.logger = logger
        self.interval = interval
        self.timeout = timeout
        self.missesBeforeDown = missesBeforeDown
    }

    public var isAvailable: Bool { state.withLock { $0.downSince == nil } }

    /// Whether the database is up: as last decided, or by a probe now when nothing is decided yet.
    public func availability() async -> Bool {
        if state.withLock({ $0.known }) { return isAvailable }
        return await probeNow()
    }

    /// A request met a connection failure: probe now rather than at the next tick (a pooled
    /// connection can fail while PostgreSQL is fine; the probe decides).
    func suspect() {
        wakeup.signal()
    }

    func markUnavailable(_ reason: String) {
        let cancels: [@Sendable () -> Void]? = state.withLock { state in
            state.known = true
            state.misses = 0
            guard state.downSince == nil else { return nil }
            state.downSince = .now
            defer { state.inFlight = [:] }
            return Array(state.inFlight.values)
        }
        guard let cancels else { return }
        logger.warning("the database is unavailable; the API answers 503 until it is back", metadata: ["reason": "\(reason)"])
        for cancel in cancels { cancel() }
    }

    func markAvailable() {
        let since = state.withLock { state in
            defer {
                state.known = true
                state.misses = 0
                state.slowTold = false
                state.downSince = nil
            }
            return state.downSince
        }
        if let since {
            logger.notice("the database is back", metadata: ["down.seconds": "\((ContinuousClock.now - since).inSeconds)"])
        }
    }

    /// Keeps `cancel` until `remove` and calls it once if the database is marked down before;
    /// nil, keeping nothing, when it is down already.
    func whenUnavailable(_ cancel: @escaping @Sendable () -> Void) -> Int? {
        state.withLock { state in
            guard state.downSince == nil else { return nil }
            defer { state.nextRequest += 1 }
            state.inFlight[state.nextRequest] = cancel
            return state.nextRequest
        }
    }

    /// Forgets a request's cancel; false when the database was marked down meanwhile (and the
    /// cancel is being or has been called).
    func remove(_ request: Int) -> Bool {
        state.withLock { $0.inFlight.removeValue(forKey: request) } != nil
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                await self.probeNow()
                guard !Task.isCancelled else { break }
                let doubtful = self.state.withLock { $0.downSince != nil || $0.misses > 0 }
                await self.wakeup.wait(atMost: doubtful ? .milliseconds(250) : self.interval)
            }
        }
        await probe.close()
    }

    /// Probes once (joining a probe under way) and applies its outcome; answers whether the
    /// database is up.
    @discardableResult
    func probeNow() async -> Bool {
        let answeredBefore = answers?.total
        switch await probe.check(timeout: timeout) {
        case .answered:
            markAvailable()
        case .unreachable(let reason):
            markUnavailable(reason)
        case .noAnswer where answers?.total != answeredBefore:
            // PostgreSQL answered the pool meanwhile: it is slow (or the probe's way to it is),
            // not silent. No miss; told once until a probe is answered again.
            let told = state.withLock { state in
                defer { state.slowTold = true }
                return state.slowTold
            }
            if !told {
                logger.notice("the database did not answer a health probe in time but answered the ledger's work meanwhile: slow, not down",
                              metadata: ["probe.timeout": "\(timeout)"])
            }
        case .noAnswer:
            let misses = state.withLock { state in
                state.misses += 1
                return state.misses
            }
            if misses >= missesBeforeDown {
                markUnavailable("no answer to \(misses) health probes in a row (\(timeout) each)")
            } else if isAvailable {
                logger.notice("the database did not answer a health probe in time; not down before \(missesBeforeDown) in a row",
                              metadata: ["probe.misses": "\(misses)", "probe.timeout": "\(timeout)"])
            }
        }
        return isAvailable
    }
}
