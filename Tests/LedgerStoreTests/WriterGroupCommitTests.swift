import Foundation
import PostgresNIO
import LedgerCore
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("The writer: group commit")
struct WriterGroupCommitTests {
    enum Outcome: Equatable {
        case appended(Int64), replayed, wrongVersion(Int64), conflict, invalid
    }

    func outcome(_ body: () async throws -> LedgerWriter.Appended) async -> Outcome {
        do {
            let result = try await body().result
            return result.replayed ? .replayed : .appended(result.streamVersion)
        } catch AppendError.wrongExpectedVersion(_, _, let current) {
            return .wrongVersion(current)
        } catch AppendError.eventIDConflict {
            return .conflict
        } catch {
            return .invalid
        }
    }

    @Test("appends sharing transactions are each checked and answered on their own")
    func mixedBatch() async throws {
        try await withTestDatabase { db in
            // One writer slot: everything that arrives while it writes is batched.
            let writer = LedgerWriter(database: db.database)
            let existing = try uniqueStream()
            let stored = try event("created", #"{"a": 1}"#)
            _ = try await writer.append([stored, try event()], to: existing)
            let shared = try uniqueStream()
            let before = writer.groupCommitStatistics

            let outcomes = await withTaskGroup(of: (String, Outcome).self) { group in
                for index in 0..<24 {
                    group.addTask { ("fresh", await outcome { try await writer.append([try event()], to: try uniqueStream("fresh-\(index)"), expected: .noStream) }) }
                }
                for _ in 0..<16 {
                    group.addTask { ("shared", await outcome { try await writer.append([try event()], to: shared) }) }
                }
                for _ in 0..<8 {
                    group.addTask { ("stale", await outcome { try await writer.append([try event()], to: existing, expected: .exact(0)) }) }
                }
                for _ in 0..<4 {
                    group.addTask { ("reused", await outcome { try await writer.append([try event("created", #"{"a": 2}"#, id: stored.id)], to: existing) }) }
                    group.addTask { ("retry", await outcome { try await writer.append([stored], to: existing) }) }
                    group.addTask { ("not-json", await outcome { try await writer.append([try event("created", "{oops")], to: try uniqueStream()) }) }
                    group.addTask { ("exists", await outcome { try await writer.append([try event()], to: existing, expected: .noStream) }) }
                }
                return await group.reduce(into: [(String, Outcome)]()) { $0.append($1) }
            }
            let byKind = Dictionary(grouping: outcomes, by: \.0).mapValues { $0.map(\.1) }
            #expect(byKind["fresh"]?.allSatisfy { $0 == .appended(0) } == true)
            #expect(byKind["shared"]?.compactMap { if case .appended(let v) = $0 { v } else { nil } }.sorted() == Array(Int64(0)..<16))
            #expect(byKind["stale"]?.allSatisfy { if case .wrongVersion = $0 { true } else { false } } == true)
            #expect(byKind["reused"]?.allSatisfy { $0 == .conflict } == true)
            #expect(byKind["retry"]?.allSatisfy { $0 == .replayed } == true)
            #expect(byKind["not-json"]?.allSatisfy { $0 == .invalid } == true)
            #expect(byKind["exists"] == Array(repeating: .wrongVersion(1), count: 4))

            let after = writer.groupCommitStatistics
            #expect(after.writes - before.writes == outcomes.count)
            #expect(outcomes.count == 64)
            #expect(after.groups - before.groups < 64, "no two appends shared a transaction")
            #expect(try await db.store.readStream(shared).map(\.streamVersion) == Array(Int64(0)..<16))
            #expect(try await db.store.readStream(existing).count == 2)
        }
    }

    @Test("a batch of distinct streams: multi-event appends and wrong versions answered each on their own")
    func distinctStreamsBatch() async throws {
        try await withTestDatabase { db in
            let writer = LedgerWriter(database: db.database)
            let existing = try (0..<20).map { _ in try uniqueStream() }
            for stream in existing { _ = try await writer.append([try event()], to: stream) }
            let before = writer.groupCommitStatistics

            let results = await withTaskGroup(of: (Int, Result<AppendResult, any Error>).self) { group in
                for (index, stream) in existing.enumerated() {
                    group.addTask {
                        let result = await Result(catching: {
                            index < 10
                                ? try await writer.append(try (0..<3).map { _ in try event() }, to: stream, expected: .exact(0)).result
                                : try await writer.append([try event(), try event()], to: stream, expected: .exact(7)).result
                        })
                        return (index, result)
                    }
                }
                for index in 20..<30 {
                    group.addTask { (index, await Result(catching: { try await writer.append([try event()], to: try uniqueStream(), expected: .noStream).result })) }
                }
                return await group.reduce(into: [Int: Result<AppendResult, any Error>]()) { $0[$1.0] = $1.1 }
            }
            var positions: [Int64] = []
            for index in 0..<30 {
                switch (index, results[index]) {
                case (0..<10, .success(let result)?):
                    #expect(result.streamVersion == 3)
                    #expect(result.positions == Array(result.positions[0]...(result.positions[0] + 2)))
                    positions += result.positions
                case (10..<20, .failure(AppendError.wrongExpectedVersion(_, _, let current))?):
                    #expect(current == 0)
                case (20..<30, .success(let result)?):
                    #expect(result.streamVersion == 0)
                    positions += result.positions
                default:
                    Issue.record("append \(index) answered \(String(describing: results[index]))")
                }
            }
            #expect(Set(positions).count == 40)
            // Written together, not each alone after a failed batch: positions are xid * 4096 + n.
            #expect(Set(positions.map { $0 >> 12 }).count < 20, "every append went alone")
            for stream in existing[10...] { #expect(try await db.store.readStream(stream).count == 1) }
            for stream in existing[..<10] { #expect(try await db.store.readStream(stream).map(\.streamVersion) == [0, 1, 2, 3]) }
            let after = writer.groupCommitStatistics
            #expect(after.groups - before.groups < 30, "no two appends shared a transaction")
        }
    }

    @Test("a batch never holds more events than one transaction can position")
    func largeAppendsSplitAcrossTransactions() async throws {
        try await withTestDatabase { db in
            let writer = LedgerWriter(database: db.database)
            let results = try await withThrowingTaskGroup(of: AppendResult.self) { group in
                for _ in 0..<6 {
                    group.addTask { try await writer.append(try (0..<1500).map { _ in try event() }, to: try uniqueStream()).result }
                }
                return try await group.reduce(into: [AppendResult]()) { $0.append($1) }
            }
            #expect(results.allSatisfy { $0.streamVersion == 1499 && $0.positions.count == 1500 })
            // 9000 events cannot share one transaction (4096 at most): at least three were used.
            let transactions = Set(results.flatMap { $0.positions.map { $0 >> 12 } })
            #expect(transactions.count >= 3)
        }
    }

    @Test("a group that fails as a whole is written write by write: a pool of one still answers every append")
    func failedBatchOnAPoolOfOne() async throws {
        try await withTestDatabase { db in try await db.withPoolOfOne { database in
            let writer = LedgerWriter(database: database)
            let existing = try uniqueStream()
            let stored = try event()
            _ = try await writer.append([stored], to: existing)

            // Each round: a body PostgreSQL refuses as JSON (the call fails as a whole, and each
            // write goes alone), and a retry, among fresh appends.
            let outcomes = await answered(within: .seconds(120)) {
                var outcomes: [Outcome] = []
                for _ in 0..<4 {
                    outcomes += await withTaskGroup(of: Outcome.self) { group in
                        for index in 0..<12 {
                            group.addTask {
                                switch index {
                                case 5: await outcome { try await writer.append([stored], to: existing) }
                                case 7: await outcome { try await writer.append([try event("created", "{oops")], to: try uniqueStream()) }
                                default: await outcome { try await writer.append([try event()], to: try uniqueStream(), expected: .noStream) }
                                }
                            }
                        }
                        return await group.reduce(into: []) { $0.append($1) }
                    }
                }
                return outcomes
            }
            guard case .success(let all)? = outcomes else {
                Issue.record("appends unanswered within 120 s on a pool of one: \(String(describing: outcomes))")
                return
            }
            #expect(all.count { $0 == .replayed } == 4)
            #expect(all.count { $0 == .invalid } == 4)
            #expect(all.count { $0 == .appended(0) } == 40)
            #expect(writer.groupCommitStatistics.groups < 49, "no two appends shared a transaction")
        } }
    }
}
