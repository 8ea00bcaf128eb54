import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Synchronization
import Testing

@Suite("Event store: the gap-safe global feed")
struct GapSafetyTests {
    @Test("a transaction that took a lower position and commits late is not skipped by a reader")
    func lateCommitIsNotSkipped() async throws {
        try await withTestDatabase { db in
            let slow = try await db.connect(id: 1)
            let fast = try await db.connect(id: 2)
            let start = try await db.store.readAll(after: 0).last?.position ?? 0

            // The slow writer takes its position first and keeps its transaction open.
            try await slow.query("BEGIN", logger: TestServer.logger)
            let late = try await db.append([try event("created")], to: try uniqueStream(), on: slow)
            // The fast writer appends afterwards and commits at once: a higher position, visible first.
            let early = try await db.append([try event("created")], to: try uniqueStream(), on: fast)
            #expect(late.positions[0] < early.positions[0])

            // The scenario is real: a naive reader ordering by position would now see the higher one.
            let naive = try await fast.query(
                "SELECT global_position FROM events WHERE global_position > \(start) ORDER BY global_position",
                logger: TestServer.logger)
            var naivePositions: [Int64] = []
            for try await position in naive.decode(Int64.self) { naivePositions.append(position) }
            #expect(naivePositions == early.positions)

            // The gap-safe reader does not pass the open transaction's position.
            var cursor = start
            var seen: [Int64] = []
            let whileOpen = try await db.store.readAll(after: cursor)
            #expect(!whileOpen.contains { $0.position >= late.positions[0] })
            seen += whileOpen.map(\.position)
            cursor = whileOpen.last?.position ?? cursor

            try await slow.query("COMMIT", logger: TestServer.logger)

            // Resuming after the last position it saw, the reader gets both events, lower first.
            // (Other tests' open transactions in the same cluster may delay visibility: `feedVisibilityPatience`.)
            let deadline = ContinuousClock.now + feedVisibilityPatience
            while !seen.contains(early.positions[0]), ContinuousClock.now < deadline {
                let page = try await db.store.readAll(after: cursor)
                seen += page.map(\.position)
                cursor = page.last?.position ?? cursor
                if page.isEmpty { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(seen == [late.positions[0], early.positions[0]])
            try await slow.close()
            try await fast.close()
        }
    }

    @Test("the Apple call feed does not pass a request whose transaction commits late; it queues it once it commits")
    func appleCallFeedWaitsForLateCommits() async throws {
        try await withTestDatabase { db in
            let queue = AppleCallQueue(orders: OrderLedger(writer: db.writer), leases: Leases(database: db.database))
            let switches = AppleCallQueue.Switches(consumption: true)
            // A CONSUMPTION_REQUEST recorded in a transaction that takes its position first and commits last.
            func request(_ id: String) throws -> NewEvent {
                try event("notification-received", """
                    {"notificationUUID": "\(UUID().uuidString)", "notificationType": "CONSUMPTION_REQUEST", "transactionId": "\(id)", "signedDate": "\(EventCoding.formatDate(Date()))"}
                    """)
            }
            let slow = try await db.connect(id: 1)
            try await slow.query("BEGIN", logger: TestServer.logger)
            let late = try await db.append([try request("9900001")], to: try uniqueStream("notification"), on: slow)
            let early = try await db.append([try request("9900002")], to: try uniqueStream("notification"))
            #expect(late.positions[0] < early.positions[0])

            _ = try await queue.catchUp(switches)
            let readTo = try await scalarPosition(db, "SELECT read_to FROM apple_call_feed")
            #expect(readTo < late.positions[0], "the feed stopped before the open transaction's position")
            #expect(try await scalarPosition(db, "SELECT count(*) FROM apple_calls") == 0)

            try await slow.query("COMMIT", logger: TestServer.logger)
            try await slow.close()
            // Other tests' open transactions in the same cluster may hold the safe position back: `feedVisibilityPatience`.
            let deadline = ContinuousClock.now + feedVisibilityPatience
            while try await scalarPosition(db, "SELECT read_to FROM apple_call_feed") < early.positions[0], ContinuousClock.now < deadline {
                _ = try await queue.catchUp(switches)
                try await Task.sleep(for: .milliseconds(20))
            }
            let queued = try await db.client.query("SELECT transaction_id FROM apple_calls ORDER BY transaction_id", logger: TestServer.logger)
            var ids: [String] = []
            for try await id in queued.decode(String.self) { ids.append(id) }
            #expect(ids == ["9900001", "9900002"], "both requests queued, once each")
        }
    }

    /// One bigint value of a query's first row.
    func scalarPosition(_ db: TestDatabase, _ query: PostgresQuery) async throws -> Int64 {
        for try await value in try await db.client.query(query, logger: TestServer.logger).decode(Int64.self) { return value }
        return -1
    }

    // The limit only ends a feed that never moves again (a hang), far beyond any slow machine.
    @Test("a reader polling during concurrent appends sees every committed event exactly once", .timeLimit(.minutes(10)))
    func pollingReaderMissesNothing() async throws {
        try await withTestDatabase { db in
            let writers = 8, perWriter = 40
            // Writers still running, and the last position they wrote: the reader stops once every
            // writer is done and it has read up to that position (or past it, skipping some), never
            // by a clock, so a slow machine only makes it wait longer.
            let writing = Writing(writers)
            let appended = try await withThrowingTaskGroup(of: [Int64].self) { group in
                for _ in 0..<writers {
                    group.addTask {
                        var positions: [Int64] = []
                        for _ in 0..<perWriter {
                            positions += try await db.append([try event()], to: try uniqueStream()).positions
                        }
                        let mine = positions.max() ?? 0
                        writing.state.withLock { $0 = (running: $0.running - 1, last: max($0.last, mine)) }
                        return positions
                    }
                }
                group.addTask {
                    // The reader: follows the feed while the writers run, never re-reading.
                    var cursor: Int64 = 0
                    var seen: [Int64] = []
                    while seen.count < writers * perWriter {
                        let page = try await db.store.readAll(after: cursor, limit: 7)
                        seen += page.map(\.position)
                        cursor = page.last?.position ?? cursor
                        let (running, last) = writing.state.withLock { ($0.running, $0.last) }
                        if running == 0, cursor >= last { break }
                        // Other tests' open transactions on the shared cluster may hold the feed back a while.
                        if page.isEmpty { try await Task.sleep(for: .milliseconds(2)) }
                    }
                    return seen.map { -$0 }  // negated to tell the reader's list apart
                }
                return try await group.reduce(into: [[Int64]]()) { $0.append($1) }
            }
            let read = appended.first { $0.first.map { $0 < 0 } ?? false }.map { $0.map { -$0 } } ?? []
            let written = appended.filter { $0.first.map { $0 > 0 } ?? false }.flatMap { $0 }
            #expect(written.count == writers * perWriter)
            #expect(read == written.sorted(), "the reader skipped or repeated events")
        }
    }
}

/// The writers still running and the last position they wrote, shared with the reader.
private final class Writing: Sendable {
    let state: Mutex<(running: Int, last: Int64)>
    init(_ writers: Int) { state = Mutex((running: writers, last: 0)) }
}
