import Foundation
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// The one lease every background job claims, renews and releases its work through.
@Suite("Leases")
struct LeaseTests {
    @Test("claimers racing for one lease, each through its own client: exactly one wins")
    func oneWinner() async throws {
        try await withTestDatabase { db in
            let won = try await withThrowingTaskGroup(of: Lease?.self) { group in
                for _ in 0..<8 {
                    group.addTask {
                        // A pool each, as separate servers have.
                        let client = PostgresClient(configuration: db.configuration, backgroundLogger: TestServer.clientLogger)
                        return try await withThrowingTaskGroup(of: Lease?.self) { inner in
                            inner.addTask { await client.run(); return nil }
                            defer { inner.cancelAll() }
                            return try await Leases(database: Database(client: client, logger: TestServer.logger)).claim("race", for: 600)
                        }
                    }
                }
                return try await group.reduce(into: [Lease]()) { if let lease = $1 { $0.append(lease) } }
            }
            #expect(won.count == 1, "\(won)")
            #expect(try await Leases(database: db.database).claim("race", for: 600) == nil, "held: no one else gets it")
        }
    }

    @Test("an expired lease is taken over; its former holder can neither renew nor release it")
    func expiredIsTakenOver() async throws {
        try await withTestDatabase { db in
            let leases = Leases(database: db.database)
            // Zero seconds: expired as soon as it is taken.
            let first = try #require(try await leases.claim("sweep/acct-1", for: 0))
            let second = try #require(try await leases.claim("sweep/acct-1", for: 600), "an expired lease is free")
            #expect(second.holder != first.holder)
            #expect(try await leases.renew(first, for: 600) == false, "a holder that lost its lease cannot renew it")
            try await leases.release(first)
            #expect(try await leases.claim("sweep/acct-1", for: 600) == nil, "the former holder's release frees nothing")
            #expect(try await leases.renew(second, for: 600), "the new holder renews it")
        }
    }

    @Test("a released lease is free at once; an expired one cannot be renewed even when no one took it")
    func releasedIsFree() async throws {
        try await withTestDatabase { db in
            let leases = Leases(database: db.database)
            let held = try #require(try await leases.claim("backfill", for: 600))
            #expect(try await leases.claim("backfill", for: 600) == nil)
            try await leases.release(held)
            let again = try #require(try await leases.claim("backfill", for: 0), "free at once after its release")
            #expect(try await leases.renew(again, for: 600) == false, "expired is lost, taken over or not")
        }
    }

    @Test("a batch claim takes the free leases of its names and leaves the held ones")
    func batch() async throws {
        try await withTestDatabase { db in
            let leases = Leases(database: db.database)
            let held = try #require(try await leases.claim("call/b", for: 600))
            let taken = try await leases.claim(["call/a", "call/b", "call/c"], for: 600)
            #expect(taken.map(\.name).sorted() == ["call/a", "call/c"])
            #expect(Set(taken.map(\.holder)).count == 1, "one holder for the batch")
            try await leases.release(taken)
            #expect(try await leases.claim(["call/a", "call/b", "call/c"], for: 600).map(\.name).sorted() == ["call/a", "call/c"])
            #expect(try await leases.renew(held, for: 600))
        }
    }

    @Test("withLease runs its body under the lease and releases it however the body ends; a held lease skips the body")
    func withLease() async throws {
        try await withTestDatabase { db in
            let leases = Leases(database: db.database)
            struct Failed: Error {}
            await #expect(throws: Failed.self) {
                _ = try await leases.withLease("job", for: 600) { _ in throw Failed() }
            }
            let ran = try await leases.withLease("job", for: 600) { lease in
                try await leases.withLease("job", for: 600) { _ in "inner" } ?? "skipped while \(lease.name) is held"
            }
            #expect(ran == "skipped while job is held")
            #expect(try await leases.claim("job", for: 600) != nil, "released after the body")
        }
    }
}
