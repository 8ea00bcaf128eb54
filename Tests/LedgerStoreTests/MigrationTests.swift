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
            let bundled = (Migrator.bundled + Migrator.bundledRoutines).map(\.name)
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

    @Test("the embedded migrations and routines are exactly the files of sql/migrations and sql/routines")
    func embeddedListMatchesFolder() throws {
        for (name, embedded) in [("migrations", LedgerSchema.migrations), ("routines", LedgerSchema.routines)] {
            let folder = TestServer.packageRoot.appendingPathComponent("sql/\(name)")
            let files = try FileManager.default.contentsOfDirectory(atPath: folder.path).filter { $0.hasSuffix(".sql") }.sorted()
            #expect(embedded.map(\.name) == files, "sql/\(name)")
            for file in embedded {
                let text = try String(contentsOf: folder.appendingPathComponent(file.name), encoding: .utf8)
                #expect(file.sql == text, "\(name)/\(file.name) differs from its file")
            }
        }
    }

    @Test("each routine's versions end with its file's checksum: an edit adds its checksum, and the earlier ones stay")
    func routineVersionsEndWithTheFile() {
        #expect(!LedgerSchema.routines.isEmpty)
        for routine in LedgerSchema.routines {
            let checksum = Migrator.Migration(name: routine.name, sql: routine.sql).checksum
            #expect(routine.versions.last == checksum,
                    "sql/routines/\(routine.name) changed: append \(checksum) to its versions in sql/LedgerSchema.swift, keeping the earlier ones")
            #expect(Set(routine.versions).count == routine.versions.count, "\(routine.name) lists a version twice")
        }
        #expect(LedgerSchema.migrations.allSatisfy { $0.versions.isEmpty }, "a migration never changes")
    }

    @Test("a routine is applied after the migrations, and again, its record updated, when its file changed")
    func changedRoutineIsAppliedAgain() async throws {
        try await withTestDatabase(migrated: false) { db in
            let routine = Migrator.Migration(
                name: "routines/answer.sql", sql: "CREATE OR REPLACE FUNCTION answer() RETURNS int LANGUAGE sql AS 'SELECT 1'")
            let migrator = Migrator(migrations: [first], routines: [routine], logger: TestServer.logger)
            #expect(try await migrator.status(db.client) == .pending(["001_a.sql", "routines/answer.sql"]))
            #expect(try await migrator.migrate(db.client) == ["001_a.sql", "routines/answer.sql"])
            #expect(try await migrator.migrate(db.client).isEmpty)
            #expect(try await migrator.status(db.client) == .current)

            let edited = Migrator.Migration(
                name: routine.name, sql: routine.sql.replacingOccurrences(of: "SELECT 1", with: "SELECT 2"), formerChecksums: [routine.checksum])
            let next = Migrator(migrations: [first, second], routines: [edited], logger: TestServer.logger)
            #expect(try await next.status(db.client) == .pending(["002_b.sql", "routines/answer.sql"]))
            #expect(try await next.migrate(db.client) == ["002_b.sql", "routines/answer.sql"])
            #expect(try await next.status(db.client) == .current)
            let answer = try await db.client.query("SELECT answer()", logger: TestServer.logger)
            for try await value in answer.decode(Int.self) { #expect(value == 2) }
            #expect(try await recorded(db)[routine.name] == edited.checksum)
            // A build with the file as it was (an older instance during a rollout) does not put
            // its older text back: it refuses the database, as it would a newer migration.
            let unedited = Migrator(migrations: [first, second], routines: [routine], logger: TestServer.logger)
            #expect(try await unedited.status(db.client) == .newerRoutine(routine.name, applied: edited.checksum))
            let refusal = await #expect(throws: MigrationError.self) { try await unedited.migrate(db.client) }
            #expect(refusal?.description.contains("older ledger running against a newer database") == true)
            let still = try await db.client.query("SELECT answer()", logger: TestServer.logger)
            for try await value in still.decode(Int.self) { #expect(value == 2) }
            #expect(try await recorded(db)[routine.name] == edited.checksum)
        }
    }

    @Test("a recorded routine this build does not know is refused, as an unknown migration is")
    func unknownRoutineIsRefused() async throws {
        try await withTestDatabase(migrated: false) { db in
            let routine = Migrator.Migration(name: "routines/answer.sql", sql: "CREATE FUNCTION answer() RETURNS int LANGUAGE sql AS 'SELECT 1'")
            try await Migrator(migrations: [first], routines: [routine], logger: TestServer.logger).migrate(db.client)
            let older = Migrator(migrations: [first, second], logger: TestServer.logger)
            #expect(try await older.status(db.client) == .unknownApplied(routine.name))
            await #expect(throws: MigrationError.self) { try await older.migrate(db.client) }
            #expect(try await appliedRows(db) == ["001_a.sql", "routines/answer.sql"])
        }
    }

    @Test("a database made before the routines were squashed out of the baseline is upgraded: records rewritten, the old procedure dropped")
    func formerBaselineIsRewritten() async throws {
        try await withTestDatabase { db in
            try await recordFormerBaseline(db)
            let migrator = Migrator(logger: TestServer.logger)
            let routines = Migrator.bundledRoutines.map(\.name)
            #expect(try await migrator.status(db.client) == .pending(["001_baseline.sql"] + routines))
            #expect(try await migrator.migrate(db.client) == routines)
            #expect(try await migrator.status(db.client) == .current)

            let expected = Dictionary(uniqueKeysWithValues: (Migrator.bundled + Migrator.bundledRoutines).map { ($0.name, $0.checksum) })
            #expect(try await recorded(db) == expected)
            let left = try await db.client.query("SELECT count(*)::int FROM pg_proc WHERE proname = 'append_events_checked'", logger: TestServer.logger)
            for try await count in left.decode(Int.self) { #expect(count == 0) }
            // And the ledger appends through the routine as before.
            let stream = try uniqueStream("migration")
            let stored = try await db.append([try event()], to: stream, expectedVersion: .noStream)
            #expect(stored.streamVersion == 0 && !stored.replayed)
        }
    }

    @Test("a former file recorded with a checksum that is neither its former one nor today's is still refused")
    func formerBaselineWithAnotherChecksumIsRefused() async throws {
        let former = try #require(LedgerSchema.squashes.first).former
        for name in former.keys.sorted() {
            try await withTestDatabase { db in
                try await recordFormerBaseline(db)
                try await db.client.query(
                    "UPDATE schema_migrations SET sha256 = \(String(repeating: "0", count: 64)) WHERE name = \(name)", logger: TestServer.logger)
                let before = try await recorded(db)
                let migrator = Migrator(logger: TestServer.logger)
                let status = try await migrator.status(db.client)
                switch status {
                case .changed, .unknownApplied: break
                default: Issue.record("\(name): status \(status)")
                }
                await #expect(throws: MigrationError.self) { try await migrator.migrate(db.client) }
                #expect(try await recorded(db) == before, "\(name): nothing rewritten")
            }
        }
    }

    /// The records of a database made before the squash of 001–003: the former files with the
    /// checksums they had, no routine, and the procedure only 002 made.
    func recordFormerBaseline(_ db: TestDatabase) async throws {
        let former = try #require(LedgerSchema.squashes.first).former
        try await db.client.query("DELETE FROM schema_migrations WHERE name LIKE 'routines/%'", logger: TestServer.logger)
        for (name, checksum) in former {
            try await db.client.query(
                """
                INSERT INTO schema_migrations (name, sha256) VALUES (\(name), \(checksum))
                ON CONFLICT (name) DO UPDATE SET sha256 = excluded.sha256
                """, logger: TestServer.logger)
        }
        try await db.client.query(
            """
            CREATE PROCEDURE append_events_checked(integer[], text[], bigint[], uuid[], text[], jsonb[], jsonb[], text[],
                integer[], boolean[], text[], text[], text[], integer[], text[], text[], uuid[], text[], bigint[], text[], bigint[],
                bigint[], bigint[], text[], text[], integer[], boolean[], text[], text[], text[], text[], bigint[], text[], text[],
                bigint[], bigint[], text[], text[], uuid[], text[], text[], bigint, boolean,
                INOUT r_status text[], INOUT r_detail text[], INOUT r_versions bigint[], INOUT r_positions bigint[])
            LANGUAGE plpgsql AS $fn$ BEGIN END $fn$
            """, logger: TestServer.logger)
    }

    func recorded(_ db: TestDatabase) async throws -> [String: String] {
        let rows = try await db.client.query("SELECT name, sha256 FROM schema_migrations", logger: TestServer.logger)
        var records: [String: String] = [:]
        for try await (name, checksum) in rows.decode((String, String).self) { records[name] = checksum }
        return records
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
            #expect(indexes >= 2, "the primary key and the user's index (tokens are app_account_tokens' keys)")
            let options = try await db.client.query("SELECT reloptions FROM pg_class WHERE oid = 'orders'::regclass", logger: TestServer.logger)
            for try await reloptions in options.decode([String]?.self) { #expect(reloptions == ["fillfactor=60"]) }
        }
    }
}
