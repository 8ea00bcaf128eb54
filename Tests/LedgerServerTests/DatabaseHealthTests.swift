import Foundation
import LedgerStore
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
