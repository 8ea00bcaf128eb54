import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Logging
import PostgresNIO
import Testing

/// Runs the real application over HTTP on a database of its own; `http` sends an admin key.
func withLiveApplication(
    migrated: Bool = true, migrateAtStart: Bool = true, configure: @Sendable (inout LedgerConfiguration) -> Void = { _ in },
    _ test: @Sendable @escaping (LedgerHTTP, TestDatabase) async throws -> Void
) async throws {
    try await withTestDatabase(migrated: migrated) { db in
        var configuration = LedgerConfiguration()
        configuration.port = 0
        // No background reconciler pass: its first comes a minute after start, which a test on a
        // loaded machine can outlast, pairing under a test that counts events. Tests of pairing
        // call it themselves (or turn it on).
        configuration.reconcileInterval = 0
        // The live client's one connection never reconnects: not closed while a loaded machine
        // keeps a test between requests (IdleConnectionTests sets its own).
        configuration.connectionIdleTimeout = 3600
        // A loaded machine can keep a stand-in's verifyReceipt answer past Apple's 10 s: it is
        // waited for (tests of the time-out hold their stand-in's answer and set their own).
        configuration.apple.verifyReceiptSeconds = 600
        configure(&configuration)
        let key = migrated ? try await APIKeyStore(database: db.database).create(name: "test-admin", scopes: [.admin]) : ""
        let client = PostgresClient(configuration: db.configuration, backgroundLogger: TestServer.clientLogger)
        let application = try buildApplication(
            configuration: configuration, client: client, probing: .init(db.configuration), logger: TestServer.logger, migrate: migrateAtStart)
        try await withLiveServer(application) { http in try await test(LedgerHTTP(client: http, key: key), db) }
    }
}

func json(_ buffer: ByteBuffer) -> [String: Any] {
    (try? JSONSerialization.jsonObject(with: Data(buffer: buffer))) as? [String: Any] ?? [:]
}

@Suite("Health and readiness over HTTP")
struct HealthTests {
    @Test("/healthz and /readyz answer 200 on a migrated database")
    func healthy() async throws {
        try await withLiveApplication { http, _ in
            let health = try await http.client.execute(uri: "/healthz", method: .get)
            #expect(health.status == .ok)
            #expect(json(health.body)["status"] as? String == "ok")
            let ready = try await http.client.execute(uri: "/readyz", method: .get)
            #expect(ready.status == .ok)
            #expect(json(ready.body)["status"] as? String == "ready")
        }
    }

    @Test("the server migrates an empty database before it serves")
    func migratesAtStart() async throws {
        try await withLiveApplication(migrated: false, migrateAtStart: true) { http, _ in
            let ready = try await http.client.execute(uri: "/readyz", method: .get)
            #expect(ready.status == .ok)
        }
    }

    @Test("/readyz answers 503 naming the pending migrations")
    func notMigrated() async throws {
        try await withLiveApplication(migrated: false, migrateAtStart: false) { http, _ in
            let ready = try await http.client.execute(uri: "/readyz", method: .get)
            #expect(ready.status == .serviceUnavailable)
            // (Its answer told: once, with the suite on a loaded machine, the reason was another.)
            #expect((json(ready.body)["reason"] as? String)?.contains("001_baseline.sql") == true, "\(json(ready.body))")
            let health = try await http.client.execute(uri: "/healthz", method: .get)
            #expect(health.status == .ok)
        }
    }

    @Test("/readyz answers 503 when the database is unreachable")
    func unreachable() async throws {
        var configuration = LedgerConfiguration()
        configuration.port = 0
        let nowhere = PostgresClient.Configuration(unixSocketPath: "/nonexistent/.s.PGSQL.5432", username: "x", password: nil, database: "x")
        let client = PostgresClient(configuration: nowhere, backgroundLogger: TestServer.clientLogger)
        let application = try buildApplication(configuration: configuration, client: client, probing: .init(nowhere), logger: TestServer.logger, migrate: false)
        try await withLiveServer(application) { http in
            let ready = try await http.execute(uri: "/readyz", method: .get)
            #expect(ready.status == .serviceUnavailable)
            #expect(json(ready.body)["reason"] as? String == "the database is unreachable")
        }
    }

