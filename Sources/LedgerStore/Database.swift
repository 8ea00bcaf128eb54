// LedgerStore: PostgreSQL, and the only module with SQL text (the writer, the log, projections, migrations, leases, queries).

import LedgerCore
import Logging
import NIOCore
import PostgresNIO
import _ConnectionPoolModule
import Synchronization

/// A PostgreSQL connection pool with the ledger's transaction helper.
public struct Database: Sendable {
    public let client: PostgresClient
    public let logger: Logger
    /// Where the group-commit writer runs: the event loop of `client`'s connections
    /// (`EventLoopTaskExecutor`, as `ledger serve` runs), else the global executor.
    public let writerExecutor: (any TaskExecutor)?
    /// Told the types of the events the ledger appended, once they are committed (the server
    /// counts them by type for `GET /metrics`); a retry that appended nothing is not told. Set
    /// with `observingAppends`.
    private var appendObserver: (@Sendable (_ types: [String]) -> Void)?
    /// PostgreSQL's answers to the work on this pool, counted for the health's probe.
    public let answers = DatabaseAnswers()
    /// Where a lease goes while the pool makes no connection (`BreakerBypass`); nil: nowhere.
    let bypass: BreakerBypass?

    /// `direct`: the server `client` connects to, for connections of their own while the pool's
    /// circuit breaker is open (`BreakerBypass`); nil: none.
    public init(
        client: PostgresClient, logger: Logger, writerExecutor: (any TaskExecutor)? = nil, direct: PostgresConnection.Configuration? = nil
    ) {
        self.client = client
        self.logger = logger
        self.writerExecutor = writerExecutor
        self.bypass = direct.map { BreakerBypass(configuration: $0) }
    }

    /// Counts in `answers` an end of work PostgreSQL answered: a result (`error` nil), or an
    /// error of its own.
    func noteAnswer(_ error: (any Error)? = nil) {
        guard let error else { return answers.note() }
        if (error as? PSQLError)?.sqlState != nil { answers.note() }
    }

    /// This database, its appends told to `observer` instead.
    public func observingAppends(_ observer: @escaping @Sendable (_ types: [String]) -> Void) -> Database {
        var database = self
        database.appendObserver = observer
        return database
    }

    /// The events appended in the transaction `transaction` has open on one connection, told to
    /// the observer once its COMMIT returns; nil once that transaction ended (a task started in
    /// it and outliving it then reports its appends at once).
    private final class PendingAppends: Sendable {
        let connection: ObjectIdentifier
        let types = Mutex<[String]?>([])

        init(_ connection: PostgresConnection) {
            self.connection = ObjectIdentifier(connection)
        }

        /// Holds `types` until the transaction ends; false once it has ended.
        func hold(_ appended: [String]) -> Bool {
            types.withLock { held in
                held?.append(contentsOf: appended)
                return held != nil
            }
        }

        /// The types appended, and the end of the transaction ([] once it has ended).
        func close() -> [String] {
            types.withLock { types in
                defer { types = nil }
                return types ?? []
            }
        }
    }

    @TaskLocal private static var pendingAppends: PendingAppends?

    /// Tells the observer that events of `types` were appended: at once when they are committed
    /// (`connection` nil, or a connection outside `transaction`, whose statements commit on their
    /// own), else when the transaction open on `connection` commits. (An append in a transaction
    /// opened some other way than `transaction` is told at once, whatever becomes of it.)
    func appended(_ types: @autoclosure () -> [String], on connection: PostgresConnection?) {
        guard let appendObserver else { return }
        let types = types()
        guard !types.isEmpty else { return }
        if let connection, let pending = Self.pendingAppends, pending.connection == ObjectIdentifier(connection),
           pending.hold(types) {
            return
        }
        appendObserver(types)
    }

