import Crypto
import Foundation
import LedgerSchema
import Logging
import PostgresNIO

/// Applies the numbered SQL migrations, each once, in order, each in its own transaction, then
/// the routines' definition files, again whenever their text changed.
///
/// Safe when several instances start at once: a session advisory lock lets one migrator work at
/// a time, and the others then find nothing left to apply.
public struct Migrator: Sendable {
    /// One migration or routine file: the name it is recorded under and its SQL.
    public struct Migration: Sendable, Equatable {
        public let name: String
        public let sql: String
        /// A routine's earlier versions (SHA-256 of their text): a database recording one is
        /// upgraded; one recording a checksum that is neither these nor `checksum` has a newer
        /// version, made by a newer ledger, and is refused.
        public let formerChecksums: [String]
        public var checksum: String { Migrator.sha256(sql) }

        public init(name: String, sql: String, formerChecksums: [String] = []) {
            self.name = name
            self.sql = sql
            self.formerChecksums = formerChecksums
        }
    }

    /// The advisory lock key migrators take ("LEDGERMG" as bytes).
    public static let lockKey: Int64 = 0x4C45_4447_4552_4D47

    public static let bundled: [Migration] = LedgerSchema.migrations.map { Migration(name: $0.name, sql: $0.sql) }
    /// The routines of `sql/routines`, recorded as `routines/<file>`.
    public static let bundledRoutines: [Migration] = LedgerSchema.routines.map {
        Migration(name: "routines/\($0.name)", sql: $0.sql, formerChecksums: Array($0.versions.dropLast()))
    }

    public let migrations: [Migration]
    /// Applied after the migrations, each in its own transaction, and again when the database
    /// records one of its former versions: a routine file replaces what it defines (CREATE OR
    /// REPLACE).
    public let routines: [Migration]
    public let logger: Logger

    /// The migrations and routines embedded in the binary.
    public init(logger: Logger) {
        self.init(migrations: Self.bundled, routines: Self.bundledRoutines, logger: logger)
    }

