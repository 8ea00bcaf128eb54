import Foundation
import LedgerCore
import PostgresNIO

extension OrderLedger {
    /// An order the ledger holds already, as an import sees it.
    public struct Present: Sendable, Equatable {
        public let userId: UserID
        /// Whether its `created` event is the one the import would write (an earlier run's of the
        /// same line: the event's id names the line's whole history).
        public let imported: Bool
    }

    /// Which of `ids` the ledger holds, each with its user and whether `createdEvents[i]` (the
    /// `created` event an import would give `ids[i]`) is stored: two index lookups a batch.
    public func present(_ ids: [OrderID], createdEvents: [EventID]) async throws -> [OrderID: Present] {
        // By the orders' key (an index scan per id, never a join that reads all orders); the
        // event lookup only for the orders found.
        let rows = try await database.query(
            """
            SELECT o.order_id, o.user_id,
                   EXISTS (SELECT 1 FROM events e WHERE e.event_id = (\(createdEvents.map(\.uuid))::uuid[])[array_position(\(ids.map(\.rawValue))::text[], o.order_id)])
              FROM orders o
             WHERE o.order_id = ANY (\(ids.map(\.rawValue))::text[])
            """)
        var present: [OrderID: Present] = [:]
        for try await (id, user, imported) in rows.decode((String, String, Bool).self) {
            present[OrderID(unchecked: id)] = Present(userId: UserID(unchecked: user), imported: imported)
        }
        return present
    }
}
