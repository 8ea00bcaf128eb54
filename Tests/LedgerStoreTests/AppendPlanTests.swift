import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

@Suite("Event store: appends stay on indexes")
struct AppendPlanTests {
    @Test("a session that began on an empty log never scans the whole log to append")
    func noSequentialScansAfterGrowth() async throws {
        try await withTestDatabase { db in
            let session = try await db.connect()
            let log = TestServer.logger
            // PL/pgSQL caches its plans after a few calls, here while the log is empty.
            for _ in 0..<8 {
                _ = try await db.append([try event()], to: try uniqueStream(), on: session)
            }
            // The log grows through other connections.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<4 {
                    group.addTask {
                        for _ in 0..<20 {
                            _ = try await db.append(try (0..<50).map { _ in try event() }, to: try uniqueStream())
                        }
                    }
                }
                try await group.waitForAll()
            }
            try await session.query("BEGIN", logger: log)
            for _ in 0..<10 {
                _ = try await db.append([try event()], to: try uniqueStream(), on: session)
            }
            let scans = try await session.query(
                "SELECT coalesce(sum(seq_scan), 0)::bigint FROM pg_stat_xact_user_tables WHERE relname = 'events'", logger: log)
            for try await count in scans.decode(Int64.self) {
                #expect(count == 0, "appends scanned the whole log \(count) times")
            }
            try await session.query("COMMIT", logger: log)
            try await session.close()
        }
    }
}
