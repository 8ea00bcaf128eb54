import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

@Suite("Migration 011: apps")
struct AppMigrationTests {
    @Test("011 applies on a database made by the migrations before it, keeping its rows; the ledger then holds no app until one is added")
    func upgradesTodaysDatabase() async throws {
        try await withTestDatabase(migrated: false) { db in
            let before = Migrator(migrations: Migrator.bundled.filter { $0.name < "011" }, routines: Migrator.bundledRoutines, logger: TestServer.logger)
            try await before.migrate(db.client)
            try await db.client.query("INSERT INTO products (product_id, price, currency) VALUES ('gems.100', 0.99, 'USD')", logger: TestServer.logger)
            let key = try await APIKeyStore(database: db.database).create(name: "old-key", scopes: [.admin])

            let applied = try await Migrator(logger: TestServer.logger).migrate(db.client)
            #expect(applied.contains("011_apps.sql"))
            #expect(try await Migrator(logger: TestServer.logger).status(db.client) == .current)
            #expect(try await ProductCatalog(database: db.database).list().map(\.productId.rawValue) == ["gems.100"])
            #expect(try await APIKeyStore(database: db.database).find(key: key)?.name == "old-key")
            let catalog = AppCatalog(database: db.database)
            #expect(try await catalog.list().isEmpty)
            let app = try await catalog.add(try BundleID("com.example.game"), AppChanges(appAppleId: .some(7)))
            #expect(app.environments == [.production, .sandbox] && app.appAppleId == 7 && !app.retired && app.apiKey == nil)
        }
    }

    @Test("the database refuses an API key given in part, a bad bundle id and an unknown environment, whatever the Swift checks")
    func databaseChecks() async throws {
        try await withTestDatabase { db in
            try await db.client.query("INSERT INTO apps (bundle_id) VALUES ('com.example.game')", logger: TestServer.logger)
            for statement in [
                "INSERT INTO app_credentials (bundle_id, api_key_id) VALUES ('com.example.game', 'K')",
                "INSERT INTO app_credentials (bundle_id, api_issuer_id, api_key_id, api_private_key, api_private_key_ref) VALUES ('com.example.game', 'i', 'k', 'pem', 'env:X')",
                "INSERT INTO apps (bundle_id) VALUES ('com example')",
                "INSERT INTO apps (bundle_id) VALUES ('COM.EXAMPLE.GAME')",
                "INSERT INTO apps (bundle_id, environments) VALUES ('com.example.x', ARRAY['Xcode'])",
                "INSERT INTO apps (bundle_id, environments) VALUES ('com.example.y', ARRAY[]::text[])",
            ] {
                await #expect(throws: PSQLError.self, "\(statement)") {
                    try await db.client.query(PostgresQuery(unsafeSQL: statement), logger: TestServer.logger)
                }
            }
        }
    }

    @Test("the configured app is created once, updated only when the settings change, and a setting left out clears nothing")
    func configure() async throws {
        try await withTestDatabase { db in
            let catalog = AppCatalog(database: db.database)
            let id = try BundleID("com.example.game")
            let key = AppCredentials.APIKey(issuerId: "issuer", keyId: "K1", privateKey: .reference(.file("/keys/game.p8")))
            var configured = AppCatalog.Configured(bundleId: id, appAppleId: 9, environments: [.production], sharedSecret: "s3cr3t-value", apiKey: key)
            #expect(try await catalog.configure(configured) == .created)
            #expect(try await catalog.configure(configured) == .unchanged)
            configured.environments = [.production, .sandbox]
            #expect(try await catalog.configure(configured) == .updated)
            configured.sharedSecret = nil
            configured.apiKey = nil
            #expect(try await catalog.configure(configured) == .unchanged, "settings left out clear nothing")
            configured.environments = [.production]
            #expect(try await catalog.configure(configured) == .updated)
            configured.environments = nil
            #expect(try await catalog.configure(configured) == .unchanged, "environments left out keep Production alone")
            #expect(try await catalog.app(id)?.environments == [.production])
            let credentials = try #require(try await catalog.credentials(of: BundleID("COM.example.GAME")))
            #expect(credentials.sharedSecret == "s3cr3t-value" && credentials.apiKey == key)
            #expect(!"\(credentials)".contains("s3cr3t-value") && !String(reflecting: credentials).contains("s3cr3t-value"), "printing credentials shows no secret")
            let stored = AppCredentials.APIKey(issuerId: "i", keyId: "k", privateKey: .stored(pem: "-----BEGIN PRIVATE KEY-----\nABC\n-----END PRIVATE KEY-----"))
            #expect(!"\(stored)".contains("ABC") && !String(reflecting: stored).contains("ABC") && !"\(AppCredentials(apiKey: stored))".contains("ABC"))
        }
    }
}
