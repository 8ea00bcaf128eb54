import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// Writers that deadlock past the store's tries: the error is one a retry of the same request
/// gets through (the API answers it 503 `contention`, not 500).
@Suite("Deadlocks")
struct DeadlockTests {
    @Test("a deadlock PostgreSQL broke is a transient conflict; a value refused or a key taken is not")
    func deadlockIsTransient() async throws {
        try await withTestDatabase { db in
            let logger = TestServer.logger
            let (first, second) = (try await db.connect(id: 1), try await db.connect(id: 2))
            try await first.query("CREATE TABLE locks (id int PRIMARY KEY)", logger: logger)
            try await first.query("INSERT INTO locks VALUES (1), (2)", logger: logger)
            try await first.query("BEGIN", logger: logger)
            try await second.query("BEGIN", logger: logger)
            try await first.query("SELECT id FROM locks WHERE id = 1 FOR UPDATE", logger: logger)
            try await second.query("SELECT id FROM locks WHERE id = 2 FOR UPDATE", logger: logger)
            // Each now waits for the other's row: PostgreSQL ends one of them (after its
            // deadlock_timeout), and the other gets its row.
            // (A statement's error comes with its rows, which are read to their end.)
            let one = Task { _ = try await first.query("SELECT id FROM locks WHERE id = 2 FOR UPDATE", logger: logger).collect() }
            let two = Task { _ = try await second.query("SELECT id FROM locks WHERE id = 1 FOR UPDATE", logger: logger).collect() }
            let outcomes = [await one.result, await two.result]
            let failures = outcomes.compactMap { outcome -> (any Error)? in
                if case .failure(let error) = outcome { return error }
                return nil
            }
            #expect(failures.count == 1, "one of the two is ended: \(failures)")
            #expect(failures.allSatisfy(isTransientConflict), "\(failures.map { String(reflecting: $0) })")
            for connection in [first, second] { _ = try? await connection.query("ROLLBACK", logger: logger) }

            let taken = await Task { _ = try await first.query("INSERT INTO locks VALUES (1)", logger: logger).collect() }.result
            let refused = await Task { _ = try await first.query("SELECT 'x'::int", logger: logger).collect() }.result
            for outcome in [taken, refused] {
                guard case .failure(let error) = outcome else {
                    Issue.record("the statement went through")
                    continue
                }
                #expect(!isTransientConflict(error), "\(String(reflecting: error))")
            }
            try await first.close()
            try await second.close()
        }
    }
}
