import Foundation
import LedgerServer
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

@Suite("Background work and the migrations at start")
struct StartOrderTests {
    @Test("no background service runs before the migrations are done")
    func servicesWaitForTheMigrations() async throws {
        let log = CollectedLog()
        try await withTestDatabase(migrated: false) { db in
            // Another instance migrating: its lock holds this server's migrations.
            let holder = try await db.connect()
            try await holder.query("SELECT pg_advisory_lock(\(Migrator.lockKey))", logger: TestServer.logger)
            var configuration = LedgerConfiguration()
            configuration.reconcileInterval = 1
            configuration.appleCallsInterval = 1
            let server = Task { try await serve(configuration, on: db, key: "", log: log) { _ in } }
            // The server's migrator waits for the lock: seen in pg_locks, not guessed.
            func waiting() async throws -> Int {
                let rows = try await holder.query("SELECT count(*)::int FROM pg_locks WHERE locktype = 'advisory' AND NOT granted", logger: TestServer.logger)
                for try await count in rows.decode(Int.self) { return count }
                return 0
            }
            while try await waiting() == 0 { try await Task.sleep(for: .milliseconds(20)) }
            // Three of the services' intervals on a database without the ledger's tables.
            try await Task.sleep(for: .seconds(3))
            try await holder.query("SELECT pg_advisory_unlock(\(Migrator.lockKey))", logger: TestServer.logger)
            try await server.value
            try await holder.close()
        }
        let errors = log.text.split(separator: "\n").filter { $0.hasPrefix("error ") }
        #expect(errors.isEmpty, "\(errors.prefix(3))")
    }
}
