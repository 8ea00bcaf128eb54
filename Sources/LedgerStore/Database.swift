import Logging
import PostgresNIO

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