    /// Runs `body` in one database transaction on one connection, rethrowing the body's own error.
    ///
    /// PostgresClient.withTransaction wraps errors in PostgresTransactionError; callers here map
    /// PostgreSQL errors to domain errors, so they need the original.
    public func transaction<Result: Sendable>(
        _ body: (DatabaseTransaction) async throws -> Result
    ) async throws -> Result {
        try await withConnection { connection in try await transaction(on: connection, body) }
    }

    /// `transaction(_:)` on the connection the current group-commit writer holds
    /// (`holdingConnection`), else on a leased one: for a writer's batches, which then wait for no lease.
    public func heldTransaction<Result: Sendable>(
        _ body: (DatabaseTransaction) async throws -> Result
    ) async throws -> Result {
        try await withHeldConnection { connection in try await transaction(on: connection, body) }
    }

    private func transaction<Result: Sendable>(
        on connection: PostgresConnection, _ body: (DatabaseTransaction) async throws -> Result
    ) async throws -> Result {
        let transaction = DatabaseTransaction(connection)
        _ = try await Self.first(try await connection.atomicallyGuardedQuery("BEGIN", logger: logger).get())
        let pending = appendObserver == nil ? nil : PendingAppends(connection)
        // Whatever ends the transaction ends the list (after COMMIT, `close` has taken it).
        defer { _ = pending?.close() }
        let result: Result
        do {
            if let pending {
                result = try await Self.$pendingAppends.withValue(pending) { try await body(transaction) }
            } else {
                result = try await body(transaction)
            }
        } catch {
            // On a connection the server dropped, a ROLLBACK can wait forever (it is queued on
            // a connection that is closing); PostgreSQL rolls the transaction back anyway. The
            // pool's own error (no new connection made) says nothing of this open one.
            if !connection.isClosed, !isConnectionFailure(error) || error is ConnectionPoolError {
                _ = try? await connection.guardedQuery("ROLLBACK", logger: logger)
            }
            throw error
        }
        try await connection.guardedQuery("COMMIT", logger: logger)
        if let pending, let appendObserver {
            let types = pending.close()
            if !types.isEmpty { appendObserver(types) }
        }
        return result
    }

    /// Runs one statement on a pooled connection and answers all its rows. Use this, not
    /// `client.query`: after PostgreSQL closed a connection, the pool can hand it out once more
    /// before it has heard of the close, and postgres-nio (1.33) leaves a statement written to
    /// such a connection unanswered forever. Here the statement is written only after the
    /// connection is seen open on its own event loop (nothing can close it in between), and a
    /// connection found closed is taken out of the pool and another one leased.
    @discardableResult
    public func query(_ query: PostgresQuery, file: String = #fileID, line: Int = #line) async throws -> PooledRows {
        try await withConnection { connection in
            PooledRows(rows: try await Self.first(try await connection.atomicallyGuardedQuery(query, logger: logger, file: file, line: line).get().rows))
        }
    }

    /// Leases a pooled connection for `body`; cancellation ends the wait for a lease and closes
    /// the connection under a statement in flight. A connection that closed is handed back only once the
    /// pool knows of the close. When `body`'s first statement (wrapped in `first`) finds the
    /// connection closed, nothing reached PostgreSQL, and `body` runs again on another connection
    /// (three tries in all).
    public func withConnection<Result: Sendable>(
        _ body: (PostgresConnection) async throws -> Result
    ) async throws -> Result {
        /// `body` on a connection of a lease, PostgreSQL's answer counted for the health's probe.
        nonisolated(nonsending) func leased(_ connection: PostgresConnection) async throws -> Result {
            do {
                // Cancelled (a request answered 503 while the database is away), a statement in
                // flight would still wait for PostgreSQL: the connection is closed, which ends it
                // at once (a transaction open on it rolls back).
                let result = try await withTaskCancellationHandler { try await body(connection) } onCancel: { connection.close() }
                noteAnswer()
                return result
            } catch {
                noteAnswer(error)
                // The pool learns of a close from the connection's close future (completed one
                // event-loop turn after the channel went inactive, which `isClosed` reads); until
                // then, a connection given back is leased again as if open.
                if connection.isClosed { _ = try? await connection.closeFuture.get() }
                throw error
            }
        }
        var tries = 0
        while true {
            tries += 1
            do {
                return try await client.withConnection { connection in try await leased(connection) }
            } catch is StaleConnection {
                if tries == 3 { throw ConnectionClosedError() }
            } catch {
                guard let bypass, BreakerBypass.isBreakerOpen(error) else { throw error }
                return try await bypass.withConnection(logger: logger, error: error) { connection in
                    do {
                        return try await leased(connection)
                    } catch is StaleConnection {
                        throw ConnectionClosedError()
                    }
                }
            }
        }
    }

