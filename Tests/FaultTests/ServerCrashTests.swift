import AsyncHTTPClient
import Foundation
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import PrivatePostgres
import Testing

/// The server killed with SIGKILL in the middle of appends that clients retry with the same ids:
/// after a restart every acknowledged event is in the log exactly once and the projections equal
/// a rebuild from the log.
@Suite("Fault: the server killed under load")
struct ServerCrashTests {
    @Test("SIGKILL during retried appends loses and doubles nothing; projections verify clean")
    func killedDuringAppends() async throws {
        try await withTestDatabase { db in
            let key = try await APIKeyStore(database: db.database).create(name: "fault", scopes: [.append, .read])
            let port = try ProcessRunner.freeLocalPort()
            let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-fault-\(UUID().uuidString.prefix(8))")
            try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: work) }
            let environment = [
                "LEDGER_DATABASE_URL": db.configuration.url, "LEDGER_PORT": "\(port)",
                "LEDGER_LOG_LEVEL": "warning",
            ]  // the reconciler on, as by default: SIGTERM must still end the server with 0
            let log = work.appendingPathComponent("server.log")
            let base = "http://127.0.0.1:\(port)"
            let client = HTTPClient(eventLoopGroupProvider: .singleton)
            var server = try LedgerChild(["serve"], environment: environment, log: log)
            do {
                try await waitUntilReady(client, base, server: server)
                let load = RetryingLoad(base: base, key: key, client: client)
                let deadline = ContinuousClock.now + .seconds(300)  // up to five kills and restarts
                let running = Task { try await load.run(clients: 8, prefix: "crash", deadline: deadline) }

                // Kill it once appends are flowing, then start it again on the same port. A kill
                // can fall where no request is cut off (the answers were written, the clients'
                // next requests wait for a connection and reach the new server): then again, a
                // few times, so that the crash is one that cut requests off.
                for _ in 1...5 {
                    try await waitForAcknowledgements(load, atLeast: await load.acknowledgedAt.count + 100, deadline: deadline)
                    server.kill(SIGKILL)
                    let status = try await server.wait()
                    #expect(status != 0, "the killed server exited normally")
                    let ackedAtKill = await load.acknowledgedAt.count
                    try await Task.sleep(for: .milliseconds(500))
                    server = try LedgerChild(["serve"], environment: environment, log: log)
                    try await waitUntilReady(client, base, server: server)
                    try await waitForAcknowledgements(load, atLeast: ackedAtKill + 100, deadline: deadline)
                    if await load.unanswered > 0 { break }
                }
                await load.stop()
                try await running.value

                let unanswered = await load.unanswered
                #expect(unanswered > 0, "no request was cut off by five kills: the test did not test a crash")
                let refusals = await load.refusals
                #expect(refusals.isEmpty, "answers other than 2xx: \(refusals.prefix(5).map { "\($0.status) \($0.body)" })")
                try await expectEveryAcknowledgedEventOnce(load, client: db.client)
            } catch {
                try await shutDown(server, client, after: error)
            }
            try await shutDown(server, client)

            let (verifyStatus, output) = try await LedgerChild.run(
                ["projections", "verify"], environment: environment, log: work.appendingPathComponent("verify.log"))
            #expect(verifyStatus == 0, "ledger projections verify: \(output)")
        }
    }
}

/// Waits until the server answers `/readyz` with 200 (or fails with its log).
func waitUntilReady(_ client: HTTPClient, _ base: String, server: LedgerChild, seconds: Int = 60) async throws {
    let deadline = ContinuousClock.now + .seconds(seconds)
    while ContinuousClock.now < deadline {
        guard server.isRunning else { throw FaultTestError("ledger serve exited:\n\(server.logText().suffix(4000))") }
        if let response = try? await client.execute(HTTPClientRequest(url: base + "/readyz"), timeout: .seconds(10)),
           response.status == .ok { return }
        try await Task.sleep(for: .milliseconds(100))
    }
    throw FaultTestError("ledger serve was not ready within \(seconds) s:\n\(server.logText().suffix(4000))")
}

func waitForAcknowledgements(_ load: RetryingLoad, atLeast count: Int, deadline: ContinuousClock.Instant) async throws {
    while await load.acknowledgedAt.count < count {
        guard ContinuousClock.now < deadline else { throw FaultTestError("only \(await load.acknowledgedAt.count) of \(count) requests acknowledged in time") }
        try await Task.sleep(for: .milliseconds(20))
    }
}

/// Every acknowledged order has one `created` event, every acknowledged event id is stored once
/// in its order's stream, and no stream holds an event its client never sent.
func expectEveryAcknowledgedEventOnce(_ load: RetryingLoad, client: PostgresClient) async throws {
    let orders = await load.ackedOrders
    let acked = await load.ackedEvents
    let sent = await load.sentEvents
    #expect(!orders.isEmpty)
    var stored: [String: [String]] = [:]
    var created: [String: Int] = [:]
    let rows = try await client.query(
        "SELECT substr(stream_id, 7), event_id::text, type FROM events WHERE stream_id LIKE 'order-%'", logger: TestServer.logger)
    for try await (order, eventID, type) in rows.decode((String, String, String).self) {
        if type == "created" { created[order, default: 0] += 1 } else { stored[order, default: []].append(eventID) }
    }
    var missing: [String] = []
    var doubled: [String] = []
    var unknown: [String] = []
    for order in orders where created[order] != 1 { missing.append("created of \(order) ×\(created[order] ?? 0)") }
    for (order, events) in acked {
        let here = stored[order] ?? []
        for event in events {
            let copies = here.filter { $0 == event }.count
            if copies == 0 { missing.append("\(event) of \(order)") }
            if copies > 1 { doubled.append("\(event) of \(order)") }
        }
    }
    for (order, events) in stored {
        for event in events where !(sent[order]?.contains(event) ?? false) { unknown.append("\(event) of \(order)") }
    }
    let ackedCount = acked.values.map(\.count).reduce(0, +)
    #expect(missing.isEmpty, "acknowledged but not stored: \(missing.prefix(10))")
    #expect(doubled.isEmpty, "stored more than once: \(doubled.prefix(10))")
    #expect(unknown.isEmpty, "stored but never sent: \(unknown.prefix(10))")
    #expect(ackedCount > 0)
}

/// Runs `body` with a pool on `configuration`, shut down afterwards.
@discardableResult
func withClient<Result: Sendable>(
    _ configuration: PostgresClient.Configuration, _ body: @Sendable (PostgresClient) async throws -> Result
) async throws -> Result {
    let client = PostgresClient(configuration: configuration, backgroundLogger: TestServer.clientLogger)
    return try await withThrowingTaskGroup(of: Void.self) { group in
        group.addTask { await client.run() }
        defer { group.cancelAll() }
        return try await body(client)
    }
}
