import Foundation
import LedgerCore
import LedgerJSON
@testable import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// A group's writes are decided in up to three rounds, each committed on its own: a round that
/// fails after an earlier one committed must not take that one's outcomes with it.
@Suite("The writer's rounds")
struct WriterRoundTests {
    let metadata = Data("{}".utf8)

    func created() -> OrderCreated {
        OrderCreated(userId: UserID(unchecked: "u-round"), productId: ProductID(unchecked: "gems.100"), price: "0.99", currency: "USD", appAccountToken: UUID())
    }

    @Test("a later round that fails leaves the first round's order answered as created, and only the undecided write to be written again")
    func laterRoundFails() async throws {
        try await withTestDatabase { db in
            let ledger = OrderLedger(writer: LedgerWriter(database: db.database))
            let suffix = UUID().uuidString.prefix(8)
            let (first, moved) = (OrderID(unchecked: "o-first-\(suffix)"), OrderID(unchecked: "o-moved-\(suffix)"))
            // What this writer remembers of `moved` is stale: another server appended since.
            let stale = try await ledger.create(moved, created(), tokenGiven: true, metadata: metadata).order
            _ = try await ledger.append(moved, event: .paymentAdded(PaymentAdded(queuedAt: Date())), eventID: EventID(), expected: nil, metadata: metadata)
            // Its next event fails when stored, as a deadlock PostgreSQL broke would fail it.
            try await db.database.query(
                """
                CREATE FUNCTION fail_moved() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.stream_id = \(unescaped: "'\(moved.streamID.rawValue)'") THEN
                        RAISE EXCEPTION 'deadlock, as PostgreSQL breaks one' USING ERRCODE = '40P01';
                    END IF;
                    RETURN NEW;
                END $$
                """)
            try await db.database.query("CREATE TRIGGER fail_moved BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION fail_moved()")
            let remembered = LedgerWriter.Remembered()
            remembered.remember([stale])

            let writes = [
                LedgerWriter.Write(LedgerWriter.Append([try EventCoding.newEvent(.created(created()), id: EventID(), metadata: metadata)], to: first.streamID)),
                LedgerWriter.Write(LedgerWriter.Append(
                    [try EventCoding.newEvent(.failed(Failed(reason: "abandoned")), id: EventID(), metadata: metadata)], to: moved.streamID)),
            ]
            let connection = try await db.connect(id: 7)
            // Round 1 stores the creation and finds `moved` moved; round 2 fails.
            let results = try await LedgerWriter.write(writes, on: connection, commit: true, database: db.database, remembered: remembered)
            let written = try results[0].get()
            #expect(!written.replayed && written.appends[0].order?.orderId == first)
            guard case .failure(let failed as LedgerWriter.RoundFailed) = results[1] else {
                Issue.record("the moved write: \(results[1])")
                return
            }
            #expect(isTransientConflict(failed.error), "\(String(reflecting: failed.error))")
            #expect(try await ledger.order(first)?.version == 0)
            #expect(try await ledger.order(moved)?.version == 1)
            try await connection.close()
        }
    }
}
