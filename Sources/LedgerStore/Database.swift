import Logging
import PostgresNIO
import Synchronization

/// A PostgreSQL connection pool with the ledger's transaction helper.
public struct Database: Sendable {
    public let client: PostgresClient
    public let logger: Logger

    public init(client: PostgresClient, logger: Logger) {
        self.client = client
        self.logger = logger
    }

    /// Runs `body` in one database transaction on one connection, rethrowing the body's own error.
    ///
    /// PostgresClient.withTransaction wraps errors in PostgresTransactionError; callers here map
    /// PostgreSQL errors to domain errors, so they need the original.
    public func transaction<Result: Sendable>(
        _ body: (PostgresConnection) async throws -> Result
    ) async throws -> Result {
        try await client.withConnection { connection in
            try await connection.guardedQuery("BEGIN", logger: logger)
            let result: Result
            do {
                result = try await body(connection)
            } catch {
                // On a connection the server dropped, a ROLLBACK can wait forever (it is queued on
                // a connection that is closing); PostgreSQL rolls the transaction back anyway.
                if !connection.isClosed, !isConnectionFailure(error) {
                    _ = try? await connection.guardedQuery("ROLLBACK", logger: logger)
                }
                throw error
            }
            try await connection.guardedQuery("COMMIT", logger: logger)
            return result
        }
    }
}

/// True when the database could not be reached or dropped the connection, as opposed to
/// refusing a statement.
public func isConnectionFailure(_ error: any Error) -> Bool {
    if error is ConnectionClosedError { return true }
    guard let error = error as? PSQLError else { return false }
    return [.connectionError, .serverClosedConnection, .clientClosedConnection, .poolClosed, .uncleanShutdown].contains(error.code)
        || error.sqlState.map { $0.hasPrefix("08") || $0 == "57P01" || $0 == "57P02" || $0 == "57P03" } ?? false
}

extension PSQLError {
    /// The SQLSTATE of a server error, if this is one.
    var sqlState: String? { serverInfo?[.sqlState] }
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
    /// `query`, failing with `ConnectionClosedError` instead of waiting forever when the
    /// connection is or becomes closed before the query's first answer.
    ///
    /// postgres-nio (1.33) can leave a query unanswered when its connection closes: one written to
    /// a channel that is closed or closing (PostgreSQL stopped between two statements of a
    /// transaction), and one in flight when the server ends the connection (seen with a backend
    /// that terminated itself, about one run in three; and as a server that could not shut down
    /// after a database outage, its request waiting on such a query). The query runs in a task of
    /// its own, raced against the connection's close; a query postgres-nio never answers is left
    /// behind in that task, and its caller gets the error. An answer that arrives within a second
    /// of the close still wins, so a COMMIT that PostgreSQL confirmed is not reported as failed.
    @discardableResult
    public func guardedQuery(
        _ query: PostgresQuery, logger: Logger, file: String = #fileID, line: Int = #line
    ) async throws -> PostgresRowSequence {
        guard !isClosed else { throw ConnectionClosedError() }
        return try await withCheckedThrowingContinuation { continuation in
            let answer = Mutex<CheckedContinuation<PostgresRowSequence, any Error>?>(continuation)
            let finish: @Sendable (Result<PostgresRowSequence, any Error>) -> Void = { result in
                answer.withLock { $0.take() }?.resume(with: result)
            }
            let watch = InFlightQueries.shared.watch(self) { finish(.failure(ConnectionClosedError())) }
            Task {
                let result: Result<PostgresRowSequence, any Error>
                do {
                    result = .success(try await self.query(query, logger: logger, file: file, line: line))
                } catch {
                    result = .failure(error)
                }
                InFlightQueries.shared.unwatch(self, watch)
                finish(result)
            }
        }
    }
}

/// The queries waiting for their first answer, by connection; all of a connection's are failed a
/// second after it closes.
final class InFlightQueries: Sendable {
    static let shared = InFlightQueries()

    private struct State {
        var next = 0
        var byConnection: [ObjectIdentifier: [Int: @Sendable () -> Void]] = [:]
    }

    private let state = Mutex(State())

    /// Registers `fail` for a query on `connection`; answers the id that `unwatch` takes. On a
    /// connection already closed, `fail` runs at once.
    func watch(_ connection: PostgresConnection, fail: @escaping @Sendable () -> Void) -> Int {
        let key = ObjectIdentifier(connection)
        let (id, first) = state.withLock { state in
            defer { state.next += 1 }
            let first = state.byConnection[key] == nil
            state.byConnection[key, default: [:]][state.next] = fail
            return (state.next, first)
        }
        if first {
            // One callback per connection, not per query: the connection's close fails them all.
            connection.closeFuture.whenComplete { [self] _ in
                connection.eventLoop.scheduleTask(in: .seconds(1)) { self.failAll(key) }
            }
        }
        if connection.isClosed {
            unwatch(connection, id)
            fail()
        }
        return id
    }

    func unwatch(_ connection: PostgresConnection, _ id: Int) {
        state.withLock { state in
            let key = ObjectIdentifier(connection)
            state.byConnection[key]?[id] = nil
        }
    }

    private func failAll(_ key: ObjectIdentifier) {
        guard let waiting = state.withLock({ $0.byConnection.removeValue(forKey: key) }) else { return }
        for fail in waiting.values { fail() }
    }
}
