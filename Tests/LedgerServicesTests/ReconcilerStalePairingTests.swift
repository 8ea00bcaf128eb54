import Foundation
import LedgerCore
@testable import LedgerServices
import LedgerStore
import LedgerTestSupport
import Testing

/// What a pass read of the pool may be out of date by the time it writes a pairing: the pairing
/// is checked again under the locks, and the events of a pairing are named by its transaction
/// and order, so a pairing undone before is never written again by a pass.
@Suite("A reconciler pass's pairings checked again under the locks")
struct ReconcilerStalePairingTests {
    let metadata = Data(#"{"appendedBy":"test"}"#.utf8)

    @Test("support paired a transaction with an order and undid it after the pass read the pool: the pass's pairing of the two is dropped as a lost race")
    func undoneSinceTheRead() async throws {
        try await withTestDatabase { db in
            let services = ServiceAssembly(database: db.database)
            let order = OrderID(unchecked: "o-stale")
            _ = try await services.orders.create(
                order, OrderCreated(userId: UserID(unchecked: "u-stale"), productId: ProductID(unchecked: "gems.100")), tokenGiven: false, metadata: metadata)
            let paid = AppleTransaction(
                transactionId: TransactionID(unchecked: "5200001"), originalTransactionId: "5200001", productId: ProductID(unchecked: "gems.100"),
                purchaseDate: Date(), environment: "Sandbox", bundleId: "com.example.game", format: .jws, receiptSha256: String(repeating: "cd", count: 32))
            let pooled = try await services.receipts.apply(paid, claim: .init(userId: UserID(unchecked: "u-stale"), orderId: nil), metadata: metadata)
            #expect(pooled.outcome == .unmatched)
            // The pass's pairing, as it aligned it from its read of the pool.
            let pairing = Reconciler.Pairing(transactionId: paid.transactionId, orderId: order, rule: .queueOrder, candidates: 1)
            // Meanwhile support pairs them and undoes it: the order is open, the transaction pooled,
            // and the reconciler must never pair the two again.
            _ = try await services.support.match(paid.transactionId, to: order, force: false, reason: nil, metadata: metadata)
            _ = try await services.support.unmatch(paid.transactionId, reason: "not this order", metadata: metadata)
            let pass = services.reconcilerPass()
            let counts = try await db.database.transaction { tx in
                var counts = ReconcilerPass.Summary()
                try await pass.apply([pairing], metadata: metadata, in: tx, into: &counts)
                return counts
            }
            #expect(counts.paired == 0 && counts.lostRaces == 1, "\(counts)")
            let after = try await services.orders.order(order)
            #expect(after?.isOpen == true && after?.transactionId == nil)
        }
    }
}
