import AsyncHTTPClient
import Foundation
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import PrivatePostgres
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// PostgreSQL stopped, or silent, under load: the server keeps running, answers 503 with
/// `Retry-After` meanwhile (requests in flight included, without waiting for PostgreSQL to come
/// back), recovers by itself, and loses nothing it acknowledged.
///
/// Neither test races a sleep against the server: PostgreSQL stays away until every request in
/// flight has its answer (a request that waited the outage out holds the test until its limit).
@Suite("Fault: PostgreSQL stopped or silent under load")
struct DatabaseOutageTests {
    @Test("the server answers 503 + Retry-After while PostgreSQL is down, then recovers with nothing lost")
    func databaseStopped() async throws {
        try await underLoad("stop") { rig, running in
            // Every client's next request waits in PostgreSQL (appends wait for this lock), so that
            // each has one in flight when PostgreSQL stops: in the group commit, on a lease, or in
            // a statement.
            let blocker = try await rig.connect()
            try await blocker.query("BEGIN", logger: TestServer.logger)
            try await blocker.query("LOCK TABLE events IN SHARE MODE", logger: TestServer.logger)
            try await rig.waitUntil("every client waits on the lock") { await rig.load.inFlight.count >= 4 }
            // And one request whose body has not come yet: its handler waits for it.
            let body = #"{"orderId":"o-unsent-body","userId":"u-1","productId":"gems.100"}"#
            let keptAlive = try RawHTTPConnection(port: Int(rig.base.split(separator: ":").last!)!)
            try keptAlive.send("POST /v1/orders HTTP/1.1\r\nHost: ledger\r\nAuthorization: Bearer \(rig.key)\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n")
            let stopping = ContinuousClock.now
            let markedDown = Task { try await rig.firstUnready() }
            try await running.stop(logger: TestServer.logger)
            let stopped = ContinuousClock.now
            // In flight: sent before PostgreSQL was gone, unanswered when it began to stop.
            let requests = await rig.load.requests
            let held = requests.indices.filter { requests[$0].sent < stopped && (requests[$0].answered ?? .now) > stopping }
            try await rig.waitUntil("the requests in flight are answered while PostgreSQL is down") {
                await rig.load.requests(held).allSatisfy { $0.answered != nil }
            }
            let readiness = try await rig.client.execute(HTTPClientRequest(url: rig.base + "/readyz"), timeout: .seconds(120))
            _ = try await readiness.body.collect(upTo: 1 << 16)
            let serverAliveWhileDown = rig.server.isRunning
            try? await blocker.close()
            running = try await rig.cluster.start(logger: TestServer.logger)
            let restartedAt = ContinuousClock.now

            let inFlight = await rig.load.requests(held)
            // (All may be 2xx: the lock's holder is ended first, and on a loaded machine the
            // writes it held can commit before their own backends are ended.)
            expectAnsweredWithout(waiting: inFlight, "requests in flight when PostgreSQL stopped")
            let down = try await markedDown.value
            // Its body, sent once the database was marked down: answered, and the connection kept
            // for the next request (the handler's cancelled read of the body closed it after the
            // 503, without `Connection: close`, and the next request got no answer).
            try keptAlive.send(body)
            let first = try keptAlive.response()
            try keptAlive.send("GET /healthz HTTP/1.1\r\nHost: ledger\r\n\r\n")
            let second = try? keptAlive.response()
            #expect(first.hasPrefix("HTTP/1.1 503") || first.hasPrefix("HTTP/1.1 201"), "\(first)")
            #expect(second?.hasPrefix("HTTP/1.1 200") == true, "the next request on the connection: \(second ?? "no answer")")
            keptAlive.close()
            print("DatabaseOutageTests: PostgreSQL stopped (`pg_ctl stop` took \(milliseconds(stopped - stopping)) ms), marked down \(milliseconds(down - stopping)) ms after it began; \(held.count) requests in flight answered within \(milliseconds(latency(inFlight, after: down))) ms of that: \(inFlight.compactMap { $0.answer?.status })")
            #expect(serverAliveWhileDown, "the server exited while PostgreSQL was down")
            #expect(readiness.status.code == 503, "/readyz answered \(readiness.status.code) while PostgreSQL was down")
            try await rig.expectRecovery(after: restartedAt)
        }
    }

