import Foundation
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import PrivatePostgres
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The health probe against a PostgreSQL slower than its time-out: an answer that comes late is
/// an answer. On a busy machine every check may take longer than the time-out, and a probe that
/// dropped each late attempt to connect afresh counted a PostgreSQL that answers as a silent one.
@Suite("Fault: a late answer to the health probe")
struct DatabaseProbeLateAnswerTests {
    @Test("a check that went unanswered is answered at the next check when its answer comes late, while a fresh connection cannot get through")
    func lateAnswerCounts() async throws {
        // A cluster of its own: its postmaster is stopped below, which would hold every other test's connections.
        let cluster = PrivateCluster(directory: TestServer.scratchRoot.appendingPathComponent(".ledger-fault-late").path, durable: false)
        let running = try await cluster.start(logger: TestServer.logger)
        let probe = DatabaseProbe(PostgresConnection.Configuration(cluster.clientConfiguration(database: "postgres")), logger: TestServer.logger)
        var stopped: [pid_t] = []
        let outcome: Result<Void, any Error>
        do {
            #expect(await probe.check(timeout: .seconds(60)) == .answered, "the probe connects")
            let backend = try await withClient(cluster.clientConfiguration(database: "postgres")) { client in
                let rows = try await client.query(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = \(DatabaseProbe.applicationName)", logger: TestServer.logger)
                var pids: [Int32] = []
                for try await pid in rows.decode(Int32.self) { pids.append(pid) }
                return pids
            }
            #expect(backend.count == 1, "the probe's one backend: \(backend)")
            let postmaster = try #require(cluster.runningServerPID())
            // The probe's backend stops: its SELECT 1 waits, and the check misses.
            kill(try #require(backend.first), SIGSTOP)
            stopped.append(try #require(backend.first))
            #expect(await probe.check(timeout: .milliseconds(300)) == .noAnswer)
            // No fresh connection gets through now (the postmaster stopped), and the stopped
            // backend goes on: its late answer is the one the next check can have.
            kill(postmaster, SIGSTOP)
            stopped.append(postmaster)
            kill(try #require(backend.first), SIGCONT)
            stopped.removeFirst()
            #expect(await probe.check(timeout: .seconds(60)) == .answered, "the late answer was not taken")
            outcome = .success(())
        } catch {
            outcome = .failure(error)
        }
        for pid in stopped { kill(pid, SIGCONT) }
        await probe.close()
        try? await running.stop(logger: TestServer.logger)
        try outcome.get()
    }
}
