import Foundation
import LedgerCore
import PostgresNIO

extension OrderLedger {
    /// Gives the planner the statistics of the tables an import grew: until autovacuum's next
    /// look, a report over a freshly imported history was planned for empty tables (more than ten
    /// minutes for 50,000 orders, 6 s once analysed). A table the ledger's role does not own is
    /// skipped by PostgreSQL with a warning.
    public func analyzeImported() async throws {
        try await database.query("ANALYZE events, orders, apple_transactions")
    }

    /// An order the ledger holds already, as an import sees it.
    public struct Present: Sendable, Equatable {
        public let userId: UserID
        /// Whether its `created` event is the one the import would write (an earlier run's of the
        /// same line: the event's id names the line's whole history).
        public let imported: Bool
        /// Its app, and the id of its `created` event: for a line whose app the ledger cannot
        /// tell now (a second app added since, its app retired), which is present when an earlier
        /// run imported it for that app.
        public let bundleId: BundleID?
        public let createdEvent: EventID?
    }

    /// Which of `ids` the ledger holds, each with its user and whether `createdEvents[i]` (the
    /// `created` event an import would give `ids[i]`) is stored: two index lookups a batch.
    public func present(_ ids: [OrderID], createdEvents: [EventID]) async throws -> [OrderID: Present] {
        // By the orders' key (an index scan per id, never a join that reads all orders); the
        // event lookup only for the orders found.
        let rows = try await database.query(
            """
            SELECT o.order_id, o.user_id, o.bundle_id, c.event_id,
                   c.event_id = (\(createdEvents.map(\.uuid))::uuid[])[array_position(\(ids.map(\.rawValue))::text[], o.order_id)]
              FROM orders o
              LEFT JOIN LATERAL (SELECT e.event_id FROM events e WHERE e.stream_id = 'order-' || o.order_id AND e.stream_version = 0) c ON true
             WHERE o.order_id = ANY (\(ids.map(\.rawValue))::text[])
            """)
        var present: [OrderID: Present] = [:]
        for try await (id, user, bundle, created, imported) in rows.decode((String, String, String?, UUID?, Bool?).self) {
            present[OrderID(unchecked: id)] = Present(
                userId: UserID(unchecked: user), imported: imported ?? false, bundleId: bundle.map(BundleID.init(unchecked:)),
                createdEvent: created.map(EventID.init))
        }
        return present
    }
}