    @Test("a PostgreSQL that stops answering is marked down after three missed probes, requests in flight answered 503")
    func databaseSilent() async throws {
        try await underLoad("silent") { rig, _ in
            guard let postmaster = rig.cluster.runningServerPID() else { throw FaultTestError("no postmaster.pid") }
            // Every process of the cluster stopped: connections are accepted and never answered,
            // statements in flight never end (a host that hangs, a network that drops packets).
            // The postmaster first, so that no backend is forked after its children are listed
            // (one forked between the listing and the signals answered readiness at once).
            kill(postmaster, SIGSTOP)
            let processes = [postmaster] + childProcesses(of: postmaster)
            for pid in processes.dropFirst() { kill(pid, SIGSTOP) }
            let silenced = ContinuousClock.now
            let outcome: Result<Void, any Error>
            do {
                // Answered when the health marks the database down: until then readiness waits
                // for the migrations' status, which never comes.
                let readiness = try await rig.client.execute(HTTPClientRequest(url: rig.base + "/readyz"), timeout: .seconds(120))
                _ = try await readiness.body.collect(upTo: 1 << 16)
                let markedDown = ContinuousClock.now
                #expect(readiness.status.code == 503)
                let requests = await rig.load.requests
                let held = requests.indices.filter { requests[$0].sent < markedDown && (requests[$0].answered ?? .now) > silenced }
                try await rig.waitUntil("the requests in flight are answered while PostgreSQL is silent") {
                    await rig.load.requests(held).allSatisfy { $0.answered != nil }
                }
                let inFlight = await rig.load.requests(held)
                // Some were sent after PostgreSQL went silent: those cannot commit.
                expectAnsweredWithout(waiting: inFlight, "requests in flight while PostgreSQL was silent", someRefused: true)
                print("DatabaseOutageTests: PostgreSQL silent, marked down \(milliseconds(markedDown - silenced)) ms after; \(held.count) requests in flight answered within \(milliseconds(latency(inFlight, after: markedDown))) ms of that: \(inFlight.compactMap { $0.answer?.status })")
                outcome = .success(())
            } catch {
                outcome = .failure(error)
            }
            for pid in processes.reversed() { kill(pid, SIGCONT) }
            try outcome.get()
            try await rig.expectRecovery(after: ContinuousClock.now)
        }
    }
}

/// Requests in flight as PostgreSQL went away, all answered before it came back: a write that
/// committed in time with 2xx, the others (`someRefused`: at least one) with 503 and `Retry-After`.
func expectAnsweredWithout(
    waiting inFlight: [RetryingLoad.Request], _ what: String, someRefused: Bool = false, sourceLocation: SourceLocation = #_sourceLocation
) {
    let statuses = inFlight.map { $0.answer.map { "\($0.status)" } ?? "no answer" }
    #expect(inFlight.allSatisfy { ($0.answer?.status).map { (200..<300).contains($0) } == true || ($0.answer?.status == 503 && $0.answer?.retryAfter != nil) },
            "\(what): \(statuses)", sourceLocation: sourceLocation)
    #expect(!someRefused || inFlight.contains { $0.answer?.status == 503 }, "\(what): no 503 among \(statuses)", sourceLocation: sourceLocation)
}

/// The longest a request of `requests` took to be answered once the database was marked down
/// (at `down`, or when it was sent, if later).
func latency(_ requests: [RetryingLoad.Request], after down: ContinuousClock.Instant) -> Duration {
    requests.compactMap { request in request.answered.map { $0 - max(request.sent, down) } }.max() ?? .zero
}

func milliseconds(_ duration: Duration) -> Int { Int((duration.inSeconds * 1000).rounded()) }

/// A `ledger serve` child on a private cluster of its own, four retrying clients appending to it.
struct OutageRig: Sendable {
    let cluster: PrivateCluster
    let configuration: PostgresClient.Configuration
    let base: String
    let client: HTTPClient
    let server: LedgerChild
    let load: RetryingLoad
    let deadline: ContinuousClock.Instant
    let key: String

    /// A connection of the test's own to the database.
    func connect() async throws -> PostgresConnection {
        guard let socket = configuration.unixSocketPath else { throw FaultTestError("the private cluster listens on no socket") }
        return try await PostgresConnection.connect(
            configuration: .init(unixSocketPath: socket, username: configuration.username, password: configuration.password, database: configuration.database),
            id: 1, logger: TestServer.logger)
    }

