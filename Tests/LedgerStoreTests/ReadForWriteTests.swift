import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import LedgerTestSupport
import Testing

/// `read_for_write` with locks: a receipt decides on what it reads under its transaction's and
/// order's locks (promise 6 rests on it), so the read must see what the lock's holder committed
/// while the reader waited, not what stood when its statement began.
@Suite("The writer's read under locks")
struct ReadForWriteTests {
    @Test("a read that waits for a stream's lock sees what the holder committed meanwhile")
    func readAfterLock() async throws {
        try await withTestDatabase { db in
            let ledger = OrderLedger(writer: db.writer)
            let id = OrderID(unchecked: "locked-\(UUID().uuidString.prefix(8))")
            let body = OrderCreated(userId: UserID(unchecked: "u-lock"), productId: ProductID(unchecked: "gems.100"), appAccountToken: UUID())
            _ = try await ledger.create(id, body, tokenGiven: true, metadata: Data("{}".utf8))

            let (locked, lockTaken) = AsyncStream.makeStream(of: Void.self)
            let holder = Task {
                try await db.database.transaction { transaction in
                    try await db.writer.lock([id.streamID], in: transaction)
                    lockTaken.yield()
                    // Long enough for the reader's statement to start and wait for the lock.
                    try await Task.sleep(for: .milliseconds(500))
                    let paid = try EventCoding.newEvent(.paymentAdded(PaymentAdded(queuedAt: Date())), id: EventID(), metadata: Data("{}".utf8))
                    _ = try await db.writer.append(LedgerWriter.Write(LedgerWriter.Append([paid], to: id.streamID)), in: transaction)
                }
            }
            for await _ in locked { break }
            let read = try await db.database.transaction { transaction in
                try await db.writer.read(locking: [id.streamID], orders: [id], transactions: [], in: transaction)
            }
            try await holder.value
            #expect(read.order(id)?.version == 1)
            #expect(read.order(id)?.state == .paymentAdded)
        }
    }
}
