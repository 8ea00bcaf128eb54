import Hummingbird
import LedgerStore
import Logging
import ServiceLifecycle
import Synchronization

/// Whether PostgreSQL answers, as the server last saw it. While it does not, the API answers 503
/// with `Retry-After` at once instead of queueing requests on the pool until their clients give
/// up; a probe notices when it is back. A connection failure seen by any request marks it down at
/// once; the probe (every `interval` while up, every 250 ms while down) marks it up again.
public final class DatabaseHealth: Service, Sendable {
    private struct State {
        var downSince: ContinuousClock.Instant?
        /// Requests in progress: each one's cancel, called when the database goes down.
        var inFlight: [Int: @Sendable () -> Void] = [:]
        var nextRequest = 0
    }

    private let state = Mutex(State())
    let database: Database
    var logger: Logger { database.logger }
    let interval: Duration
    let timeout: Duration

    public init(database: Database, interval: Duration = .seconds(1), timeout: Duration = .seconds(2)) {
        self.database = database
        self.interval = interval
        self.timeout = timeout
    }

    public var isAvailable: Bool { state.withLock { $0.downSince == nil } }

    func markUnavailable(_ reason: String) {
        let cancels: [@Sendable () -> Void]? = state.withLock { state in
            guard state.downSince == nil else { return nil }
            state.downSince = .now
            defer { state.inFlight = [:] }
            return Array(state.inFlight.values)
        }
        guard let cancels else { return }
        logger.warning("the database is unavailable; the API answers 503 until it is back", metadata: ["reason": "\(reason)"])
        for cancel in cancels { cancel() }
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

    func markAvailable() {
        let since = state.withLock { state in
            defer { state.downSince = nil }
            return state.downSince
        }
        if let since {
            logger.notice("the database is back", metadata: ["down.seconds": "\((ContinuousClock.now - since).components.seconds)"])
        }
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                try? await Task.sleep(for: self.isAvailable ? self.interval : .milliseconds(250))
                guard !Task.isCancelled else { return }
                if await self.probe() { self.markAvailable() } else { self.markUnavailable("no answer to the health probe within \(self.timeout)") }
            }
        }
    }

    /// True when `SELECT 1` is answered within `timeout` (a pool waiting to reconnect is not).
    func probe() async -> Bool {
        do {
            return try await withThrowingTaskGroup(of: Bool.self) { group in
                group.addTask {
                    // Database.query: a statement that postgres-nio left unanswered would keep
                    // this group, and so the server's shutdown, waiting forever.
                    try await self.database.query("SELECT 1")
                    return true
                }
                group.addTask {
                    try await Task.sleep(for: self.timeout)
                    return false
                }
                defer { group.cancelAll() }
                return try await group.next() ?? false
            }
        } catch {
            return false
        }
    }
}

/// Answers 503 `database-unavailable` with `Retry-After` on every route that needs the database
/// while `DatabaseHealth` has it down, and marks it down when a request meets a connection failure.
/// Health, readiness and metrics always answer.
struct DatabaseGateMiddleware: RouterMiddleware {
    typealias Context = LedgerRequestContext

    let health: DatabaseHealth

    static let ungated: Set<String> = ["/healthz", "/readyz", "/metrics"]

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard !Self.ungated.contains(request.uri.path) else { return try await next(request, context) }
        guard health.isAvailable else { throw APIError.databaseUnavailable }
        do {
            // A request waiting on the pool while the database is gone would wait until it is
            // back: once the database is marked down its handler is cancelled, and when the
            // handler has stopped it is answered 503. Nothing is lost: a write either committed
            // (and the client's retry with the same ids answers it) or did not. The handler runs
            // in a task of its own, which the health cancels (a task group of the handler and a
            // task waiting for the health cost 2% of the server's CPU and two more task switches
            // a request).
            return try await withoutActuallyEscaping(next) { next in
                let handler = UncheckedSendable(next)
                let task = Task { try await handler.value(request, context) }
                guard let registered = health.whenUnavailable({ task.cancel() }) else {
                    task.cancel()
                    _ = try? await task.value
                    throw APIError.databaseUnavailable
                }
                let outcome: Result<Response, any Error>
                do {
                    outcome = .success(try await withTaskCancellationHandler { try await task.value } onCancel: { task.cancel() })
                } catch {
                    outcome = .failure(error)
                }
                // Marked down meanwhile: 503, whatever the cancelled handler ended with.
                guard health.remove(registered) else { throw APIError.databaseUnavailable }
                return try outcome.get()
            }
        } catch where isConnectionFailure(error) {
            health.markUnavailable("\(error)")
            throw error
        }
    }
}

/// The middleware's `next`, run by a task that ends before `withoutActuallyEscaping` returns (its
/// value is awaited); the caller does nothing with it meanwhile.
private struct UncheckedSendable<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

extension APIError {
    /// The answer while PostgreSQL cannot be reached: retry shortly, the same request again.
    static var databaseUnavailable: APIError {
        APIError(.serviceUnavailable, code: "database-unavailable", message: "the database is unavailable; retry later with the same request",
                 headers: [.retryAfter: "2"])
    }
}
