import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

@Suite("Migration 014: Apple per app")
struct ApplePerAppMigrationTests {
    /// The text of the query's first row, or nil.
    func text(_ db: TestDatabase, _ query: PostgresQuery) async throws -> String? {
        for try await value in try await db.client.query(query, logger: TestServer.logger).decode(String?.self) { return value }
        return nil
    }

    @Test("014 gives the sweep and refund cursors, the calls and a backfill position already there the first app, and their environment")
    func upgradesTodaysRows() async throws {
        try await withTestDatabase(migrated: false) { db in
            let before = Migrator(migrations: Migrator.bundled.filter { $0.name < "014" }, routines: Migrator.bundledRoutines, logger: TestServer.logger)
            try await before.migrate(db.client)
            for statement in [
                "INSERT INTO apps (bundle_id, environments, created_at) VALUES ('com.example.first', ARRAY['Sandbox'], now() - interval '1 day')",
                "INSERT INTO apps (bundle_id, environments, created_at) VALUES ('com.example.second', ARRAY['Production'], now())",
                """
                INSERT INTO apple_transactions (transaction_id, product_id, purchase_date, environment, status, received_at, updated_at, app_transaction_id)
                VALUES ('7100001', 'gems.100', now(), 'Sandbox', 'unmatched', now(), now(), 'acct-1')
                """,
                "INSERT INTO apple_history_cursors (account_id, user_id, revision) VALUES ('acct-1', 'u-1', 'r-1')",
                "INSERT INTO apple_refund_cursors (account_id, revision) VALUES ('acct-1', 'r-2')",
                "INSERT INTO apple_calls (call_id, kind, transaction_id, stream_id) VALUES ('finish:7100001', 'finish', '7100001', 'order-o-1')",
                "UPDATE apple_notification_backfill SET start_date = now() - interval '1 day', end_date = now(), pagination_token = 'p-1'",
            ] {
                try await db.client.query(PostgresQuery(unsafeSQL: statement), logger: TestServer.logger)
            }
            let applied = try await Migrator(logger: TestServer.logger).migrate(db.client)
            #expect(applied.contains("014_apple_per_app.sql"))
            #expect(try await text(db, "SELECT bundle_id || ' ' || environment || ' ' || revision FROM apple_history_cursors") == "com.example.first Sandbox r-1")
            #expect(try await text(db, "SELECT bundle_id || ' ' || environment || ' ' || revision FROM apple_refund_cursors") == "com.example.first Sandbox r-2")
            #expect(try await text(db, "SELECT bundle_id || ' ' || environment FROM apple_calls") == "com.example.first Sandbox")
            #expect(try await text(db, "SELECT bundle_id || ' ' || environment || ' ' || pagination_token FROM apple_notification_backfill")
                == "com.example.first Sandbox p-1", "the position is the first app's, in the environment it was asked in")

            // The position resumes as that app's, in any case of its bundle id; another app's starts apart.
            let first = NotificationBackfillState(database: db.database, bundleId: BundleID(unchecked: "COM.example.first"), environment: "Sandbox")
            #expect(try await first.read().paginationToken == "p-1")
            let second = NotificationBackfillState(database: db.database, bundleId: BundleID(unchecked: "com.example.second"), environment: "Production")
            #expect(try await second.read().paginationToken == nil)
            #expect(try await text(db, "SELECT count(*)::text FROM apple_notification_backfill") == "2")
        }
    }

    @Test("014 on a ledger that holds no app: the rows stay the first app's to be (null), an unused backfill row goes")
    func upgradesWithoutApps() async throws {
        try await withTestDatabase(migrated: false) { db in
            let before = Migrator(migrations: Migrator.bundled.filter { $0.name < "014" }, routines: Migrator.bundledRoutines, logger: TestServer.logger)
            try await before.migrate(db.client)
            try await db.client.query("INSERT INTO apple_refund_cursors (account_id, revision) VALUES ('acct-2', 'r-3')", logger: TestServer.logger)
            try await Migrator(logger: TestServer.logger).migrate(db.client)
            #expect(try await text(db, "SELECT coalesce(bundle_id, 'none') || ' ' || revision FROM apple_refund_cursors") == "none r-3")
            #expect(try await text(db, "SELECT count(*)::text FROM apple_notification_backfill") == "0")
        }
    }
}
