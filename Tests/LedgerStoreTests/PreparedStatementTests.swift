import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// The store's statements prepared once per connection (postgres-nio keeps each for the
/// connection's life, and the error of one that failed to prepare with it).
@Suite("Prepared statements")
struct PreparedStatementTests {
    @Test("a statement first prepared in a transaction that had already failed does not fail its connection for good")
    func preparedInAFailedTransaction() async throws {
        try await withTestDatabase { db in
            // A pool of one: the read after the failure is sent on the connection it failed on,
            // unless that one was replaced.
            var configuration = db.configuration
            configuration.options.maximumConnections = 1
            configuration.options.minimumConnections = 0
            let client = PostgresClient(configuration: configuration, backgroundLogger: TestServer.clientLogger)
            let running = Task { await client.run() }
            defer { running.cancel() }
            let database = Database(client: client, logger: TestServer.logger)
            let events = EventStore(database: database)
            let stored = try event()
            _ = try await LedgerWriter(database: database).append([stored], to: try uniqueStream())

            // A body that went on after a failed statement: the transaction is lost, and so is
            // the read, the first of its statement on this connection.
            await #expect(throws: PSQLError.self) {
                try await database.transaction { tx in
                    _ = try? await tx.connection.guardedQuery("SELECT 1/0", logger: TestServer.logger)
                    return try await events.storedIDs([stored.id], in: tx)
                }
            }
            for _ in 0..<3 {
                let found = try await database.transaction { tx in try await events.storedIDs([stored.id, EventID()], in: tx) }
                #expect(found == [stored.id])
            }
        }
    }
}
