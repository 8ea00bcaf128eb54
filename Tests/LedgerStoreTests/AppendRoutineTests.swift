import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// `append_events` called directly: the common case's step leaves a stored event id and a taken
/// new stream to the unique keys, and the full check then answers each write of the same call
/// (promises 3 and 4), storing nothing twice and nothing of a refused write.
@Suite("The append routine")
struct AppendRoutineTests {
    struct Answer {
        let statuses: [String]
        let versions: [Int64]
        let positions: [Int64]
    }

    /// One CALL with one-event writes to plain streams (no projection rows): committed, or left
    /// in the transaction open on `session`.
    func call(
        _ db: TestDatabase, _ writes: [(stream: String, expected: Int64, id: UUID, data: String)], on session: PostgresConnection? = nil
    ) async throws -> Answer {
        let none: [String] = [], noInts: [Int32] = [], noBools: [Bool] = [], noLongs: [Int64] = [], noUUIDs: [UUID] = []
        let query: PostgresQuery =
            """
            CALL append_events(\(writes.indices.map { Int32($0 + 1) }), \(writes.map(\.stream)), \(writes.map(\.expected)),
                \(writes.map(\.id)), \(writes.map { _ in "t" }), \(writes.map(\.data))::jsonb[], \(writes.map { _ in "{}" })::jsonb[],
                \(writes.map { _ in "" }),
                \(noInts), \(noBools), \(none), \(none), \(none), \(noInts), \(none), \(none), \(noUUIDs), \(none), \(noLongs), \(none),
                \(noLongs), \(noLongs), \(noLongs), \(none), \(none), \(none),
                \(noInts), \(noBools), \(none), \(none), \(none), \(none), \(noLongs), \(none), \(none), \(noLongs), \(noLongs), \(none),
                \(none), \(noUUIDs), \(none), \(none), \(none), \(none),
                \(Int64(0)), \(session == nil), NULL, NULL, NULL, NULL)
            """
        let rows = if let session {
            try await session.query(query, logger: TestServer.clientLogger)
        } else {
            try await db.client.query(query, logger: TestServer.clientLogger)
        }
        for try await (statuses, _, versions, positions) in rows.decode(([String], [String], [Int64], [Int64]).self) {
            return Answer(statuses: statuses, versions: versions, positions: positions)
        }
        throw AppendError.invalidBatch("the routine answered nothing")
    }

    func count(_ db: TestDatabase, _ stream: String) async throws -> Int {
        let rows = try await db.client.query("SELECT count(*)::int FROM events WHERE stream_id = \(stream)", logger: TestServer.clientLogger)
        for try await count in rows.decode(Int.self) { return count }
        return -1
    }

    @Test("a replay and a stream that exists, among new writes of one call: each answered, the new ones stored together")
    func fallbackAnswersEachWrite() async throws {
        try await withTestDatabase { db in
            let run = UUID().uuidString.prefix(8)
            let existing = "routine-\(run)-existing"
            let stored = UUID()
            let first = try await call(db, [(existing, -1, stored, #"{"a": 1}"#)])
            #expect(first.statuses == ["appended"])

            let fresh = ["routine-\(run)-a", "routine-\(run)-b"]
            let answer = try await call(db, [
                (fresh[0], -1, UUID(), "{}"),
                (existing, -1, stored, #"{"a": 1}"#),  // a retry: the stored event's answer
                (existing, -1, UUID(), "{}"),  // no stream expected, but it exists
                (fresh[1], -1, UUID(), "{}"),
            ])
            #expect(answer.statuses == ["appended", "replayed", "wrong-expected-version", "appended"])
            #expect(answer.versions == [0, 0, -1, 0])
            #expect(answer.positions[1] == first.positions[0])
            #expect(answer.positions[2] == -1)
            // Both new writes in this call's transaction, one after the other.
            #expect(answer.positions[3] == answer.positions[0] + 1)
            #expect(answer.positions[0] >> 12 != first.positions[0] >> 12)
            #expect(try await count(db, existing) == 1)
            for stream in fresh { #expect(try await count(db, stream) == 1) }
        }
    }

    @Test("calls in one transaction place their events one after another, whichever step stores them")
    func callsInOneTransaction() async throws {
        try await withTestDatabase { db in
            let run = UUID().uuidString.prefix(8)
            let existing = "routine-\(run)-existing"
            let stored = UUID()
            _ = try await call(db, [(existing, -1, stored, "{}")])

            let session = try await db.connect()
            try await session.query("BEGIN", logger: TestServer.clientLogger)
            let lean = try await call(db, [("routine-\(run)-a", -1, UUID(), "{}"), ("routine-\(run)-b", -1, UUID(), "{}")], on: session)
            // A retry among them: the full check stores the new write.
            let checked = try await call(db, [("routine-\(run)-c", -1, UUID(), "{}"), (existing, -1, stored, "{}")], on: session)
            let leanAgain = try await call(db, [("routine-\(run)-d", -1, UUID(), "{}")], on: session)
            try await session.query("COMMIT", logger: TestServer.clientLogger)
            try await session.close()

            #expect(lean.statuses == ["appended", "appended"])
            #expect(checked.statuses == ["appended", "replayed"])
            #expect(leanAgain.statuses == ["appended"])
            let first = lean.positions[0]
            #expect(first % 4096 == 0, "the transaction's first position")
            #expect(lean.positions == [first, first + 1])
            #expect(checked.positions[0] == first + 2)
            #expect(leanAgain.positions == [first + 3])
        }
    }
}
