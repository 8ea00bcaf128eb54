import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

@Suite("Event log: append-only in the database")
struct AppendOnlyTests {
    func sqlState(_ body: () async throws -> Void) async -> String? {
        do {
            try await body()
            return nil
        } catch let error as PSQLError {
            return error.serverInfo?[.sqlState]
        } catch {
            return "\(error)"
        }
    }

    @Test("UPDATE, DELETE and TRUNCATE are refused for the owning role")
    func ownerCannotChangeTheLog() async throws {
        try await withTestDatabase { db in
            let stream = try uniqueStream()
            _ = try await db.append([try event("created", #"{"a": 1}"#)], to: stream)
            let connection = try await db.connect()
            let log = TestServer.logger
            #expect(await sqlState { try await connection.query("UPDATE events SET type = 'forged'", logger: log) } == "LE010")
            #expect(await sqlState { try await connection.query("DELETE FROM events", logger: log) } == "LE010")
            #expect(await sqlState { try await connection.query("TRUNCATE events", logger: log) } == "LE010")
            try await connection.close()
            let stored = try await db.store.readStream(stream)
            #expect(stored.map(\.type) == ["created"])
        }
    }

    @Test("the service role of docs/operations.md adds a ledger's first app: the trigger recording it runs with its owner's rights")
    func serviceRoleAddsFirstApp() async throws {
        try await withTestDatabase { db in
            let connection = try await db.connect()
            let log = TestServer.logger
            let role = "ledger_app_\(UInt32.random(in: 0...UInt32.max))"
            // As the recipe grants it (roles are the cluster's: this one is the test's own).
            for statement in [
                "CREATE ROLE \(role) IN ROLE ledger_writer",
                "GRANT SELECT, INSERT, UPDATE ON orders, apple_transactions, products, apps, app_credentials TO \(role)",
            ] { try await connection.query(PostgresQuery(unsafeSQL: statement), logger: log) }
            try await connection.query(PostgresQuery(unsafeSQL: "SET ROLE \(role)"), logger: log)
            let added = await sqlState { try await connection.query("INSERT INTO apps (bundle_id) VALUES ('com.example.first')", logger: log) }
            try await connection.query("RESET ROLE", logger: log)
            for statement in ["REVOKE ALL ON orders, apple_transactions, products, apps, app_credentials FROM \(role)", "DROP ROLE \(role)"] {
                try await connection.query(PostgresQuery(unsafeSQL: statement), logger: log)
            }
            #expect(added == nil)
            let first = try await connection.query("SELECT bundle_id FROM ledger_first_app", logger: log)
            var ids: [String] = []
            for try await id in first.decode(String.self) { ids.append(id) }
            #expect(ids == ["com.example.first"])
            try await connection.close()
        }
    }

    @Test("ledger_writer may append and read but not change the log")
    func writerRole() async throws {
        try await withTestDatabase { db in
            let connection = try await db.connect()
            let log = TestServer.logger
            try await connection.query("SET ROLE ledger_writer", logger: log)
            let stream = try uniqueStream()
            let result = try await db.append([try event()], to: stream, on: connection)
            #expect(result.streamVersion == 0)
            let count = try await connection.query("SELECT count(*) FROM events", logger: log)
            for try await rows in count.decode(Int.self) { #expect(rows == 1) }
            // 42501: insufficient privilege, before the trigger is even reached.
            #expect(await sqlState { try await connection.query("UPDATE events SET type = 'forged'", logger: log) } == "42501")
            #expect(await sqlState { try await connection.query("DELETE FROM events", logger: log) } == "42501")
            #expect(await sqlState { try await connection.query("TRUNCATE events", logger: log) } == "42501")
            try await connection.query("RESET ROLE", logger: log)
            try await connection.close()
            #expect(try await db.store.readStream(stream).count == 1)
        }
    }

    @Test("ledger_reader cannot read or write the raw log")
    func readerRole() async throws {
        try await withTestDatabase { db in
            let connection = try await db.connect()
            let log = TestServer.logger
            try await connection.query("SET ROLE ledger_reader", logger: log)
            #expect(await sqlState { try await connection.query("SELECT * FROM events", logger: log) } == "42501")
            #expect(await sqlState {
                _ = try await db.append([try event()], to: try uniqueStream(), on: connection)
            } == "42501")
            try await connection.close()
        }
    }
}
