import AsyncHTTPClient
import Foundation
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import PrivatePostgres
import Testing

/// PostgreSQL stopped for 5 s under load: the server keeps running, answers 503 with
/// `Retry-After` meanwhile, recovers by itself, and loses nothing it acknowledged.
@Suite("Fault: PostgreSQL stopped under load")
struct DatabaseOutageTests {
    @Test("the server answers 503 + Retry-After while PostgreSQL is down, then recovers with nothing lost")
    func databaseStoppedForFiveSeconds() async throws {
        // A cluster of its own: the shared test cluster serves the other tests meanwhile.
        let cluster = PrivateCluster(directory: TestServer.scratchRoot.appendingPathComponent(".ledger-fault").path, durable: true)
        var running = try await cluster.start(logger: TestServer.logger)
        defer { try? running.stop(logger: TestServer.logger) }
        let name = "ledger_fault_\(UUID().uuidString.prefix(8).lowercased())"
        try await withClient(cluster.clientConfiguration(database: "postgres")) { admin in
            try await admin.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name)"), logger: TestServer.logger)
        }
        let configuration = cluster.clientConfiguration(database: name)
        let port = try ProcessRunner.freeLocalPort()
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-outage-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: work) }
        let environment = [
            "LEDGER_DATABASE_URL": configuration.url, "LEDGER_PORT": "\(port)",
            "LEDGER_RECONCILE_INTERVAL": "0", "LEDGER_LOG_LEVEL": "notice",
        ]
        let base = "http://127.0.0.1:\(port)"
        let server = try LedgerChild(["serve"], environment: environment, log: work.appendingPathComponent("server.log"))
        let client = HTTPClient(eventLoopGroupProvider: .singleton)
        do {
            try await waitUntilReady(client, base, server: server)
            let key = try await withClient(configuration) { client in
                try await APIKeyStore(database: Database(client: client, logger: TestServer.logger)).create(name: "fault", scopes: [.append, .read])
            }
            let load = RetryingLoad(base: base, key: key, client: client)
            let deadline = ContinuousClock.now + .seconds(120)
            let work = Task { try await load.run(clients: 4, prefix: "outage", deadline: deadline) }

            try await waitForAcknowledgements(load, atLeast: 50, deadline: deadline)
            try running.stop(logger: TestServer.logger)
            let stoppedAt = ContinuousClock.now
            try await Task.sleep(for: .seconds(5))
            let readiness = try await client.execute(HTTPClientRequest(url: base + "/readyz"), timeout: .seconds(10))
            _ = try await readiness.body.collect(upTo: 1 << 16)
            let readyWhileDown = readiness.status.code
            let serverAliveWhileDown = server.isRunning
            running = try await cluster.start(logger: TestServer.logger)
            let restartedAt = ContinuousClock.now
            // Recovered: acknowledgements flow again after the restart, without touching the server.
            let ackedBefore = await load.acknowledgedAt.count
            try await waitForAcknowledgements(load, atLeast: ackedBefore + 50, deadline: deadline)
            let recoveredAfter = (await load.acknowledgedAt.last ?? .now) - restartedAt
            await load.stop()
            try await work.value

            #expect(serverAliveWhileDown, "the server exited while PostgreSQL was down")
            #expect(readyWhileDown == 503, "/readyz answered \(readyWhileDown) while PostgreSQL was down")
            let refusals = await load.refusals
            let unavailable = refusals.filter { $0.status == 503 }
            #expect(!unavailable.isEmpty, "no 503 while PostgreSQL was down (stopped for \(ContinuousClock.now - stoppedAt)); server log:\n\(server.logText().suffix(3000))")
            #expect(unavailable.allSatisfy { $0.retryAfter != nil && $0.body.contains("database-unavailable") },
                    "a 503 without Retry-After or the error code: \(unavailable.first { $0.retryAfter == nil || !$0.body.contains("database-unavailable") }.map(\.body) ?? "")")
            let other = refusals.filter { $0.status != 503 }
            #expect(other.isEmpty, "answers other than 2xx and 503: \(other.prefix(5).map { "\($0.status) \($0.body)" })")
            #expect(recoveredAfter < .seconds(30))
            try await withClient(configuration) { client in
                try await expectEveryAcknowledgedEventOnce(load, client: client)
            }
        } catch {
            try await shutDown(server, client, after: error)
        }
        try await shutDown(server, client)
        try await withClient(cluster.clientConfiguration(database: "postgres")) { admin in
            try await admin.query(PostgresQuery(unsafeSQL: "DROP DATABASE IF EXISTS \(name) WITH (FORCE)"), logger: TestServer.logger)
        }
    }
}
