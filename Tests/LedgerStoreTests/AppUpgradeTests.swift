import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// Upgrade without loss (issue 39, point 7): a database built by the migrations before 013, with
/// orders, pool entries, a claimed transaction, an account link, a sweep cursor and a product in
/// it, upgrades with every row assigned to the configured app, and `projections verify` is clean.
@Suite("Migration 013: every row belongs to an app")
struct AppUpgradeTests {
    static let app = "com.example.legacy"
    static let recorded = "2026-01-01 00:00:00+00"

    /// Today's rows, written as the ledger before 013 wrote them: its events, and the projection
    /// rows its writer computed from them (no app in either).
    static func writeTodaysRows(_ db: TestDatabase) async throws {
        let token = "0b6d3c4e-1f2a-4b5c-8d9e-0a1b2c3d4e5f"
        let pooled = #"{"transaction": {"transactionId": "7001", "originalTransactionId": "7001", "productId": "gems.100", "purchaseDate": "2025-12-31T23:00:00.000Z", "environment": "Production", "bundleId": "com.example.legacy", "quantity": 1, "appTransactionId": "app-7001", "format": "jws", "receiptSha256": "\#(String(repeating: "cd", count: 32))"}, "userId": "u-2", "reason": "no-order"}"#
        let events: [(stream: String, version: Int, type: String, data: String)] = [
            ("order-legacy-1", 0, "created", #"{"userId": "u-1", "productId": "gems.100", "quantity": 1, "appAccountToken": "\#(token)"}"#),
            ("order-legacy-2", 0, "created", #"{"userId": "u-1", "productId": "gems.100", "quantity": 1, "appAccountToken": "1b6d3c4e-1f2a-4b5c-8d9e-0a1b2c3d4e5f"}"#),
            ("order-legacy-2", 1, "receipt-received", #"{"transactionId": "7002", "productId": "gems.100", "purchaseDate": "2025-12-31T22:00:00.000Z", "receiptSha256": "\#(String(repeating: "ab", count: 32))", "format": "jws", "matchedBy": "applicationUsername", "environment": "Production"}"#),
            ("order-legacy-2", 2, "verified", #"{"transactionId": "7002", "environment": "Production"}"#),
            ("transaction-7001", 0, "transaction-unmatched", pooled),
            ("apple-account-app-7001", 0, "account-linked", #"{"appTransactionId": "app-7001", "userId": "u-2", "environment": "Production"}"#),
            ("apple-account-app-7003", 0, "account-linked", #"{"appTransactionId": "app-7003", "userId": "u-1", "environment": "Production"}"#),
        ]
        try await db.client.withTransaction(logger: TestServer.logger) { connection in
            for (index, event) in events.enumerated() {
                try await connection.query(
                    """
                    INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, recorded_at)
                    VALUES ((pg_current_xact_id()::text::bigint << 12) + \(index), \(event.stream), \(event.version), gen_random_uuid(),
                            \(event.type), \(event.data)::jsonb, \(recorded)::timestamptz)
                    """, logger: TestServer.logger)
            }
            try await connection.query(
                """
                INSERT INTO orders (order_id, user_id, product_id, quantity, app_account_token, state, version, transaction_id, created_at, updated_at)
                VALUES ('legacy-1', 'u-1', 'gems.100', 1, \(UUID(uuidString: token)!), 'created', 0, NULL, \(recorded)::timestamptz, \(recorded)::timestamptz),
                       ('legacy-2', 'u-1', 'gems.100', 1, '1b6d3c4e-1f2a-4b5c-8d9e-0a1b2c3d4e5f', 'verified', 2, '7002', \(recorded)::timestamptz, \(recorded)::timestamptz)
                """, logger: TestServer.logger)
            try await connection.query(
                """
                INSERT INTO apple_transactions (transaction_id, order_id, user_id, product_id, purchase_date, environment, status,
                                                received_at, updated_at, original_transaction_id, app_transaction_id, matched_by, verification)
                VALUES ('7001', NULL, 'u-2', 'gems.100', '2025-12-31 23:00:00+00', 'Production', 'unmatched',
                        \(recorded)::timestamptz, \(recorded)::timestamptz, '7001', 'app-7001', NULL, \(pooled)::jsonb),
                       ('7002', 'legacy-2', 'u-1', 'gems.100', '2025-12-31 22:00:00+00', 'Production', 'claimed',
                        \(recorded)::timestamptz, \(recorded)::timestamptz, NULL, NULL, 'applicationUsername', NULL)
                """, logger: TestServer.logger)
            try await connection.query(
                "INSERT INTO apple_history_cursors (account_id, user_id, revision) VALUES ('app-7001', 'u-2', 'rev-1')", logger: TestServer.logger)
            try await connection.query(
                "INSERT INTO products (product_id, price, currency) VALUES ('gems.100', 0.99, 'USD')", logger: TestServer.logger)
        }
    }

    /// Every order, transaction, product and account link is `app`'s, the cursor is kept, and a
    /// rebuild gives the live rows back exactly.
    static func expectEverythingIsTheApp(_ db: TestDatabase) async throws {
        for table in ["orders", "apple_transactions", "products", "dashboards.apple_accounts"] {
            let rows = try await db.client.query(
                "SELECT count(*)::int, count(*) FILTER (WHERE bundle_id = \(app))::int FROM \(unescaped: table)", logger: TestServer.logger)
            for try await (all, theApp) in rows.decode((Int, Int).self) {
                #expect(all > 0 && all == theApp, "\(table): \(theApp) of \(all) rows are \(app)'s")
            }
        }
        let cursors = try await db.client.query("SELECT revision FROM apple_history_cursors WHERE account_id = 'app-7001'", logger: TestServer.logger)
        var revisions: [String?] = []
        for try await revision in cursors.decode(String?.self) { revisions.append(revision) }
        #expect(revisions == ["rev-1"])
        #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        let order = try await OrderLedger(writer: db.writer).order(OrderID("legacy-2"))
        #expect(order?.bundleId?.rawValue == app && order?.state == .verified)
        // A link made before links named their app is swept for its user's open order of the app.
        let due = try await HistoryCursors(database: db.database).dueAccounts(user: UserID("u-1"), openFor: 0)
        #expect(due.contains { $0.id == "app-7003" && $0.bundleId?.rawValue == app }, "\(due.map(\.id))")
    }

    @Test("a database of 012 whose app was configured at start upgrades with every row that app's; verify is clean, and the ledger writes on")
    func upgradesWithTheConfiguredApp() async throws {
        try await withTestDatabase(migrated: false) { db in
            let before = Migrator(migrations: Migrator.bundled.filter { $0.name < "013" }, routines: Migrator.bundledRoutines, logger: TestServer.logger)
            try await before.migrate(db.client)
            // 011's ledger upserts the LEDGER_APPLE_* app at every start.
            try await db.client.query("INSERT INTO apps (bundle_id) VALUES (\(Self.app))", logger: TestServer.logger)
            try await Self.writeTodaysRows(db)

            let applied = try await Migrator(logger: TestServer.logger).migrate(db.client)
            #expect(applied.contains("013_app_columns.sql"))
            try await Self.expectEverythingIsTheApp(db)

            // The ledger writes on: an old order's next event, a new order of the app.
            let ledger = OrderLedger(writer: db.writer)
            let paid = try await ledger.append(
                OrderID("legacy-1"), event: .paymentAdded(PaymentAdded(queuedAt: Date())), eventID: EventID(), expected: nil, metadata: Data("{}".utf8))
            #expect(paid.order.bundleId?.rawValue == Self.app)
            let created = try await ledger.create(
                OrderID("new-1"), OrderCreated(userId: UserID("u-1"), productId: ProductID("gems.100")), tokenGiven: false, metadata: Data("{}".utf8))
            #expect(created.order.bundleId?.rawValue == Self.app)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a database of 012 that held no app upgrades with no app, and its rows become the first app's when one is configured")
    func upgradesThenConfiguresTheApp() async throws {
        try await withTestDatabase(migrated: false) { db in
            let before = Migrator(migrations: Migrator.bundled.filter { $0.name < "013" }, routines: Migrator.bundledRoutines, logger: TestServer.logger)
            try await before.migrate(db.client)
            try await Self.writeTodaysRows(db)

            try await Migrator(logger: TestServer.logger).migrate(db.client)
            // Held no app: the orders are nobody's until one comes (the pool entry is the app Apple signed).
            let unassigned = try await db.client.query("SELECT count(*)::int FROM orders WHERE bundle_id IS NULL", logger: TestServer.logger)
            for try await count in unassigned.decode(Int.self) { #expect(count == 2) }
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])

            let configured = AppCatalog.Configured(
                bundleId: try BundleID(Self.app), appAppleId: nil, environments: [.production, .sandbox], sharedSecret: nil, apiKey: nil)
            #expect(try await AppCatalog(database: db.database).configure(configured) == .created)
            // A second app later changes nothing of them.
            _ = try await AppCatalog(database: db.database).add(try BundleID("com.example.second"), AppChanges())
            try await Self.expectEverythingIsTheApp(db)
        }
    }
}
