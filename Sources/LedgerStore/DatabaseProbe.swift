import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization

/// Asks PostgreSQL whether it answers, on one connection of its own outside the pool: through the
/// pool a stopped server is never a failed connection (the pool reconnects and a lease waits), and
/// a busy pool would make a healthy server look silent.
///
/// Its connection shows as `application_name` `DatabaseProbe.applicationName` in
/// `pg_stat_activity`. One check at a time: a caller that asks while one runs gets its outcome.
public actor DatabaseProbe {
    /// What one check found.
    public enum Outcome: Sendable, Equatable {
        /// PostgreSQL answered: `SELECT 1`, or an error of its own (too many connections, a bad
        /// password) — a server that answers is up.
        case answered
        /// No server to talk to: the connection was refused, or PostgreSQL said it is shutting
        /// down or starting (57P01–57P03).
        case unreachable(String)
        /// Nothing within the time-out (a slow server, or a silent one). The next check connects
        /// afresh, so one stuck backend is one miss; and it takes this check's answer too if it
        /// comes late, so a server slower than the time-out is not a silent one.
        case noAnswer
    }

    public static let applicationName = "order-ledger health probe"

    private let configuration: PostgresConnection.Configuration
    private let eventLoop: any EventLoop
    private let logger: Logger
    /// Called when PostgreSQL closes the probe's connection between checks (a shutdown, a
    /// restart): the caller checks at once instead of at its next tick.
    private let onClose: @Sendable () -> Void
    private var connection: (PostgresConnection, Flag)?
    /// The attempt of a check that went unanswered, still waiting for PostgreSQL: the next check
    /// takes its answer if it comes first (an answer late is an answer).
    private var late: EventLoopFuture<Asked>?
    /// The probe's own connection when its query is the one waiting in `late`: closed once a
    /// check is decided without it (a backend that never answers must not hold it open).
    private var lateConnection: PostgresConnection?
    private var running: Task<Outcome, Never>?
    private var connections = 0

    /// A flag set once and read from any thread: a connection's close when the probe itself
    /// closed it (not worth telling), or in `first` that an attempt decided.
    private final class Flag: Sendable {
        let flag = Atomic<Bool>(false)
    }

    /// A probe of the server `configuration` reaches: the pool's server, with the pool's
    /// credentials and TLS (`DatabaseURL.connectionConfiguration`).
    public init(_ configuration: PostgresConnection.Configuration, logger: Logger, onClose: @escaping @Sendable () -> Void = {}) {
        var configuration = configuration
        configuration.options.additionalStartupParameters = [("application_name", Self.applicationName)]
        self.configuration = configuration
        self.eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        self.logger = logger
        self.onClose = onClose
    }

    /// Checks that PostgreSQL answers `SELECT 1` within `timeout`, connection included.
    public func check(timeout: Duration) async -> Outcome {
        if let running { return await running.value }
        let task = Task { await self.checkOnce(deadline: .now() + TimeAmount(timeout)) }
        running = task
        defer { running = nil }
        return await task.value
    }

    /// Closes the probe's connection.
    public func close() {
        discard()
        late?.whenSuccess { Self.close($0.connection) }
        late = nil
        lateConnection.map(Self.close)
        lateConnection = nil
    }

    deinit {
        // A check that raced with `close()` may have left one open.
        if let open = connection?.0 { Self.close(open) }
        late?.whenSuccess { Self.close($0.connection) }
        lateConnection.map(Self.close)
    }

    private func checkOnce(deadline: NIODeadline) async -> Outcome {
        // A connection found closed or failing (not slow) may have been dropped for reasons of
        // its own (an administrator ended that backend): one fresh connection decides.
        if let (open, closedByProbe) = connection {
            let query = Self.atomicallyGuarded(open)
            switch await answer(query, by: deadline) {
            case nil:
                // Kept waiting rather than closed: the next check connects afresh and takes
                // whichever answers first, this late one or the fresh one.
                closedByProbe.flag.store(true, ordering: .relaxed)
                connection = nil
                late = query.map { _ in Asked(connection: open, error: nil) }.recover { Asked(connection: open, error: $0) }
                lateConnection = open
                return .noAnswer
            case .success?:
                return .answered
            case .failure(let error)?:
                if Self.serverAnswer(error) == .answered { return .answered }
                discard()
            }
        }
        // Connected, then asked at once on the event loop: a hop through the task pool between
        // the two would let a busy pool (a thread held by a blocking call) spend the time-out.
        let connecting: EventLoopFuture<PostgresConnection> = PostgresConnection.connect(
            on: eventLoop, configuration: configuration, id: connections, logger: logger)
        connections += 1
        let fresh = connecting.flatMap { fresh in
            Self.atomicallyGuarded(fresh).map { _ in Asked(connection: fresh, error: nil) }
                .recover { Asked(connection: fresh, error: $0) }
        }
        let asked = late.map { Self.first(late: $0, fresh: fresh, on: eventLoop) } ?? fresh
        late = nil
        guard let outcome = await answer(asked, by: deadline) else {
            // Connected or answered too late: the next check takes the answer if it comes first,
            // else its connection is closed when it comes.
            late = asked
            return .noAnswer
        }
        // Decided: the probe's own connection, if it still waits, is closed unless it answered.
        if let waiting = lateConnection, (try? outcome.get().connection) !== waiting { Self.close(waiting) }
        lateConnection = nil
        switch outcome {
        case .failure(let error):
            return Self.serverAnswer(error) ?? Self.connectFailure(error)
        case .success(let asked):
            if let error = asked.error {
                Self.close(asked.connection)
                return Self.serverAnswer(error) ?? .unreachable("\(String(reflecting: error))")
            }
            let closedByProbe = Flag()
            connection = (asked.connection, closedByProbe)
            let onClose = onClose
            asked.connection.closeFuture.whenComplete { _ in if !closedByProbe.flag.load(ordering: .relaxed) { onClose() } }
            return .answered
        }
    }

    /// A fresh connection and what its `SELECT 1` met (nil: answered).
    private struct Asked: Sendable {
        let connection: PostgresConnection
        let error: (any Error)?
    }

    /// The fresh attempt's outcome, unless the late attempt of an earlier check answers first: an
    /// answer (PostgreSQL's `SELECT 1`, or an error of its own) wins; a late attempt that fails
    /// (its connect, or without a word from PostgreSQL) is left out. The connection that loses
    /// is closed.
    private static func first(late: EventLoopFuture<Asked>, fresh: EventLoopFuture<Asked>, on loop: any EventLoop) -> EventLoopFuture<Asked> {
        let promise = loop.makePromise(of: Asked.self)
        // Set by the first to decide (the two may complete on different threads).
        let decided = Flag()
        @Sendable func decide() -> Bool { decided.flag.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged }
        late.whenComplete { result in
            guard case .success(let asked) = result else { return }
            let answered = asked.error.map { serverAnswer($0) == .answered } ?? true
            guard answered, decide() else { return close(asked.connection) }
            promise.succeed(asked)
        }
        fresh.whenComplete { result in
            guard decide() else {
                if case .success(let asked) = result { close(asked.connection) }
                return
            }
            promise.completeWith(result)
        }
        return promise.futureResult
    }

    private static func atomicallyGuarded(_ connection: PostgresConnection) -> EventLoopFuture<PostgresQueryResult> {
        connection.atomicallyGuardedQuery("SELECT 1", logger: Logger(label: "probe", factory: { _ in SwiftLogNoOpLogHandler() }))
    }

    private func discard() {
        guard let current = connection else { return }
        connection = nil
        current.1.flag.store(true, ordering: .relaxed)
        Self.close(current.0)
    }

    /// Closes `connection`, keeping it until the close completes (postgres-nio asserts that a
    /// connection is closed when it goes away).
    private static func close(_ connection: PostgresConnection) {
        connection.closeFuture.whenComplete { _ in withExtendedLifetime(connection) {} }
        let close: () -> Void = connection.close
        close()
    }

    /// PostgreSQL's own answer in `error`: up, unless it says it is shutting down or starting.
    private static func serverAnswer(_ error: any Error) -> Outcome? {
        guard let error = error as? PSQLError, let state = error.sqlState else { return nil }
        if [.adminShutdown, .crashShutdown, .cannotConnectNow].contains(state) || state.raw.hasPrefix("08") {
            return .unreachable(error.serverMessage ?? state.raw)
        }
        return .answered
    }

    /// A connection attempt that failed without a word from PostgreSQL: refused (down), or timed
    /// out (a miss).
    private static func connectFailure(_ error: any Error) -> Outcome {
        let underlying = (error as? PSQLError)?.underlying ?? error
        if case ChannelError.connectTimeout = underlying { return .noAnswer }
        return .unreachable("\(underlying)")
    }

    /// `future`'s result, or nil when it has none by `deadline`. The time-out is kept on the
    /// connection's event loop, where the answer arrives: a busy Swift task pool delays both
    /// alike, and cannot make an answer that came in time look late. Nor can a busy event loop:
    /// it runs the timers that fell due before it reads its sockets again, so a due time-out
    /// waits `Self.lastReadGrace` (one more reading turn of the loop) before it counts.
    private func answer<T: Sendable>(_ future: EventLoopFuture<T>, by deadline: NIODeadline) async -> Result<T, any Error>? {
        let loop = future.eventLoop
        let promise = loop.makePromise(of: Result<T, any Error>?.self)
        let grace = Self.lastReadGrace
        let timer = loop.flatScheduleTask(deadline: deadline) {
            loop.scheduleTask(in: grace) { promise.succeed(nil) }.futureResult
        }
        future.whenComplete { result in
            timer.cancel()
            promise.succeed(result)
        }
        return try? await promise.futureResult.get()
    }

    /// How long a due time-out waits for the event loop to read what arrived before it.
    static let lastReadGrace = TimeAmount.milliseconds(20)
}
