import Foundation
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import PrivatePostgres
import Testing

/// postgres-nio's pool opens its circuit breaker once it has made no connection for a minute,
/// and then fails every lease at once until its next try, which its backoff puts up to a
/// minute away: the ledger's leases go past it on connections of their own meanwhile.
@Suite("Fault: the connection pool's circuit breaker after a long outage")
struct PoolBreakerTests {
    @Test("after an outage long enough to open the pool's circuit breaker, a lease is served as soon as PostgreSQL answers again")
    func leaseAfterLongOutage() async throws {
        let logger = TestServer.logger
        let cluster = PrivateCluster(directory: TestServer.scratchRoot.appendingPathComponent(".ledger-fault-breaker").path, durable: false)
        var running = try await cluster.start(logger: logger)
        let configuration = cluster.clientConfiguration(database: "postgres")
        let socket = try #require(configuration.unixSocketPath)
        let direct = PostgresConnection.Configuration(
            unixSocketPath: socket, username: configuration.username, password: configuration.password, database: configuration.database)
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        let pool = Task { await client.run() }
        defer { pool.cancel() }
        do {
            let database = Database(client: client, logger: logger, direct: direct)
            #expect(try await one(database) == 1)
            try await running.stop(logger: logger)
            // A lease waits while the pool tries to connect; after a minute of failures the pool
            // fails it (and every later one at once) with its circuit breaker open.
            let deadline = ContinuousClock.now + .seconds(600)
            var opened = false
            while !opened {
                do {
                    _ = try await client.withConnection { _ in }
                } catch {
                    opened = BreakerBypass.isBreakerOpen(error)
                }
                guard opened || ContinuousClock.now < deadline else { throw BreakerNeverOpened() }
                if !opened { try await Task.sleep(for: .milliseconds(200)) }
            }
            running = try await cluster.start(logger: logger)
            // A connection of its own that PostgreSQL refuses (here a database it does not hold;
            // "too many clients" alike) fails as the pool's lease did: a 503, never a 500.
            var refusing = direct
            refusing.database = "no_such_database"
            let misdirected = Database(client: client, logger: logger, direct: refusing)
            do {
                #expect(try await one(misdirected) == 1, "the pool took over first")
            } catch {
                #expect(isConnectionFailure(error), "\(String(reflecting: error))")
            }
            // PostgreSQL answers: the ledger's lease is served, whenever the pool tries again.
            #expect(try await one(database) == 1)
            #expect(try await one(database) == 1)
        } catch {
            try? await running.stop(logger: logger)
            throw error
        }
        try await running.stop(logger: logger)
    }

    struct BreakerNeverOpened: Error {}

    func one(_ database: Database) async throws -> Int? {
        for try await value in try await database.query("SELECT 1").decode(Int.self) { return value }
        return nil
    }
}
