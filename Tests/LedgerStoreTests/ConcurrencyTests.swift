import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("Event store: optimistic concurrency")
struct ConcurrencyTests {
    @Test("50 concurrent writers with expected versions: one winner per version, versions gapless")
    func fiftyRacingWriters() async throws {
        try await withTestDatabase { db in
            let stream = try uniqueStream()
            let writers = 50
            // Every attempt: (expected version, won?). Each writer retries until it wins once.
            let attempts = try await withThrowingTaskGroup(of: [(Int64, Bool)].self) { group in
                for _ in 0..<writers {
                    group.addTask {
                        var mine: [(Int64, Bool)] = []
                        while true {
                            let current = try await db.store.currentVersion(of: stream)
                            let expected: ExpectedVersion = current < 0 ? .noStream : .exact(current)
                            do {
                                let result = try await db.append([try event()], to: stream, expectedVersion: expected)
                                #expect(result.streamVersion == current + 1)
                                mine.append((current, true))
                                return mine
                            } catch let AppendError.wrongExpectedVersion(_, _, actual) {
                                #expect(actual > current)
                                mine.append((current, false))
                            }
                        }
                    }
                }
                return try await group.reduce(into: []) { $0 += $1 }
            }
            let winsByVersion = Dictionary(grouping: attempts.filter(\.1), by: \.0).mapValues(\.count)
            #expect(winsByVersion.count == writers)
            #expect(winsByVersion.values.allSatisfy { $0 == 1 })
            #expect(attempts.contains { !$0.1 }, "the writers never collided: the test did not race")
            let versions = try await db.store.readStream(stream).map(\.streamVersion)
            #expect(versions == Array(0..<Int64(writers)))
        }
    }

    @Test("writers of different streams do not wait for each other")
    func differentStreamsDoNotBlock() async throws {
        try await withTestDatabase { db in
            let held = try await db.connect()
            let busy = try uniqueStream(), other = try uniqueStream()
            try await held.query("BEGIN", logger: TestServer.logger)
            _ = try await db.append([try event()], to: busy, on: held)
            // The other stream's append completes while the first transaction holds its stream.
            let result = try await db.append([try event()], to: other, expectedVersion: .noStream)
            #expect(result.streamVersion == 0)
            try await held.query("COMMIT", logger: TestServer.logger)
            try await held.close()
        }
    }
}
