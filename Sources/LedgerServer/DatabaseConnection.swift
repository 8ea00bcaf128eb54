import LedgerStore
import PrivatePostgres
import Logging
import PostgresNIO

/// The database the ledger runs on, opened from the configuration: a configured server, or the
/// private cluster started (or reused) for this process.
public struct OpenedDatabase: Sendable {
    public let clientConfiguration: PostgresClient.Configuration
    /// The same database for a single connection of its own (the health probe's), with the
    /// pool's credentials and TLS.
    public let connectionConfiguration: PostgresConnection.Configuration
    /// Set when the private cluster is in use.
    public let privateCluster: RunningPrivateCluster?

    /// Opens the configured database, starting the private cluster when no URL is given.
    public static func open(_ source: LedgerConfiguration.DatabaseSource, durable: Bool = true, logger: Logger) async throws -> OpenedDatabase {
        switch source {
        case .url(let url):
            logger.info("using the configured database", metadata: ["db.url": "\(url)"])
            return OpenedDatabase(
                clientConfiguration: url.clientConfiguration, connectionConfiguration: try url.connectionConfiguration(), privateCluster: nil)
        case .privateCluster(let directory):
            let cluster = PrivateCluster(directory: directory, durable: durable)
            let running = try await cluster.start(logger: logger)
            do {
                try await ensureDatabaseExists(cluster.clientConfiguration(), logger: logger)
            } catch {
                try? await running.stop(logger: logger)
                throw error
            }
            return OpenedDatabase(
                clientConfiguration: cluster.clientConfiguration(),
                connectionConfiguration: .init(
                    unixSocketPath: cluster.socketPath, username: PrivateCluster.user, password: nil, database: PrivateCluster.database),
                privateCluster: running)
        }
    }

    /// Connects once, outside the pool, and says why that failed in PostgreSQL's words (a
    /// database or role that does not exist, a refused password) or the network's (refused, no
    /// socket): through the pool a one-off command only learns, a minute later, that connections
    /// kept failing. Nil when the connection was made.
    public func firstConnectionProblem(logger: Logger) async -> String? {
        do {
            let connection = try await PostgresConnection.connect(configuration: connectionConfiguration, id: 0, logger: logger)
            try? await connection.close()
            return nil
        } catch let error as PSQLError {
            if let message = error.serverInfo?[.message] {
                return "the database refused the connection: \(message) (SQLSTATE \(error.serverInfo?[.sqlState] ?? "?"))"
            }
            return "the database could not be reached: \(error.underlying.map { "\($0)" } ?? "\(error.code)")"
        } catch {
            return "the database could not be reached: \(error)"
        }
    }

    /// Stops the private cluster if this process owns it, blocking the calling thread: for the
    /// end of a command (`defer`), where no task waits for the thread.
    public func close(logger: Logger) throws {
        try privateCluster?.stopBlocking(logger: logger)
    }
}