    /// When `/readyz` first answers 503 (polled): when the server marked the database down.
    func firstUnready() async throws -> ContinuousClock.Instant {
        while true {
            let response = try await client.execute(HTTPClientRequest(url: base + "/readyz"), timeout: .seconds(120))
            _ = try await response.body.collect(upTo: 1 << 16)
            if response.status.code == 503 { return .now }
            guard ContinuousClock.now < deadline else { throw FaultTestError("/readyz never answered 503") }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    /// Polls `condition` until it holds; fails at the test's deadline.
    func waitUntil(_ what: String, _ condition: () async throws -> Bool) async throws {
        while try await !condition() {
            guard ContinuousClock.now < deadline else { throw FaultTestError("not before the test's deadline: \(what)") }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Acknowledgements flow again after `since`, and every answer was a 2xx or a 503.
    func expectRecovery(after since: ContinuousClock.Instant) async throws {
        let ackedBefore = await load.acknowledgedAt.count
        try await waitForAcknowledgements(load, atLeast: ackedBefore + 50, deadline: deadline)
        let refusals = await load.refusals
        let unavailable = refusals.filter { $0.status == 503 }
        #expect(!unavailable.isEmpty, "no 503 while PostgreSQL was away; server log:\n\(server.logText().suffix(3000))")
        #expect(unavailable.allSatisfy { $0.retryAfter != nil && $0.body.contains("database-unavailable") },
                "a 503 without Retry-After or the error code: \(unavailable.first { $0.retryAfter == nil || !$0.body.contains("database-unavailable") }.map(\.body) ?? "")")
        let other = refusals.filter { $0.status != 503 }
        #expect(other.isEmpty, "answers other than 2xx and 503: \(other.prefix(5).map { "\($0.status) \($0.body)" })")
        let (unanswered, transportErrors) = (await load.unanswered, await load.transportErrors)
        #expect(unanswered == 0, "requests the server never answered: \(transportErrors.prefix(5)); server log:\n\(server.logText().suffix(4000))")
    }
}

/// Runs `body` against a loaded server (`running`: its cluster, which `body` may stop and start
/// again), then stops the load and checks that every acknowledged event is stored once.
func underLoad(_ name: String, _ body: (OutageRig, inout RunningPrivateCluster) async throws -> Void) async throws {
    // A cluster of its own: the shared test cluster serves the other tests meanwhile.
    let cluster = PrivateCluster(directory: TestServer.scratchRoot.appendingPathComponent(".ledger-fault-\(name)").path, durable: true)
    var running = try await cluster.start(logger: TestServer.logger)
    do {
        try await underLoad(name, cluster, &running, body)
    } catch {
        try? await running.stop(logger: TestServer.logger)
        throw error
    }
    try await running.stop(logger: TestServer.logger)
}

private func underLoad(
    _ name: String, _ cluster: PrivateCluster, _ running: inout RunningPrivateCluster,
    _ body: (OutageRig, inout RunningPrivateCluster) async throws -> Void
) async throws {
    let database = "ledger_fault_\(UUID().uuidString.prefix(8).lowercased())"
    try await withClient(cluster.clientConfiguration(database: "postgres")) { admin in
        try await admin.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(database)"), logger: TestServer.logger)
    }
    let configuration = cluster.clientConfiguration(database: database)
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
        let deadline = ContinuousClock.now + .seconds(240)
        let clients = Task { try await load.run(clients: 4, prefix: name, deadline: deadline) }
        let rig = OutageRig(
            cluster: cluster, configuration: configuration, base: base, client: client, server: server, load: load, deadline: deadline, key: key)
        try await waitForAcknowledgements(load, atLeast: 50, deadline: deadline)
        do {
            try await body(rig, &running)
        } catch {
            await load.stop()
            _ = try? await clients.value
            throw error
        }
        await load.stop()
        try await clients.value
        try await withClient(configuration) { client in
            try await expectEveryAcknowledgedEventOnce(load, client: client)
        }
    } catch {
        try await shutDown(server, client, after: error)
    }
    try await shutDown(server, client)
    try await withClient(cluster.clientConfiguration(database: "postgres")) { admin in
        try await admin.query(PostgresQuery(unsafeSQL: "DROP DATABASE IF EXISTS \(database) WITH (FORCE)"), logger: TestServer.logger)
    }
}

/// The processes whose parent is `parent` (a postmaster's backends and helpers).
func childProcesses(of parent: pid_t) -> [pid_t] {
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
    return entries.compactMap { entry -> pid_t? in
        guard let pid = pid_t(entry),
              let status = try? String(contentsOfFile: "/proc/\(entry)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("PPid:") }),
              pid_t(line.dropFirst(5).trimmingCharacters(in: .whitespaces)) == parent
        else { return nil }
        return pid
    }
}

extension RetryingLoad {
    /// The requests at `indices`, as they stand.
    func requests(_ indices: [Int]) -> [Request] { indices.map { requests[$0] } }
}

/// A client connection by hand: what an HTTP client library hides (a request's head sent before
/// its body, the connection's reuse) is sent and read as it is.
final class RawHTTPConnection {
    private let descriptor: Int32

    init(port: Int) throws {
        guard let descriptor = connectedLocalSocket(port: port, readTimeout: 120) else {
            throw FaultTestError("could not connect to port \(port)")
        }
        self.descriptor = descriptor
    }

    func send(_ text: String) throws {
        let sent = text.withCString { Glibc.send(descriptor, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
        guard sent == text.utf8.count else { throw FaultTestError("the connection took \(sent) of \(text.utf8.count) bytes") }
    }

    /// One response, head and body (by its Content-Length); throws when the connection ends first.
    func response() throws -> String {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let text = String(decoding: received, as: UTF8.self)
            if let end = text.range(of: "\r\n\r\n") {
                let head = text[..<end.lowerBound].lowercased()
                let length = head.split(separator: "\r\n").first { $0.hasPrefix("content-length:") }
                    .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
                if text.utf8.count - text[..<end.upperBound].utf8.count >= length { return text }
            }
            let count = recv(descriptor, &buffer, buffer.count, 0)
            guard count > 0 else { throw FaultTestError("the connection ended after \(received.count) bytes: \(text)") }
            received += buffer[0..<count]
        }
    }

    func close() { Glibc.close(descriptor) }
}
