import Crypto
import Foundation
import LedgerSchema
import Logging
import PostgresNIO

/// Applies the numbered SQL migrations, each once, in order, each in its own transaction.
///
/// Safe when several instances start at once: a session advisory lock lets one migrator work at
/// a time, and the others then find nothing left to apply.
public struct Migrator: Sendable {
    /// One migration: its file name and SQL.
    public struct Migration: Sendable, Equatable {
        public let name: String
        public let sql: String
        public var checksum: String { Migrator.sha256(sql) }

        public init(name: String, sql: String) {
            self.name = name
            self.sql = sql
        }
    }

    /// The advisory lock key migrators take ("LEDGERMG" as bytes).
    public static let lockKey: Int64 = 0x4C45_4447_4552_4D47

    public static let bundled: [Migration] = LedgerSchema.migrations.map { Migration(name: $0.name, sql: $0.sql) }

    public let migrations: [Migration]
    public let logger: Logger

    public init(migrations: [Migration] = Migrator.bundled, logger: Logger) {
        self.migrations = migrations.sorted { $0.name < $1.name }
        self.logger = logger
    }

    /// Applies what is pending and returns the names it applied.
    @discardableResult
    public func migrate(_ client: PostgresClient) async throws -> [String] {
        try await client.withConnection { connection in
            try await connection.guardedQuery("SELECT pg_advisory_lock(\(Self.lockKey))", logger: logger)
            do {
                let applied = try await applyPending(on: connection)
                try await connection.guardedQuery("SELECT pg_advisory_unlock(\(Self.lockKey))", logger: logger)
                return applied
            } catch {
                _ = try? await connection.guardedQuery("SELECT pg_advisory_unlock(\(Self.lockKey))", logger: logger)
                throw error
            }
        }
    }

    /// Checks, without changing anything, that every migration is applied unchanged.
    public func status(_ client: PostgresClient) async throws -> MigrationStatus {
        let applied = try await client.withConnection { try await appliedMigrations(on: $0) }
        if let problem = try? check(applied: applied) { return problem }
        let pending = migrations.filter { applied[$0.name] == nil }.map(\.name)
        return pending.isEmpty ? .current : .pending(pending)
    }

    private func applyPending(on connection: PostgresConnection) async throws -> [String] {
        try await connection.guardedQuery(
            """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                name text PRIMARY KEY, sha256 text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())
            """, logger: logger)
        // A session-local helper so that a whole file runs as one bound parameter.
        try await connection.guardedQuery(
            """
            CREATE OR REPLACE FUNCTION pg_temp.ledger_execute(sql text) RETURNS void
            LANGUAGE plpgsql AS $fn$ BEGIN EXECUTE sql; END $fn$
            """, logger: logger)
        let applied = try await appliedMigrations(on: connection)
        if let problem = try check(applied: applied) { throw MigrationError(status: problem) }

        var names: [String] = []
        for migration in migrations where applied[migration.name] == nil {
            try await connection.guardedQuery("BEGIN", logger: logger)
            do {
                try await connection.guardedQuery("SELECT pg_temp.ledger_execute(\(migration.sql))", logger: logger)
                try await connection.guardedQuery(
                    "INSERT INTO schema_migrations (name, sha256) VALUES (\(migration.name), \(migration.checksum))",
                    logger: logger)
                try await connection.guardedQuery("COMMIT", logger: logger)
            } catch {
                _ = try? await connection.guardedQuery("ROLLBACK", logger: logger)
                throw MigrationError(status: .failed(migration.name, String(reflecting: error)))
            }
            logger.info("applied migration", metadata: ["migration.name": "\(migration.name)"])
            names.append(migration.name)
        }
        return names
    }

    private func appliedMigrations(on connection: PostgresConnection) async throws -> [String: String] {
        let exists = try await connection.guardedQuery("SELECT to_regclass('schema_migrations') IS NOT NULL", logger: logger)
        for try await present in exists.decode(Bool.self) where !present { return [:] }
        var applied: [String: String] = [:]
        let rows = try await connection.guardedQuery("SELECT name, sha256 FROM schema_migrations", logger: logger)
        for try await (name, checksum) in rows.decode((String, String).self) { applied[name] = checksum }
        return applied
    }

    /// A problem with what is applied, or nil when it agrees with the files.
    private func check(applied: [String: String]) throws -> MigrationStatus? {
        let known = Dictionary(uniqueKeysWithValues: migrations.map { ($0.name, $0) })
        if let unreleased = applied.keys.sorted().first(where: { LedgerSchema.unreleased.contains($0) && known[$0] == nil }) {
            return .unreleasedSchema(unreleased)
        }
        for (name, checksum) in applied.sorted(by: { $0.key < $1.key }) {
            guard let migration = known[name] else { return .unknownApplied(name) }
            if migration.checksum != checksum { return .changed(name, applied: checksum, file: migration.checksum) }
        }
        return nil
    }

    static func sha256(_ text: String) -> String {
        SHA256.hash(data: Data(text.utf8)).map { String(format: "%02x", $0) }.joined()
    }
}

/// Where the database stands relative to the migration files.
public enum MigrationStatus: Sendable, Equatable {
    case current
    case pending([String])
    case changed(String, applied: String, file: String)
    case unknownApplied(String)
    /// Made by the schema of before `001_baseline.sql` (named by one of its migrations), which was never released.
    case unreleasedSchema(String)
    case failed(String, String)
}

/// A migration run that could not proceed, with a message naming the file.
public struct MigrationError: Error, Sendable, Equatable, CustomStringConvertible {
    public let status: MigrationStatus

    public init(status: MigrationStatus) {
        self.status = status
    }

    public var description: String {
        switch status {
        case .current: "migrations are current"
        case .pending(let names): "migrations not applied: \(names.joined(separator: ", "))"
        case .changed(let name, let applied, let file):
            "migration \(name) was changed after it was applied (applied sha256 \(applied), file sha256 \(file)); restore the file and add a new migration instead"
        case .unknownApplied(let name):
            "the database has migration \(name), which this ledger does not know: is an older ledger running against a newer database?"
        case .unreleasedSchema(let name):
            "this database was made by an unreleased schema of the ledger (it has migration \(name)); start afresh: drop the database, or stop the ledger and remove its private cluster's folder (LEDGER_DATA_DIR, default ./.ledger), then start again"
        case .failed(let name, let reason): "migration \(name) failed: \(reason)"
        }
    }
}
