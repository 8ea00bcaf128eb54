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
        try await withTestDatabase { db in try await db.withPoolOfOne { database in
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
        } }
    }

    @Test("a statement whose preparation waited for a lock past lock_timeout does not fail its connection for good")
    func preparedPastALockTimeout() async throws {
        try await withTestDatabase { db in
            try await db.withPoolOfOne { database in
                let subscriptions = SubscriptionStore(database: database)
                // Another session holds the table, as a projection rebuild's TRUNCATE does.
                let holder = try await db.connect(id: 9)
                try await holder.query("BEGIN", logger: TestServer.logger)
                try await holder.query("LOCK TABLE subscriptions IN ACCESS EXCLUSIVE MODE", logger: TestServer.logger)
                await #expect(throws: PSQLError.self) {
                    try await database.transaction { tx in
                        try await tx.connection.guardedQuery("SET LOCAL lock_timeout = '50ms'", logger: TestServer.logger)
                        return try await subscriptions.subscriptions(["1000000001"], periodKeys: ["1"], in: tx)
                    }
                }
                try await holder.query("ROLLBACK", logger: TestServer.logger)
                try await holder.close()
                for _ in 0..<3 {
                    let found = try await database.transaction { tx in
                        try await subscriptions.subscriptions(["1000000001"], periodKeys: ["1"], in: tx)
                    }
                    #expect(found.isEmpty)
                }
            }
        }
    }
}