    @Test("every answer carries a request id: the caller's, or a new one")
    func requestIDs() async throws {
        try await withLiveApplication { http, _ in
            let echoed = try await http.client.execute(uri: "/healthz", method: .get, headers: [.init("X-Request-Id")!: "req-123"])
            #expect(echoed.headers[.init("X-Request-Id")!] == "req-123")
            let made = try await http.client.execute(uri: "/healthz", method: .get)
            #expect((made.headers[.init("X-Request-Id")!]?.count ?? 0) >= 16)
            let unusable = try await http.client.execute(uri: "/healthz", method: .get, headers: [.init("X-Request-Id")!: String(repeating: "a", count: 200)])
            #expect(unusable.headers[.init("X-Request-Id")!]?.count != 200)
        }
    }

    @Test("an unknown route is a JSON 404 with a stable code")
    func notFound() async throws {
        try await withLiveApplication { http, _ in
            let response = try await http.client.execute(
                uri: "/v1/nothing-here", method: .get, headers: [.init("X-Request-Id")!: "r-1", .authorization: "Bearer \(http.key)"])
            #expect(response.status == .notFound)
            let error = json(response.body)["error"] as? [String: Any]
            #expect(error?["code"] as? String == "not-found")
            #expect(error?["requestId"] as? String == "r-1")
            #expect(response.headers[.contentType]?.hasPrefix("application/json") == true)
        }
    }

    @Test("a known path with a method it does not serve is 405 with Allow; an unknown path is 404")
    func methodNotAllowed() async throws {
        try await withLiveApplication { http, _ in
            let (status, body) = try await http.send(.delete, "/v1/orders/o-1")
            #expect(status == .methodNotAllowed)
            #expect(errorOf(body)["code"] as? String == "method-not-allowed")
            let response = try await http.client.execute(uri: "/v1/orders", method: .put, headers: [.authorization: "Bearer \(http.key)"])
            #expect(response.status == .methodNotAllowed)
            #expect(response.headers[.allow] == "GET, HEAD, POST")
            let (missing, missingBody) = try await http.send(.get, "/v1/nothing-here")
            #expect(missing == .notFound)
            #expect(errorOf(missingBody)["code"] as? String == "not-found")
            let (notHead, _) = try await http.send(.head, "/v1/receipts")
            #expect(notHead == .methodNotAllowed)
        }
    }