    public init(migrations: [Migration], routines: [Migration] = [], logger: Logger) {
        self.migrations = migrations.sorted { $0.name < $1.name }
        self.routines = routines.sorted { $0.name < $1.name }
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

    /// Checks, without changing anything, that every migration is applied unchanged and every
    /// routine as its file is; what is not yet is pending.
    public func status(_ client: PostgresClient) async throws -> MigrationStatus {
        try status(recorded: try await client.withConnection { try await appliedMigrations(on: $0) })
    }

    /// `status(_:)` on a lease of `database` (which leases past an open circuit breaker).
    public func status(_ database: Database) async throws -> MigrationStatus {
        try status(recorded: try await database.withConnection { try await appliedMigrations(on: $0) })
    }

    private func status(recorded: [String: String]) throws -> MigrationStatus {
        let squash = squash(of: recorded)
        let applied = squash.map { rebaselined(recorded, by: $0) } ?? recorded
        if let problem = try? check(applied: applied) { return problem }
        // A squash whose records are still to be rewritten is pending as its baseline.
        let pending = migrations.filter { applied[$0.name] == nil || $0.name == squash?.baseline }.map(\.name)
            + routines.filter { applied[$0.name] != $0.checksum }.map(\.name)
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
        let recorded = try await appliedMigrations(on: connection)
        let squash = squash(of: recorded)
        let applied = squash.map { rebaselined(recorded, by: $0) } ?? recorded
        if let problem = try check(applied: applied) { throw MigrationError(status: problem) }

        var names: [String] = []
        for migration in migrations where applied[migration.name] == nil {
            try await apply(
                migration,
                recording: "INSERT INTO schema_migrations (name, sha256) VALUES (\(migration.name), \(migration.checksum))",
                on: connection)
            logger.info("applied migration", metadata: ["migration.name": "\(migration.name)"])
            names.append(migration.name)
        }
        for routine in routines where applied[routine.name] != routine.checksum {
            try await apply(
                routine,
                recording: """
                    INSERT INTO schema_migrations (name, sha256) VALUES (\(routine.name), \(routine.checksum))
                    ON CONFLICT (name) DO UPDATE SET sha256 = excluded.sha256, applied_at = now()
                    """,
                on: connection)
            logger.info(
                "applied routine",
                metadata: ["migration.name": "\(routine.name)", "migration.reapplied": "\(applied[routine.name] != nil)"])
            names.append(routine.name)
        }
        // Last, once the routines that replace what the squashed files made are in place: so the
        // cleanup never drops what a routine still in use calls.
        if let squash { try await rewriteRecords(of: squash, on: connection) }
        return names
    }

    /// Runs `file` and records it in one transaction.
    private func apply(_ file: Migration, recording record: PostgresQuery, on connection: PostgresConnection) async throws {
        try await connection.guardedQuery("BEGIN", logger: logger)
        do {
            try await connection.guardedQuery("SELECT pg_temp.ledger_execute(\(file.sql))", logger: logger)
            try await connection.guardedQuery(record, logger: logger)
            try await connection.guardedQuery("COMMIT", logger: logger)
        } catch {
            _ = try? await connection.guardedQuery("ROLLBACK", logger: logger)
            throw MigrationError(status: .failed(file.name, String(reflecting: error)))
        }
    }

    private func appliedMigrations(on connection: PostgresConnection) async throws -> [String: String] {
        let exists = try await connection.guardedQuery("SELECT to_regclass('schema_migrations') IS NOT NULL", logger: logger)
        for try await present in exists.decode(Bool.self) where !present { return [:] }
        var applied: [String: String] = [:]
        let rows = try await connection.guardedQuery("SELECT name, sha256 FROM schema_migrations", logger: logger)
        for try await (name, checksum) in rows.decode((String, String).self) { applied[name] = checksum }
        return applied
    }

    /// A problem with what is applied, or nil when it agrees with the files. A routine recorded
    /// in one of its former versions is not one: it is applied again.
    private func check(applied: [String: String]) throws -> MigrationStatus? {
        let known = Dictionary(uniqueKeysWithValues: migrations.map { ($0.name, $0) })
        let routinesKnown = Dictionary(uniqueKeysWithValues: routines.map { ($0.name, $0) })
        if let unreleased = applied.keys.sorted().first(where: { LedgerSchema.unreleased.contains($0) && known[$0] == nil }) {
            return .unreleasedSchema(unreleased)
        }
        for (name, checksum) in applied.sorted(by: { $0.key < $1.key }) {
            if let routine = routinesKnown[name] {
                if checksum != routine.checksum, !routine.formerChecksums.contains(checksum) {
                    return .newerRoutine(name, applied: checksum)
                }
                continue
            }
            guard let migration = known[name] else { return .unknownApplied(name) }
            if migration.checksum != checksum { return .changed(name, applied: checksum, file: migration.checksum) }
        }
        return nil
    }

    /// The squash whose former files `recorded` holds, each with its former checksum.
    private func squash(of recorded: [String: String]) -> LedgerSchema.Squash? {
        let names = Set(migrations.map(\.name))
        return LedgerSchema.squashes.first { (squash: LedgerSchema.Squash) -> Bool in
            names.contains(squash.baseline) && squash.former.allSatisfy { (name, checksum) in recorded[name] == checksum }
        }
    }

    /// `recorded` as it reads once the squash's records are rewritten.
    private func rebaselined(_ recorded: [String: String], by squash: LedgerSchema.Squash) -> [String: String] {
        var applied = recorded.filter { squash.former[$0.key] == nil }
        applied[squash.baseline] = migrations.first { $0.name == squash.baseline }?.checksum
        return applied
    }

    /// Records the squashed baseline in place of the files it replaced, and drops what only they
    /// made, in one transaction.
    private func rewriteRecords(of squash: LedgerSchema.Squash, on connection: PostgresConnection) async throws {
        let replaced = squash.former.keys.filter { $0 != squash.baseline }.sorted()
        let checksum = migrations.first { $0.name == squash.baseline }?.checksum ?? ""
        try await connection.guardedQuery("BEGIN", logger: logger)
        do {
            try await connection.guardedQuery("DELETE FROM schema_migrations WHERE name = ANY (\(replaced))", logger: logger)
            try await connection.guardedQuery(
                "UPDATE schema_migrations SET sha256 = \(checksum) WHERE name = \(squash.baseline)", logger: logger)
            try await connection.guardedQuery("SELECT pg_temp.ledger_execute(\(squash.cleanup))", logger: logger)
            try await connection.guardedQuery("COMMIT", logger: logger)
        } catch {
            _ = try? await connection.guardedQuery("ROLLBACK", logger: logger)
            throw MigrationError(status: .failed(squash.baseline, String(reflecting: error)))
        }
        logger.info(
            "rewrote the records of squashed migrations",
            metadata: ["migration.name": "\(squash.baseline)", "migration.replaced": "\(replaced.joined(separator: ", "))"])
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
    /// A routine recorded in a version this build does not know: a newer ledger's.
    case newerRoutine(String, applied: String)
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
        case .newerRoutine(let name, let applied):
            "the database has \(name) in a version this ledger does not know (sha256 \(applied)): is an older ledger running against a newer database?"
        case .unreleasedSchema(let name):
            "this database was made by an unreleased schema of the ledger (it has migration \(name)); start afresh: drop the database, or stop the ledger and remove its private cluster's folder (LEDGER_DATA_DIR, default ./.ledger), then start again"
        case .failed(let name, let reason): "migration \(name) failed: \(reason)"
        }
    }
}
