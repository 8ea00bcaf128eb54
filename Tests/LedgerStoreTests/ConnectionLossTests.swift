@testable import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Synchronization
import Testing
import _ConnectionPoolModule

/// A statement sent on a connection PostgreSQL has already closed fails at once (postgres-nio
/// alone would leave it waiting forever), and a transaction on it does not wait on a ROLLBACK.
@Suite("Connection loss")
struct ConnectionLossTests {
    @Test("a query on a connection the server closed fails at once with ConnectionClosedError")
    func queryOnClosedConnection() async throws {
        try await withTestDatabase { db in
            let connection = try await db.connect()
            try await terminateFromOutside(connection, db)
            #expect(connection.isClosed)
            await #expect(throws: ConnectionClosedError.self) {
                try await connection.guardedQuery("SELECT 1", logger: TestServer.logger)
            }
            #expect(isConnectionFailure(ConnectionClosedError()))
            // The pool's "no connection made for a while" ("too many clients"): answered 503, not 500.
            #expect(isConnectionFailure(ConnectionPoolError.connectionCreationCircuitBreakerTripped))
            #expect(!isConnectionFailure(ConnectionPoolError.requestCancelled))
            // And told to a person as the database out of reach, not as the pool's own name for it.
            #expect(databaseErrorDescription(ConnectionPoolError.connectionCreationCircuitBreakerTripped)?.hasPrefix("the database could not be reached") == true)
        }
    }

    @Test("a transaction that fails with the pool's own error (no new connection) is rolled back: its connection goes back clean")
    func poolErrorRollsBack() async throws {
        try await withTestDatabase { db in
            try await db.database.query("CREATE TABLE rolled (n int)")
            await #expect(throws: ConnectionPoolError.self) {
                try await db.database.transaction { tx in
                    try await tx.connection.guardedQuery("INSERT INTO rolled VALUES (1)", logger: TestServer.logger)
                    throw ConnectionPoolError.connectionCreationCircuitBreakerTripped
                }
            }
            // Left open, the next transaction on that connection would run inside it and commit the row.
            for _ in 0..<5 {
                try await db.database.transaction { tx in try await tx.connection.guardedQuery("SELECT 1", logger: TestServer.logger) }
            }
            let rows = try await db.database.query("SELECT count(*)::int FROM rolled")
            var count = -1
            for try await n in rows.decode(Int.self) { count = n }
            #expect(count == 0)
        }
    }

    @Test("a transaction whose connection is terminated midway fails as a connection failure and commits nothing")
    func transactionOnTerminatedConnection() async throws {
        try await withTestDatabase { db in
            try await db.database.query("CREATE TABLE loss_probe (n int)")
            let outcome: Result<Void, any Error> = await Result(catching: {
                try await db.database.transaction { transaction in
                    let connection = transaction.connection
                    try await connection.guardedQuery("INSERT INTO loss_probe VALUES (1)", logger: TestServer.logger)
                    // From outside while idle in its transaction: a backend that terminates itself
                    // does so while its own query is in flight, a case postgres-nio (1.33) may
                    // leave unanswered (see guardedQuery in Database.swift).
                    try await terminateFromOutside(connection, db)
                    #expect(connection.isClosed)
                    try await connection.guardedQuery("INSERT INTO loss_probe VALUES (2)", logger: TestServer.logger)
                }
            })
            guard case .failure(let error) = outcome else {
                Issue.record("the transaction committed on a terminated connection")
                return
            }
            #expect(isConnectionFailure(error), "\(String(reflecting: error))")
            let count = try await db.database.query("SELECT count(*) FROM loss_probe").rows.first!.decode(Int.self)
            #expect(count == 0)
        }
    }

    @Test("the pool never hands a statement to a connection that closed: after each of 25 terminations the next statements are answered")
    func pooledStatementsAfterTermination() async throws {
        try await withTestDatabase { db in
            for round in 1...25 {
                _ = try? await db.database.transaction { transaction in
                    let connection = transaction.connection
                    // Handed back the moment the client sees the close: the pool hears of it a
                    // little later, from the connection's close future.
                    try await terminateFromOutside(connection, db, poll: .zero)
                    try await connection.guardedQuery("SELECT 1", logger: TestServer.logger)
                }
                // Given back closed, the connection used to be leased again before the pool had
                // heard of the close, and the statement written to it was never answered. (A minute:
                // a hang, not a slow answer on a loaded machine.)
                let answer = await answered(within: .seconds(60)) {
                    try await db.database.query("SELECT \(round)::int").rows.first!.decode(Int.self)
                }
                switch answer {
                case .some(.success(let value)): #expect(value == round)
                case .some(.failure(let error)): Issue.record("round \(round): \(String(reflecting: error))")
                case nil:
                    Issue.record("round \(round): a pooled statement was not answered within 60 s")
                    return
                }
            }
        }
    }

    @Test("a lease whose first statement finds its connection closed runs again on another (three tries); a failure after that first statement is not retried")
    func staleLeasesAreRetriedOnlyBeforeSending() async throws {
        try await withTestDatabase { db in
            /// Runs a lease whose first statement reports a closed connection in its first
            /// `staleRuns` runs (and `failAfterFirst`: whose second statement always does);
            /// answers what it answered and how often it ran.
            func lease(staleRuns: Int, failAfterFirst: Bool = false) async -> (Result<Int, any Error>, runs: Int) {
                var runs = 0
                let outcome = await Result {
                    try await db.database.withConnection { connection in
                        runs += 1
                        let run = runs
                        let first = try await Database.first(try await { () async throws -> Int in
                            if run <= staleRuns { throw ConnectionClosedError() }
                            return try await connection.guardedQuery("SELECT \(run)::int", logger: TestServer.logger)
                                .collect().first!.decode(Int.self)
                        }())
                        if failAfterFirst { throw ConnectionClosedError() }
                        return first
                    }
                }
                return (outcome, runs)
            }
            let (recovered, recoveredRuns) = await lease(staleRuns: 2)
            #expect((try? recovered.get()) == 3)
            #expect(recoveredRuns == 3)
            let (exhausted, exhaustedRuns) = await lease(staleRuns: 3)
            #expect(throws: ConnectionClosedError.self) { try exhausted.get() }
            #expect(exhaustedRuns == 3)
            let (sent, sentRuns) = await lease(staleRuns: 0, failAfterFirst: true)
            #expect(throws: ConnectionClosedError.self) { try sent.get() }
            #expect(sentRuns == 1)
        }
    }

    /// Ends `connection`'s backend from another connection and waits (10 s at most) until the
    /// client has seen the close: a statement sent before then may be written to a channel that
    /// is closing and never answered (the window guardedQuery cannot close).
    func terminateFromOutside(_ connection: PostgresConnection, _ db: TestDatabase, poll: Duration = .milliseconds(10)) async throws {
        let pid = try await connection.guardedQuery("SELECT pg_backend_pid()", logger: TestServer.logger)
            .collect().first!.decode(Int32.self)
        try await db.database.query("SELECT pg_terminate_backend(\(pid))")
        let deadline = ContinuousClock.now + .seconds(10)
        while !connection.isClosed, ContinuousClock.now < deadline {
            if poll == .zero { await Task.yield() } else { try await Task.sleep(for: poll) }
        }
    }
}
