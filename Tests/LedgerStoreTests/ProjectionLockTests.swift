import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// `ledger projections rebuild` and `verify` beside the appends of a running ledger: each decides
/// on a snapshot taken once it holds the projections, not before it waited for them.
@Suite("Projection rebuild and verify beside appends")
struct ProjectionLockTests {
    /// How many lock requests on `orders` of this database wait (a rebuild's or a verify's).
    static func waiting(_ db: TestDatabase) async throws -> Int {
        let rows = try await db.client.query(
            """
            SELECT count(*)::int FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
             WHERE NOT l.granted AND c.relname = 'orders' AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            """, logger: TestServer.logger)
        for try await count in rows.decode(Int.self) { return count }
        return 0
    }

    static func newOrder(_ db: TestDatabase, _ prefix: String) async throws -> OrderID {
        let id = OrderID(unchecked: "\(prefix)-\(UUID().uuidString.prefix(8))")
        let body = OrderCreated(userId: UserID(unchecked: "u-rebuild"), productId: ProductID(unchecked: "gems.100"), appAccountToken: UUID())
        _ = try await OrderLedger(writer: db.writer).create(id, body, tokenGiven: true, metadata: Data("{}".utf8))
        return id
    }

    /// Runs `hold` in a transaction kept open until `waiter`, started once `hold` is done, waits
    /// for a lock on `orders` (seen in pg_locks, not guessed); then commits it and answers what
    /// `waiter` answers.
    static func whileHeld<Value: Sendable>(
        _ db: TestDatabase, hold: @escaping @Sendable (DatabaseTransaction) async throws -> Void,
        then waiter: @escaping @Sendable () async throws -> Value
    ) async throws -> Value {
        let (held, holding) = AsyncStream.makeStream(of: Void.self)
        let (released, releasing) = AsyncStream.makeStream(of: Void.self)
        let holder = Task {
            try await db.database.transaction { transaction in
                try await hold(transaction)
                holding.yield()
                for await _ in released { break }
            }
        }
        for await _ in held { break }
        let waiting = Task { try await waiter() }
        while try await Self.waiting(db) == 0 { try await Task.sleep(for: .milliseconds(20)) }
        releasing.yield()
        try await holder.value
        return try await waiting.value
    }

    @Test("a rebuild that waits for an append in flight folds that append's event")
    func rebuildAfterAppendInFlight() async throws {
        try await withTestDatabase { db in
            let id = try await Self.newOrder(db, "in-flight")
            _ = try await Self.whileHeld(db, hold: { transaction in
                let paid = try EventCoding.newEvent(.paymentAdded(PaymentAdded(queuedAt: Date())), id: EventID(), metadata: Data("{}".utf8))
                _ = try await db.writer.append(LedgerWriter.Write(LedgerWriter.Append([paid], to: id.streamID)), in: transaction)
            }, then: { try await ProjectionRebuilder(database: db.database).rebuild() })
            let order = try await OrderLedger(writer: db.writer).order(id)
            #expect(order?.version == 1 && order?.state == .paymentAdded, "\(String(describing: order))")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a verify that waits for a rebuild under way compares what the rebuild wrote, not the tables it emptied")
    func verifyAfterRebuildInFlight() async throws {
        try await withTestDatabase { db in
            _ = try await Self.newOrder(db, "rebuilt")
            // A rebuild's writes, held before its commit: the projections emptied and written again.
            let differences = try await Self.whileHeld(db, hold: { transaction in
                let connection = transaction.connection
                try await connection.query("CREATE TEMP TABLE kept ON COMMIT DROP AS SELECT * FROM orders", logger: TestServer.logger)
                try await connection.query("TRUNCATE orders, apple_transactions, subscriptions, subscription_periods", logger: TestServer.logger)
                try await connection.query("INSERT INTO orders SELECT * FROM kept", logger: TestServer.logger)
            }, then: { try await ProjectionRebuilder(database: db.database).verify() })
            #expect(differences == [], "\(differences.prefix(3))")
        }
    }
}
