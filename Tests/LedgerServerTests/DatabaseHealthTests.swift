import Foundation
@testable import LedgerServer
@testable import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The health probe against a real PostgreSQL made slow: a backend that does not answer for a
/// while is one missed probe, not a down database.
@Suite("Database health under a slow PostgreSQL")
struct DatabaseHealthTests {
    @Test("a slow database is not a down one: the probe's backend stopped past a probe's time-out, appends meanwhile all succeed")
    func slowIsNotDown() async throws {
        try await withLiveApplication { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("h-0"))
            let stuck = try await probeBackend(db, other: nil)
            // The probe's backend stops answering (SIGSTOP): the probe misses once, drops that
            // connection and connects afresh. Appends go on meanwhile, on their own connections.
            kill(stuck, SIGSTOP)
            let outcome: Result<[Int], any Error>
            do {
                let reconnected = Flag()
                outcome = .success(try await withThrowingTaskGroup(of: [Int].self) { group in
                    for client in 0..<4 {
                        group.addTask {
                            var statuses: [Int] = []
                            var number = 0
                            // Until the probe has missed and connected afresh, and a few more.
                            while (number < 5 || !reconnected.isSet) && !Task.isCancelled {
                                let order = "h-\(client)-\(number)"
                                number += 1
                                statuses.append(Int(try await http.send(.post, "/v1/orders", json: newOrder(order)).0.code))
                                statuses.append(Int(try await http.send(.post, "/v1/orders/\(order)/events", json: [
                                    "type": "payment-added", "data": ["queuedAt": "2026-11-21T10:00:00Z"],
                                ]).0.code))
                            }
                            return statuses
                        }
                    }
                    _ = try await probeBackend(db, other: stuck)
                    reconnected.set()
                    return try await group.reduce(into: []) { $0 += $1 }
                })
            } catch {
                outcome = .failure(error)
            }
            kill(stuck, SIGCONT)
            let statuses = try outcome.get()
            #expect(statuses.allSatisfy { $0 == 201 }, "answers while the probe's backend was stopped: \(Dictionary(statuses.map { ($0, 1) }, uniquingKeysWith: +))")
            let ready = try await http.client.execute(uri: "/readyz", method: .get)
            #expect(ready.status == .ok)
        }
    }
}

@Suite("Database health: the pool's answers count")
struct DatabaseHealthEvidenceTests {
    @Test("a probe left unanswered while PostgreSQL answers the pool is no miss; with nothing answered it is")
    func poolAnswersAreEvidence() async throws {
        try await withTestDatabase { db in
            // The probe's way to PostgreSQL goes nowhere: a listener that takes connections and
            // never says a word. PostgreSQL itself answers the pool as usual.
            let silent = try SilentListener()
            defer { silent.close() }
            let probing = PostgresConnection.Configuration(host: "127.0.0.1", port: silent.port, username: "x", password: nil, database: "x", tls: .disable)
            // The pool's work counts PostgreSQL's answers.
            let counted = db.database.answers.total
            try await db.database.query("SELECT 1")
            #expect(db.database.answers.total > counted, "an answered statement of the pool is counted")
            // One miss would be down: the probe waits (10 s) while the pool is answered. The
            // answer is counted as soon as the probe is seen waiting, not raced against its
            // time-out by a statement of its own.
            let health = DatabaseHealth(probing: probing, answers: db.database.answers, logger: TestServer.logger,
                                        timeout: .seconds(10), missesBeforeDown: 1)
            let probed = Task { await health.probeNow() }
            try await silent.waitForConnections(1)
            db.database.answers.note()
            let available = await probed.value
            #expect(available, "an unanswered probe while the pool was answered marked the database down")
            #expect(health.isAvailable)
            // Nothing answered meanwhile: the same silence is a miss, and down.
            let quiet = DatabaseHealth(probing: probing, answers: db.database.answers, logger: TestServer.logger,
                                       timeout: .milliseconds(200), missesBeforeDown: 1)
            #expect(await quiet.probeNow() == false)
            #expect(!quiet.isAvailable)
        }
    }
}

/// A TCP listener on 127.0.0.1 that accepts connections, counts them and never answers: a
/// PostgreSQL that went silent, as a client connecting to it sees it.
private final class SilentListener: Sendable {
    let port: Int
    private let socket: Int32
    private let accepted = Mutex<[Int32]>([])

    var connections: Int { accepted.withLock { $0.count } }

    init() throws {
        let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                bind(socket, address, length) == 0 && listen(socket, 16) == 0 && getsockname(socket, address, &length) == 0
            }
        }
        guard socket >= 0, bound else { throw SilentListenerError() }
        self.socket = socket
        port = Int(UInt16(bigEndian: address.sin_port))
        Thread.detachNewThread { [self] in
            while true {
                let connection = accept(socket, nil, nil)
                guard connection >= 0 else { return }
                accepted.withLock { $0.append(connection) }
            }
        }
    }

    /// Until `count` connections were accepted (60 s at most).
    func waitForConnections(_ count: Int) async throws {
        let deadline = ContinuousClock.now + .seconds(60)
        while connections < count {
            guard ContinuousClock.now < deadline else { throw SilentListenerError() }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    func close() {
        shutdown(socket, Int32(SHUT_RDWR))
        Glibc.close(socket)
        for connection in accepted.withLock({ $0 }) { Glibc.close(connection) }
    }
}

private struct SilentListenerError: Error {}

/// The pid of the backend serving the health probe of the server on `db` (not `other`), once
/// there is one (60 s at most).
private func probeBackend(_ db: TestDatabase, other: Int32?) async throws -> Int32 {
    let deadline = ContinuousClock.now + .seconds(60)
    while ContinuousClock.now < deadline {
        let pid = try await scalar(db, """
            SELECT pid FROM pg_stat_activity
            WHERE application_name = \(DatabaseProbe.applicationName) AND datname = \(db.name) AND pid <> \(other ?? 0)
            ORDER BY backend_start DESC LIMIT 1
            """, as: Int32.self)
        if let pid { return pid }
        try await Task.sleep(for: .milliseconds(50))
    }
    throw ProbeNotFound()
}

private struct ProbeNotFound: Error, CustomStringConvertible {
    var description: String { "no (new) backend of the health probe in pg_stat_activity within 60 s" }
}

private final class Flag: Sendable {
    private let value = Atomic<Bool>(false)
    var isSet: Bool { value.load(ordering: .relaxed) }
    func set() { value.store(true, ordering: .relaxed) }
}
