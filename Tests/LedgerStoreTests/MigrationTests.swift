import Foundation
import LedgerSchema
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

@Suite("Migrations")
struct MigrationTests {
    let first = Migrator.Migration(name: "001_a.sql", sql: "CREATE TABLE a (id int); CREATE TABLE a2 (id int);")
    let second = Migrator.Migration(name: "002_b.sql", sql: "CREATE TABLE b (id int)")

    func appliedRows(_ db: TestDatabase) async throws -> [String] {
        let rows = try await db.client.query("SELECT name FROM schema_migrations ORDER BY name", logger: TestServer.logger)
        var names: [String] = []
        for try await name in rows.decode(String.self) { names.append(name) }
        return names
    }

    @Test("each file applies once, in order, with its checksum recorded")
    func appliesOnce() async throws {
        try await withTestDatabase(migrated: false) { db in
            let migrator = Migrator(migrations: [second, first], logger: TestServer.logger)
            let before = try await migrator.status(db.client)
            #expect(before == .pending(["001_a.sql", "002_b.sql"]))
            let applied = try await migrator.migrate(db.client)
            #expect(applied == ["001_a.sql", "002_b.sql"])
            let second = try await migrator.migrate(db.client)
            #expect(second.isEmpty)
            let after = try await migrator.status(db.client)
            #expect(after == .current)
            let rows = try await appliedRows(db)
            #expect(rows == ["001_a.sql", "002_b.sql"])
        }
    }

    @Test("a migration changed after it was applied is refused, and so is an unknown applied one")
    func changedMigrationIsRefused() async throws {
        try await withTestDatabase(migrated: false) { db in
            try await Migrator(migrations: [first], logger: TestServer.logger).migrate(db.client)
            let edited = Migrator.Migration(name: first.name, sql: first.sql + " -- edited")
            let migrator = Migrator(migrations: [edited, second], logger: TestServer.logger)
            await #expect(throws: MigrationError.self) { try await migrator.migrate(db.client) }
            guard case .changed(let name, _, _) = try await migrator.status(db.client) else {
                Issue.record("status should report the changed file")
                return
            }
            #expect(name == first.name)
            // Nothing after the refused check was applied.
            let rows = try await appliedRows(db)
            #expect(rows == ["001_a.sql"])

            let older = Migrator(migrations: [], logger: TestServer.logger)
            let status = try await older.status(db.client)
            #expect(status == .unknownApplied(first.name))
        }
    }

    @Test("a failing migration is rolled back whole and named")
    func failingMigrationRollsBack() async throws {
        try await withTestDatabase(migrated: false) { db in
            let broken = Migrator.Migration(name: "003_broken.sql", sql: "CREATE TABLE c (id int); SELECT * FROM missing_table;")
            let migrator = Migrator(migrations: [first, broken], logger: TestServer.logger)
            do {
                try await migrator.migrate(db.client)
                Issue.record("the broken migration was applied")
            } catch let error as MigrationError {
                #expect(error.description.contains("003_broken.sql"))
            }
            let rows = try await appliedRows(db)
            #expect(rows == ["001_a.sql"])
            let table = try await db.client.query("SELECT to_regclass('c') IS NULL", logger: TestServer.logger)
            for try await missing in table.decode(Bool.self) { #expect(missing) }
        }
    }

    @Test("migrators racing on one database apply each file once")
    func racingMigrators() async throws {
        try await withTestDatabase(migrated: false) { db in
            let racers = 8
            let applied = try await withThrowingTaskGroup(of: [String].self) { group in
                for _ in 0..<racers {
                    group.addTask {
                        // Each racer has its own pool, as separate service instances would.
                        let client = PostgresClient(configuration: db.configuration, backgroundLogger: TestServer.clientLogger)
                        return try await withThrowingTaskGroup(of: [String].self) { inner in
                            inner.addTask { await client.run(); return [] }
                            defer { inner.cancelAll() }
                            return try await Migrator(logger: TestServer.logger).migrate(client)
                        }
                    }
                }
                return try await group.reduce(into: []) { $0 += $1 }
            }
            let bundled = Migrator.bundled.map(\.name)
            #expect(applied.sorted() == bundled.sorted())
            let rows = try await appliedRows(db)
            #expect(rows == bundled.sorted())
        }
    }

    @Test("a database made by the unreleased schema before the baseline is refused, in one line saying how to start afresh")
    func unreleasedSchemaIsRefused() async throws {
        try await withTestDatabase(migrated: false) { db in
            let old = Migrator.Migration(name: "001_event_log.sql", sql: "CREATE TABLE events (id int)")
            try await Migrator(migrations: [old], logger: TestServer.logger).migrate(db.client)
            let migrator = Migrator(logger: TestServer.logger)
            #expect(try await migrator.status(db.client) == .unreleasedSchema("001_event_log.sql"))
            let error = await #expect(throws: MigrationError.self) { try await migrator.migrate(db.client) }
            let message = error?.description ?? ""
            #expect(!message.contains("\n") && message.contains("unreleased schema") && message.contains("start afresh"), "\(message)")
            // Nothing of the baseline was applied.
            #expect(try await appliedRows(db) == ["001_event_log.sql"])
        }
    }

    @Test("the embedded migrations are exactly the files of sql/migrations")
    func embeddedListMatchesFolder() throws {
        let folder = TestServer.packageRoot.appendingPathComponent("sql/migrations")
        let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".sql") }.sorted()
        #expect(LedgerSchema.migrations.map(\.name) == files)
        for migration in LedgerSchema.migrations {
            let text = try String(contentsOf: folder.appendingPathComponent(migration.name), encoding: .utf8)
            #expect(migration.sql == text, "\(migration.name) differs from its file")
        }
    }

    /// An order event's UPDATE may be a HOT update (a new row version on the same
    /// page and no index entry) only when no index reads a column it changes, in its keys,
    /// expressions or predicate, and the page has room.
    @Test("no index of orders reads a column that order events change, and orders' pages keep room")
    func orderRowsUpdateInPlace() async throws {
        try await withTestDatabase { db in
            let changed: Set<Substring> = ["state", "version", "transaction_id", "updated_at", "queued_at", "state_before_refund", "failure_reason"]
            let rows = try await db.client.query(
                "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = 'orders'::regclass",
                logger: TestServer.logger)
            var indexes = 0
            for try await (name, definition) in rows.decode((String, String).self) {
                indexes += 1
                // The definition after "ON orders USING btree": key columns and any predicate.
                let words = definition.split(whereSeparator: { !($0.isLetter || $0.isNumber || $0 == "_") })
                let read = changed.intersection(words.drop(while: { $0 != "USING" }))
                #expect(read.isEmpty, "\(name) reads \(read.sorted()): \(definition)")
            }
            #expect(indexes >= 3, "the primary key, the token's and the user's indexes")
            let options = try await db.client.query("SELECT reloptions FROM pg_class WHERE oid = 'orders'::regclass", logger: TestServer.logger)
            for try await reloptions in options.decode([String]?.self) { #expect(reloptions == ["fillfactor=60"]) }
        }
    }
}