    /// `statement`, the first of a lease: when it finds the connection closed, `withConnection`
    /// may lease another.
    static func first<T>(_ statement: @autoclosure () async throws -> T) async throws -> T {
        do {
            return try await statement()
        } catch is ConnectionClosedError {
            throw StaleConnection()
        }
    }
}

/// Connections of their own while the pool's circuit breaker is open. postgres-nio's pool (1.33)
/// opens it once it has made no connection for a minute, and then fails every lease at once
/// until its next try, up to a minute after PostgreSQL is back (its backoff grows to a minute):
/// a server would answer 503 that long after an outage while PostgreSQL answers. Meanwhile each
/// lease opens a connection of its own, used once and closed, at most `limit` at a time (more
/// fail as the pool's did); the pool takes over again at its next try.
public final class BreakerBypass: Sendable {
    let configuration: PostgresConnection.Configuration
    /// Connections of their own open at once, at most.
    static let limit = 8
    private let open = Mutex(0)
    private let ids = Atomic<Int>(0)

    init(configuration: PostgresConnection.Configuration) {
        self.configuration = configuration
    }

    /// Whether `error` is the pool's open circuit breaker.
    public static func isBreakerOpen(_ error: any Error) -> Bool {
        (error as? ConnectionPoolError) == .connectionCreationCircuitBreakerTripped
    }

    /// `body` on a connection of its own, closed afterwards; `poolError` (the pool's) when `limit`
    /// are open already, or when the connection cannot be made.
    func withConnection<Result: Sendable>(
        logger: Logger, error poolError: any Error, _ body: (PostgresConnection) async throws -> Result
    ) async throws -> Result {
        guard open.withLock({ open in
            guard open < Self.limit else { return false }
            open += 1
            return true
        }) else { throw poolError }
        defer { open.withLock { $0 -= 1 } }
        let id = ids.add(1, ordering: .relaxed).newValue
        if id == 1 || id % 1000 == 0 {
            logger.notice("the connection pool makes no connection for now; leases open connections of their own", metadata: ["connections": "\(id)"])
        }
        let connection: PostgresConnection
        do {
            connection = try await PostgresConnection.connect(configuration: configuration, id: -id, logger: logger)
        } catch {
            // PostgreSQL refuses the connection too ("too many clients", a role's limit, a bad
            // password), or is away: the lease fails as the pool's did, a 503 like it.
            logger.debug("a connection of its own past the pool's breaker failed", metadata: ["error": "\(String(reflecting: error))"])
            throw poolError
        }
        do {
            let result = try await body(connection)
            try? await connection.close()
            return result
        } catch {
            try? await connection.close()
            throw error
        }
    }
}

