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
            try await connection.query("BEGIN", logger: logger)
            let result: Result
            do {
                result = try await body(connection)
            } catch {
                _ = try? await connection.query("ROLLBACK", logger: logger)
                throw error
            }
            try await connection.query("COMMIT", logger: logger)
            return result
        }
    }
}

extension PSQLError {
    /// The SQLSTATE of a server error, if this is one.
    var sqlState: String? { serverInfo?[.sqlState] }
    /// The server's message text, if any.
    var serverMessage: String? { serverInfo?[.message] }
}
