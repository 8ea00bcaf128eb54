import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("Event store: idempotent retries")
struct IdempotencyTests {
    @Test("re-sending the same event id and body returns the first result and appends nothing")
    func retryReturnsFirstResult() async throws {
        try await withTestDatabase { db in
            let stream = try uniqueStream()
            let batch = [try event("created", #"{"a": 1, "b": [1, 2]}"#), try event("payment-added", "{}")]
            let first = try await db.append(batch, to: stream, expectedVersion: .noStream)
            // The retry still says .noStream although the stream now exists: it is a replay, not a conflict.
            let again = try await db.append(batch, to: stream, expectedVersion: .noStream)
            #expect(again.replayed)
            #expect(again.positions == first.positions)
            #expect(again.streamVersion == first.streamVersion)
            // Key order and spacing do not make a different body.
            let reordered = [try event("created", #"{"b":[1,2],"a":1}"#, id: batch[0].id), batch[1]]
            #expect(try await db.append(reordered, to: stream).replayed)
            #expect(try await db.store.readStream(stream).count == 2)
        }
    }

    @Test("the same event id with a different body, type or stream is a conflict")
    func conflictingReuse() async throws {
        try await withTestDatabase { db in
            let stream = try uniqueStream()
            let original = try event("created", #"{"a": 1}"#)
            _ = try await db.append([original], to: stream)
            await #expect(throws: AppendError.eventIDConflict(original.id)) {
                try await db.append([try event("created", #"{"a": 2}"#, id: original.id)], to: stream)
            }
            await #expect(throws: AppendError.eventIDConflict(original.id)) {
                try await db.append([try event("finished", #"{"a": 1}"#, id: original.id)], to: stream)
            }
            await #expect(throws: AppendError.eventIDConflict(original.id)) {
                try await db.append([original], to: try uniqueStream())
            }
            // A batch that repeats one stored event next to a new one is not a replay either.
            await #expect(throws: AppendError.eventIDConflict(original.id)) {
                try await db.append([original, try event()], to: stream)
            }
            #expect(try await db.store.readStream(stream).count == 1)
        }
    }

    @Test("concurrent identical retries append once")
    func concurrentRetries() async throws {
        try await withTestDatabase { db in
            let stream = try uniqueStream()
            let batch = [try event()]
            let results = try await withThrowingTaskGroup(of: AppendResult.self) { group in
                for _ in 0..<16 { group.addTask { try await db.append(batch, to: stream) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(results.filter { !$0.replayed }.count == 1)
            #expect(Set(results.map(\.positions)).count == 1)
            #expect(try await db.store.readStream(stream).count == 1)
        }
    }
}