/// True when the database could not be reached or dropped the connection, as opposed to
/// refusing a statement.
public func isConnectionFailure(_ error: any Error) -> Bool {
    if error is ConnectionClosedError { return true }
    // The pool made no connection for a while: PostgreSQL refuses new ones ("too many clients",
    // a connection limit) or cannot be reached. The request is answered 503; whether PostgreSQL
    // is down, the health's probe decides.
    if let error = error as? ConnectionPoolError, error == .connectionCreationCircuitBreakerTripped { return true }
    guard let error = error as? PSQLError else { return false }
    if [.connectionError, .serverClosedConnection, .clientClosedConnection, .poolClosed, .uncleanShutdown].contains(error.code) {
        return true
    }
    guard let state = error.sqlState else { return false }
    // Class 08 is every connection exception; 57P01-57P03 a server shutting down or starting.
    return state.raw.hasPrefix("08") || [.adminShutdown, .crashShutdown, .cannotConnectNow].contains(state)
}

/// What PostgreSQL said of `error`, for a person: its message and SQLSTATE (postgres-nio's own
/// description of a server error is a generic sentence), or nil when `error` is no database error.
public func databaseErrorDescription(_ error: any Error) -> String? {
    if let error = error as? ConnectionPoolError, error == .connectionCreationCircuitBreakerTripped {
        // The pool's own name for it says nothing of the database.
        return "the database could not be reached: no new connection could be made for a while (PostgreSQL stopped, refusing connections, or unreachable)"
    }
    guard let error = error as? PSQLError else { return nil }
    if let message = error.serverMessage {
        return "the database refused a statement: \(message) (SQLSTATE \(error.sqlState?.raw ?? "?"))"
    }
    return "the database could not be used: \(error.code)"
}

extension PSQLError {
    /// The SQLSTATE of a server error, if this is one.
    public var sqlState: PostgresError.Code? { serverInfo?[.sqlState].map(PostgresError.Code.init(raw:)) }
    /// The server's message text, if any.
    var serverMessage: String? { serverInfo?[.message] }
}

/// A query sent on a connection that PostgreSQL already closed (a restart or failover between two
/// statements of a transaction). Nothing of the transaction committed.
public struct ConnectionClosedError: Error, CustomStringConvertible {
    public init() {}
    public var description: String { "the database closed the connection" }
}

extension PostgresConnection {
    /// `query`, failing at once on a connection that is already closed. postgres-nio (1.33) writes
    /// a query to a closed channel without ever failing it, and the caller would wait forever —
    /// seen when PostgreSQL stops between two statements of a transaction. A window remains: a
    /// close that PostgreSQL sent but this client has not read yet when the statement goes out;
    /// and a query in flight when the connection closes may not be answered either.
    @discardableResult
    public func guardedQuery(
        _ query: PostgresQuery, logger: Logger, file: String = #fileID, line: Int = #line
    ) async throws -> PostgresRowSequence {
        guard !isClosed else { throw ConnectionClosedError() }
        return try await self.query(query, logger: logger, file: file, line: line)
    }
}

extension PostgresConnection {
    /// `query`, written to the connection only if it is open when the event loop takes the write:
    /// a check made anywhere else can race with the close (postgres-nio writes a statement to a
    /// channel whose handlers are gone, and never answers it). Answers every row at once.
    func atomicallyGuardedQuery(
        _ query: PostgresQuery, logger: Logger, file: String = #fileID, line: Int = #line
    ) -> EventLoopFuture<PostgresQueryResult> {
        eventLoop.flatSubmit {
            // On the event loop: `isClosed` cannot change before the write below reaches the
            // connection's handler, which fails the statement itself if the connection closes later.
            guard !self.isClosed else { return self.eventLoop.makeFailedFuture(ConnectionClosedError()) }
            return self.query(query, logger: logger, file: file, line: line)
        }
    }
}

extension Database {
    /// How many times `transactionAgainAfterLostRace` runs a transaction that keeps losing: a
    /// notification, two proofs, a sweep and the backend's own event of one transaction at once
    /// deadlocked a request through three.
    static let raceAttempts = 8

