import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

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
        }
    }

    @Test("a transaction whose connection is terminated midway fails as a connection failure and commits nothing")
    func transactionOnTerminatedConnection() async throws {
        try await withTestDatabase { db in
            try await db.client.query("CREATE TABLE loss_probe (n int)", logger: TestServer.logger)
            let outcome: Result<Void, any Error> = await Result(catching: {
                try await db.database.transaction { connection in
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
            let count = try await db.client.query("SELECT count(*) FROM loss_probe", logger: TestServer.logger)
                .collect().first!.decode(Int.self)
            #expect(count == 0)
        }
    }

    /// Ends `connection`'s backend from another connection and waits (10 s at most) until the
    /// client has seen the close: a statement sent before then may be written to a channel that
    /// is closing and never answered (the window guardedQuery cannot close).
    func terminateFromOutside(_ connection: PostgresConnection, _ db: TestDatabase) async throws {
        let pid = try await connection.guardedQuery("SELECT pg_backend_pid()", logger: TestServer.logger)
            .collect().first!.decode(Int32.self)
        try await db.client.query("SELECT pg_terminate_backend(\(pid))", logger: TestServer.logger)
        let deadline = ContinuousClock.now + .seconds(10)
        while !connection.isClosed, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
    }
}
