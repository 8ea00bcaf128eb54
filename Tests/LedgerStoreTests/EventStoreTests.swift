import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import Synchronization
import Testing

@Suite("Event store: append and read")
struct EventStoreTests {
    @Test("appended events read back in order with their bodies")
    func appendAndRead() async throws {
        try await withTestDatabase { db in
            let stream = try uniqueStream()
            let events = try [event("created", #"{"userId":"u1","price":"0.99"}"#), event("payment-added", #"{"queuedAt":"2026-01-01T00:00:00Z"}"#), event("finished", "{}")]
            let result = try await db.append(events, to: stream, expectedVersion: .noStream)
            #expect(result.streamVersion == 2)
            #expect(result.replayed == false)
            #expect(result.positions.count == 3)
            #expect(result.positions == result.positions.sorted())

            let read = try await db.store.readStream(stream)
            #expect(read.map(\.streamVersion) == [0, 1, 2])
            #expect(read.map(\.type) == ["created", "payment-added", "finished"])
            #expect(read.map(\.id) == events.map(\.id))
            #expect(read.map(\.position) == result.positions)
            #expect(jsonObject(read[0].data) == jsonObject(events[0].data))
            #expect(read.allSatisfy { $0.streamID == stream })

            let tail = try await db.store.readStream(stream, from: 1)
            #expect(tail.map(\.streamVersion) == [1, 2])
            #expect(try await db.store.currentVersion(of: stream) == 2)
            #expect(try await db.store.currentVersion(of: try uniqueStream()) == -1)
        }
    }

    @Test("the append observer hears of committed appends only: not a rolled-back transaction's, not a replay")
    func appendObserver() async throws {
        try await withTestDatabase { db in
            let heard = Mutex<[String]>([])
            let database = db.database.observingAppends { types in heard.withLock { $0 += types } }
            let writer = LedgerWriter(database: database)
            struct Abandoned: Error {}
            await #expect(throws: Abandoned.self) {
                try await database.transaction { transaction in
                    _ = try await writer.append(.init(.init([try event("payment-added")], to: try uniqueStream())), in: transaction)
                    throw Abandoned()
                }
            }
            #expect(heard.withLock { $0 } == [])
            let inTransaction = try event("verified")
            let stream = try uniqueStream()
            try await database.transaction { transaction in
                _ = try await writer.append(.init(.init([inTransaction], to: stream)), in: transaction)
                #expect(heard.withLock { $0 } == [], "not before COMMIT")
            }
            #expect(heard.withLock { $0 } == ["verified"])
            let alone = try event("delivered")
            _ = try await writer.append([alone], to: stream)
            _ = try await writer.append([alone], to: stream)
            #expect(heard.withLock { $0 } == ["verified", "delivered"])
        }
    }

    @Test("the global feed returns events after a position, in position order, up to the limit")
    func readAll() async throws {
        try await withTestDatabase { db in
            let first = try uniqueStream(), second = try uniqueStream()
            let a = try await db.append([try event(), try event()], to: first)
            let b = try await db.append([try event()], to: second)
            let all = try await db.store.readAllWhenVisible(after: 0, count: 3)
            #expect(all.map(\.position) == a.positions + b.positions)
            #expect(all.map(\.streamID) == [first, first, second])
            let afterFirst = try await db.store.readAll(after: a.positions[0])
            #expect(afterFirst.map(\.position) == [a.positions[1]] + b.positions)
            let limited = try await db.store.readAll(after: 0, limit: 2)
            #expect(limited.map(\.position) == a.positions)
            #expect(try await db.store.readAll(after: b.positions[0]).isEmpty)
        }
    }

    @Test("every expected-version case, and the conflict carries the current version")
    func expectedVersions() async throws {
        try await withTestDatabase { db in
            let stream = try uniqueStream()
            // exact version on a stream that does not exist: current is -1 (no stream)
            await #expect(throws: AppendError.wrongExpectedVersion(stream: stream, expected: .exact(0), current: -1)) {
                try await db.append([try event()], to: stream, expectedVersion: .exact(0))
            }
            #expect(try await db.append([try event()], to: stream, expectedVersion: .noStream).streamVersion == 0)
            await #expect(throws: AppendError.wrongExpectedVersion(stream: stream, expected: .noStream, current: 0)) {
                try await db.append([try event()], to: stream, expectedVersion: .noStream)
            }
            #expect(try await db.append([try event()], to: stream, expectedVersion: .exact(0)).streamVersion == 1)
            await #expect(throws: AppendError.wrongExpectedVersion(stream: stream, expected: .exact(0), current: 1)) {
                try await db.append([try event()], to: stream, expectedVersion: .exact(0))
            }
            await #expect(throws: AppendError.wrongExpectedVersion(stream: stream, expected: .exact(5), current: 1)) {
                try await db.append([try event()], to: stream, expectedVersion: .exact(5))
            }
            #expect(try await db.append([try event()], to: stream, expectedVersion: .any).streamVersion == 2)
            // A refused append stored nothing.
            #expect(try await db.store.readStream(stream).count == 3)
        }
    }

    @Test("invalid batches are refused with a reason and store nothing")
    func invalidBatches() async throws {
        try await withTestDatabase { db in
            let stream = try uniqueStream()
            let id = EventID()
            await #expect(throws: AppendError.self) {
                try await db.append([try event(id: id), try event(id: id)], to: stream)
            }
            await #expect(throws: AppendError.self) {
                try await db.append([try event("created", "{not json")], to: stream)
            }
            await #expect(throws: AppendError.self) {
                try await db.append([], to: stream)
            }
            #expect(try await db.store.currentVersion(of: stream) == -1)
        }
    }
}