    /// `transaction(body)`, again from its start when it lost a race inside PostgreSQL: a deadlock
    /// PostgreSQL broke with a writer that took the same locks the other way round, or a unique
    /// key taken meanwhile (`lost`: what else the caller counts as a lost race). Nothing of a
    /// failed attempt is stored; `raceAttempts` in all, a few milliseconds apart.
    public func transactionAgainAfterLostRace<Result: Sendable>(
        lost: (any Error) -> Bool = isLostRace, _ body: (DatabaseTransaction) async throws -> Result
    ) async throws -> Result {
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try await transaction(body)
            } catch where attempt < Self.raceAttempts && lost(error) {
                logger.debug("a transaction lost a race; again", metadata: ["error": "\(String(reflecting: error))"])
                // Apart, a little at random: writers that deadlocked once meet again less often.
                try await Task.sleep(for: .milliseconds(Int.random(in: 1...10) * attempt))
            }
        }
    }
}

/// A database transaction open on one connection (`Database.transaction`): what the store's
/// functions that read or write inside it are given. Its streams' locks and rows stay as the
/// transaction took and wrote them until it ends.
public struct DatabaseTransaction: Sendable {
    public let connection: PostgresConnection

    /// A transaction the caller opened on `connection` itself (tests that hold one open).
    public init(_ connection: PostgresConnection) {
        self.connection = connection
    }
}

/// True when PostgreSQL refused a statement because a concurrent writer won: a unique key taken
/// meanwhile, or a deadlock it broke. Run from the start again, the loser sees the winner.
public func isLostRace(_ error: any Error) -> Bool {
    guard let error = error as? PSQLError else { return false }
    return error.sqlState == .uniqueViolation || error.sqlState == .deadlockDetected
}

/// True when PostgreSQL broke a deadlock or a serialization conflict between concurrent writers:
/// the transaction it ended wrote nothing, and the same work again goes through once the others
/// are done.
public func isTransientConflict(_ error: any Error) -> Bool {
    guard let error = error as? PSQLError else { return false }
    return error.sqlState == .deadlockDetected || error.sqlState == .serializationFailure
}

/// The message of a statement PostgreSQL refused for a value the caller sent (\u0000 in JSON,
/// malformed text for a type, too long, out of range, a check constraint, an index row too
/// large), or nil for any other error: the API answers it 400, not 500.
public func refusedValueMessage(_ error: any Error) -> String? {
    guard let error = error as? PSQLError, let state = error.sqlState else { return nil }
    let clientData: [PostgresError.Code] = [
        .untranslatableCharacter, .characterNotInRepertoire, .invalidTextRepresentation, .stringDataRightTruncationException, .numericValueOutOfRange,
        .datetimeFieldOverflow, .checkViolation, .programLimitExceeded,
    ]
    guard clientData.contains(state) else { return nil }
    return error.serverMessage ?? state.raw
}

extension PostgresConnection {
    /// A prepared statement (parsed and analysed once per connection, not at every call), written
    /// only if the connection is open when the event loop takes the write, as
    /// `atomicallyGuardedQuery`: the check and postgres-nio's write run on the connection's event
    /// loop with no suspension between them. Answers every row.
    func atomicallyGuardedExecute<Statement: PostgresPreparedStatement>(
        _ statement: Statement, logger: Logger
    ) async throws -> [Statement.Row] {
        guard eventLoop.inEventLoop else {
            return try await withTaskExecutorPreference(EventLoopTaskExecutor(eventLoop)) {
                try await atomicallyGuardedExecute(statement, logger: logger)
            }
        }
        guard !isClosed else { throw ConnectionClosedError() }
        var rows: [Statement.Row] = []
        do {
            for try await row in try await execute(statement, logger: logger) { rows.append(row) }
        } catch let error as PSQLError where !Self.keepsPreparedStatements(after: error) {
            // postgres-nio keeps the error of a failed preparation for the connection's life and
            // answers it to every later execution of the statement: prepared first inside a
            // transaction that had already failed, or while a lock it waited for timed out, the
            // statement would fail on this connection for good. Closed (its transaction is lost
            // anyway), the connection is replaced by a fresh one.
            let _: EventLoopFuture<Void> = close()
            throw error
        }
        return rows
    }