    @Test("HEAD is answered wherever GET is: GET's status and headers, no body, the same key and query checks")
    func head() async throws {
        try await withLiveApplication { http, _ in
            let health = try await http.client.execute(uri: "/healthz", method: .head, headers: [:])
            #expect(health.status == .ok)
            #expect(health.body.readableBytes == 0)
            let orders = try await http.client.execute(uri: "/v1/orders?limit=2", method: .head, headers: [.authorization: "Bearer \(http.key)"])
            #expect(orders.status == .ok)
            #expect(orders.body.readableBytes == 0)
            #expect(orders.headers[.contentType]?.hasPrefix("application/json") == true)
            let unknown = try await http.client.execute(uri: "/v1/orders?frm=2", method: .head, headers: [.authorization: "Bearer \(http.key)"])
            #expect(unknown.status == .badRequest)
            // A HEAD changes nothing: no catch-up from Apple.
            let refresh = try await http.client.execute(uri: "/v1/subscriptions/1?refresh=true", method: .head, headers: [.authorization: "Bearer \(http.key)"])
            #expect(refresh.status == .badRequest)
            let keyless = try await http.client.execute(uri: "/v1/orders", method: .head, headers: [:])
            #expect(keyless.status == .unauthorized)
            let missing = try await http.client.execute(uri: "/v1/orders/nobody", method: .head, headers: [.authorization: "Bearer \(http.key)"])
            #expect(missing.status == .notFound)
            // On the wire (NIO drops a HEAD answer's body): the error's head with its Content-Length,
            // no body, and the connection's next answer right after it.
            let port = http.client.port
            let (closed, received) = await IdleConnectionTests.onThread {
                IdleConnectionTests.closedBy(port, after: "HEAD /v1/orders/nobody HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(http.key)\r\n\r\n"
                    + "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            }
            let answers = received.components(separatedBy: "\r\n\r\n")
            #expect(closed && answers.count == 3 && answers[0].hasPrefix("HTTP/1.1 404") && answers[1].hasPrefix("HTTP/1.1 200"), "\(received)")
            #expect(answers[0].lowercased().contains("content-length: 0") == false, "\(received)")
        }
    }
}

/// Connections the server closes: one that sends nothing, half a request's head, or less body
/// than it announced, once it has sat idle for the configured time (1 s here; 75 s shipped).
@Suite("Idle and slow connections over HTTP")
struct IdleConnectionTests {
    /// Connects to `port`, sends `text`, and answers whether the server closed the connection
    /// (read 0 bytes) within 30 s, and what it sent before.
    /// A socket connected to 127.0.0.1:`port` whose reads give up after 30 s; nil when it could
    /// not connect. The caller closes it.
    static func connected(to port: Int) -> Int32? { connectedLocalSocket(port: port) }

    static func closedBy(_ port: Int, after text: String) -> (closed: Bool, received: String) {
        guard let descriptor = connected(to: port) else { return (false, "not connected") }
        defer { close(descriptor) }
        if !text.isEmpty { _ = text.withCString { send(descriptor, $0, strlen($0), 0) } }
        var received = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = recv(descriptor, &buffer, buffer.count, 0)
            if count == 0 { return (true, String(decoding: received, as: UTF8.self)) }
            // Reset: closed too. The server closes with bytes of the request still unread when its
            // time-out comes before it read them (a loaded machine), and the kernel then resets.
            // The 30 s passed (EAGAIN): not closed, said for a failure's message.
            if count < 0 {
                let why = errno
                return (why == ECONNRESET, String(decoding: received, as: UTF8.self) + "[recv: \(String(cString: strerror(why)))]")
            }
            received += buffer[0..<count]
        }
    }

    /// `work`, which blocks, on a thread of its own: not on one of the task pool's (one per core).
    static func onThread<T: Sendable>(_ work: @escaping @Sendable () -> T) async -> T {
        await withCheckedContinuation { continuation in
            Thread { continuation.resume(returning: work()) }.start()
        }
    }

    @Test("a request asking to close, in any case or among other options, or an HTTP/1.0 one not asking to keep it, is answered and its connection closed at once")
    func closeInAnyCase() async throws {
        // The idle time-out is an hour here: only the request's own `close` ends the connection
        // before the reading gives up (30 s).
        try await withLiveApplication { http, _ in
            let port = http.client.port
            for options in ["Close", "keep-alive, CLOSE"] {
                let (closed, received) = await Self.onThread {
                    Self.closedBy(port, after: "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: \(options)\r\n\r\n")
                }
                #expect(closed && received.hasPrefix("HTTP/1.1 200"), "\(options): \(received)")
            }
            // HTTP/1.0 closes after the answer unless it asks to keep the connection.
            let (closed, received) = await Self.onThread { Self.closedBy(port, after: "GET /healthz HTTP/1.0\r\n\r\n") }
            #expect(closed && received.contains(" 200 "), "HTTP/1.0: \(received)")
            let (kept, answered) = await Self.onThread {
                Self.closedBy(port, after: "GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /healthz HTTP/1.0\r\n\r\n")
            }
            #expect(kept && answered.components(separatedBy: " 200 ").count == 3, "HTTP/1.0 keep-alive, then a second request: \(answered)")
            // Its Expect: 100-continue is ignored (HTTP/1.0 has no 100): the answer alone.
            let (ended, expected) = await Self.onThread {
                Self.closedBy(port, after: "POST /healthz HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}")
            }
            #expect(ended && !expected.contains(" 100 ") && expected.hasPrefix("HTTP/1.1 "), "HTTP/1.0 Expect: \(expected)")
        }
    }

    @Test("a connection that sends nothing, stops in a request's head or sends less body than announced is closed")
    func slowClientsAreClosed() async throws {
        try await withLiveApplication(configure: { $0.connectionIdleTimeout = 1 }) { http, _ in
            let port = http.client.port
            let cases = [
                "",
                "POST /v1/orders HTTP/1.1\r\nHost: localhost\r\n",
                // With a key: the route waits for the body that never comes.
                "POST /v1/orders HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(http.key)\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"orderId\":",
            ]
            for text in cases {
                let (closed, received) = await Self.onThread { Self.closedBy(port, after: text) }
                #expect(closed && !received.contains("HTTP/1.1 2"), "not closed, or taken, after: \(text.debugDescription): \(received)")
            }
            // A request answered on a connection that then sits idle: its answer, then the close.
            // On a starved machine the time-out may come before the server read the request at all
            // (closed, reset, nothing answered): that says nothing of an answered connection, and
            // the request is sent again on a new one.
            var outcome = (closed: false, received: "")
            for _ in 0..<5 {
                outcome = await Self.onThread { Self.closedBy(port, after: "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n") }
                guard outcome.received.hasPrefix("[recv:") else { break }
            }
            #expect(outcome.closed && outcome.received.hasPrefix("HTTP/1.1 200"), "\(outcome.received)")
        }
    }

    /// Sends `head`, then a byte of its body every 200 ms, until the server closes the connection
    /// (true) or 60 s pass (false).
    static func trickled(_ port: Int, head: String) -> Bool {
        guard let descriptor = connected(to: port) else { return false }
        defer { close(descriptor) }
        var timeout = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        _ = head.withCString { send(descriptor, $0, strlen($0), 0) }
        var buffer = [UInt8](repeating: 0, count: 4096)
        for _ in 0..<300 {
            if "x".withCString({ send(descriptor, $0, 1, Int32(MSG_NOSIGNAL)) }) < 0 { return true }
            let count = recv(descriptor, &buffer, buffer.count, 0)
            if count == 0 { return true }
            if count < 0, errno != EAGAIN, errno != EWOULDBLOCK { return true }
        }
        return false
    }

    @Test("a request whose body trickles in is cut off once it has not arrived whole within its time, though bytes keep coming")
    func trickledBodyIsCutOff() async throws {
        // The idle time-out is an hour here: only the request's own deadline can end it.
        try await withLiveApplication(configure: { $0.requestReadTimeout = 1 }) { http, _ in
            let port = http.client.port
            for head in [
                // Apple's route takes no key, and reads the body.
                "POST /v1/notifications/apple HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
                // Answered 401 at once, its body read on.
                "POST /v1/orders HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
            ] {
                let closed = await Self.onThread { Self.trickled(port, head: head) }
                #expect(closed, "not closed within 60 s: \(head.debugDescription)")
            }
            // A request that arrives whole is answered as ever.
            let (status, _) = try await http.send(.get, "/healthz")
            #expect(status == .ok)
        }
    }

    @Test("connections past the server's most are closed as they open; a place freed is taken again")
    func connectionsPastTheLimitAreClosed() async throws {
        try await withLiveApplication(configure: { $0.maximumConnections = 3 }) { http, _ in
            let port = http.client.port
            // The test's own client holds the first place.
            let (status, _) = try await http.send(.get, "/healthz")
            #expect(status == .ok)
            // Two more, each answered once: the server has taken them in (connections are taken in
            // on several event loops, in no set order) before the fourth comes.
            let held = await Self.onThread {
                (0..<2).compactMap { _ -> Int32? in
                    guard let descriptor = Self.connected(to: port) else { return nil }
                    _ = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n".withCString { send(descriptor, $0, strlen($0), 0) }
                    var buffer = [UInt8](repeating: 0, count: 4096)
                    let count = recv(descriptor, &buffer, buffer.count, 0)
                    guard count > 0, String(decoding: buffer[0..<count], as: UTF8.self).hasPrefix("HTTP/1.1 200") else {
                        close(descriptor)
                        return nil
                    }
                    return descriptor
                }
            }
            #expect(held.count == 2)
            let (closed, received) = await Self.onThread { Self.closedBy(port, after: "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n") }
            #expect(closed && !received.contains("HTTP/1.1"), "the fourth connection: \(received)")
            for descriptor in held { close(descriptor) }
            // Once the server has seen them go (it counts them as it notices), a new one is answered.
            let answered = await Self.onThread {
                for _ in 0..<100 {
                    let (_, received) = Self.closedBy(port, after: "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    if received.hasPrefix("HTTP/1.1 200") { return true }
                    usleep(100_000)
                }
                return false
            }
            #expect(answered)
        }
    }
}
