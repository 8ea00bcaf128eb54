import Foundation
import Logging
import PostgresNIO

/// A claim on one piece of background work (an account's history sweep, the notification
/// backfill, a call to Apple) that no other holder can take until it is released or expires.
public struct Lease: Sendable, Equatable {
    /// What is leased, such as `history-sweep/<account>`.
    public let name: String
    /// Who holds it: one id per claim, so two claims of one server are two holders.
    public let holder: UUID
}

/// The leases of background work, in the table `leases`: how several servers divide that work
/// without holding a database transaction open while Apple answers (an open one would hold the
/// gap-safe feed back). Times are the database's, so servers' clocks never disagree about expiry.
///
/// A lease is claimed when it is free (never taken, released, or expired); renewed only by its
/// holder and only while it has not expired, so a holder that lost it cannot take it back; and
/// released by its holder, after which it is free at once. Work done under a lease is safe to do
/// twice (each job names the events it writes), so an expiry at a bad moment costs a repeat,
/// never a double effect.
public struct Leases: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// The lease on `name` for `duration` seconds, or nil when another holder has it.
    public func claim(_ name: String, for duration: TimeInterval) async throws -> Lease? {
        try await claim([name], for: duration).first
    }

    /// The leases of those of `names` that are free, for `duration` seconds, under one holder.
    public func claim(_ names: [String], for duration: TimeInterval) async throws -> [Lease] {
        guard !names.isEmpty else { return [] }
        let holder = UUID()
        // Two claimers of a free name: one inserts, the other waits on its row and then finds it
        // unexpired, so it updates nothing and is not answered.
        let rows = try await database.query(
            """
            INSERT INTO leases (name, holder, expires_at)
            SELECT n, \(holder), now() + make_interval(secs => \(duration)) FROM unnest(\(names)::text[]) AS n
            ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
             WHERE leases.expires_at <= now()
            RETURNING name
            """)
        var leases: [Lease] = []
        for try await name in rows.decode(String.self) { leases.append(Lease(name: name, holder: holder)) }
        return leases
    }

    /// Extends `lease` to `duration` seconds from now; false when its holder no longer has it
    /// (expired, or taken over): the holder should then stop the work.
    public func renew(_ lease: Lease, for duration: TimeInterval) async throws -> Bool {
        let rows = try await database.query(
            """
            UPDATE leases SET expires_at = now() + make_interval(secs => \(duration))
             WHERE name = \(lease.name) AND holder = \(lease.holder) AND expires_at > now()
            RETURNING 1
            """)
        for try await _ in rows { return true }
        return false
    }

    /// Frees `lease` at once if its holder still has it.
    public func release(_ lease: Lease) async throws {
        try await database.query("DELETE FROM leases WHERE name = \(lease.name) AND holder = \(lease.holder)")
    }

    /// Frees `leases` of one holder at once (those it still has).
    public func release(_ leases: [Lease]) async throws {
        guard let holder = leases.first?.holder else { return }
        try await database.query("DELETE FROM leases WHERE name = ANY(\(leases.map(\.name))) AND holder = \(holder)")
    }

    /// Runs `body` under the lease on `name`, renewed by the body through `renew`, and released
    /// when the body ends however it ends; nil, without running it, when another holder has it.
    public func withLease<Result: Sendable>(
        _ name: String, for duration: TimeInterval, _ body: (Lease) async throws -> Result
    ) async throws -> Result? {
        guard let lease = try await claim(name, for: duration) else { return nil }
        let result: Result
        do {
            result = try await body(lease)
        } catch {
            // Another holder may take it at once; if this fails, the lease runs out instead.
            try? await release(lease)
            throw error
        }
        try? await release(lease)
        return result
    }
}