    /// Whether `error`, from a prepared statement, cannot have come from preparing it: a
    /// statement's own refusals as it runs (data exceptions, a unique or check constraint, a
    /// value too large, the routines' RAISEs), which leave the connection as it was. Any other
    /// server error may have been the preparation's, and the connection is closed.
    static func keepsPreparedStatements(after error: PSQLError) -> Bool {
        guard let state = error.sqlState?.raw else { return true }
        return ["22", "23", "54", "LE"].contains(String(state.prefix(2))) || state == "P0001"
    }
}

extension PostgresPreparedStatement where Row == PostgresRow {
    /// A statement whose rows its caller reads column by column.
    public func decodeRow(_ row: PostgresRow) -> PostgresRow { row }
}

/// A lease found its connection closed before sending anything on it.
struct StaleConnection: Error {}

/// The rows of `Database.query`, all read before the connection went back to the pool; decoded
/// like postgres-nio's `PostgresRowSequence`.
public struct PooledRows: AsyncSequence, Sendable {
    public typealias Element = PostgresRow
    public let rows: [PostgresRow]

    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: IndexingIterator<[PostgresRow]>
        public mutating func next() async throws -> PostgresRow? { base.next() }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(base: rows.makeIterator()) }
}

/// Runs `body` with a running client (on `eventLoopGroup`, else postgres-nio's default loops),
/// shutting the client down afterwards: for commands and tools that use the database for a while.
public func withPostgresClient<Result: Sendable>(
    _ configuration: PostgresClient.Configuration, eventLoopGroup: (any EventLoopGroup)? = nil, logger: Logger,
    _ body: @Sendable (PostgresClient) async throws -> Result
) async throws -> Result {
    let client = eventLoopGroup.map { PostgresClient(configuration: configuration, eventLoopGroup: $0, backgroundLogger: logger) }
        ?? PostgresClient(configuration: configuration, backgroundLogger: logger)
    return try await withThrowingTaskGroup(of: Void.self) { group in
        // `body` waits for the client's run to be under way: a lease before it makes postgres-nio
        // warn that run() has not been called (it had been, on another thread, a moment before).
        let (started, starting) = AsyncStream.makeStream(of: Void.self)
        group.addTask {
            starting.finish()
            await client.run()
        }
        defer { group.cancelAll() }
        for await _ in started {}
        await Task.yield()
        return try await body(client)
    }
}

/// Creates the database `configuration` names on its server unless it exists (the private
/// cluster's `ledger` database, at every start).
public func ensureDatabaseExists(_ configuration: PostgresClient.Configuration, logger: Logger) async throws {
    guard let name = configuration.database else { return }
    var admin = configuration
    admin.database = "postgres"
    try await withPostgresClient(admin, logger: logger) { client in
        let rows = try await client.query("SELECT count(*)::int FROM pg_database WHERE datname = \(name)", logger: logger)
        for try await count in rows.decode(Int.self) where count > 0 { return }
        do {
            let quoted = "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
            try await client.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(quoted)"), logger: logger)
        } catch let error as PSQLError where error.sqlState == .duplicateDatabase {
            // Created meanwhile by another process.
        }
    }
}

/// Drops the database `name` of the server `server` reaches (its `postgres` database), if it
/// exists, connections and all; then, with `create`, makes it again, empty. For scratch
/// databases of the demo and the benchmarks (`name` is a constant of theirs, never input).
public func resetDatabase(_ name: String, on server: PostgresClient.Configuration, create: Bool = true, logger: Logger) async throws {
    var admin = server
    admin.database = "postgres"
    try await withPostgresClient(admin, logger: logger) { client in
        try await client.query(PostgresQuery(unsafeSQL: "DROP DATABASE IF EXISTS \(name) WITH (FORCE)"), logger: logger)
        if create { try await client.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name)"), logger: logger) }
    }
}
