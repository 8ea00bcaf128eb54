/// The numbered migrations of `sql/migrations`, embedded in the binary in the order they apply.
///
/// SwiftPM embeds each file as a static property without a way to list them, so a new migration
/// is added here too; `MigrationFilesTests` fails when this list and the folder disagree.
public enum LedgerSchema {
    /// One migration file: its name (which orders it) and its SQL text.
    public struct Migration: Sendable {
        public let name: String
        public let sql: String
    }

    public static let migrations: [Migration] = [
        Migration(name: "001_baseline.sql", sql: String(decoding: PackageResources._01_baseline_sql, as: UTF8.self)),
        Migration(name: "002_append_common_case.sql", sql: String(decoding: PackageResources._02_append_common_case_sql, as: UTF8.self)),
        Migration(name: "003_read_for_write.sql", sql: String(decoding: PackageResources._03_read_for_write_sql, as: UTF8.self)),
        Migration(name: "004_pool_received_at.sql", sql: String(decoding: PackageResources._04_pool_received_at_sql, as: UTF8.self)),
        Migration(name: "005_apple_accounts.sql", sql: String(decoding: PackageResources._05_apple_accounts_sql, as: UTF8.self)),
        Migration(name: "006_sweep_leases.sql", sql: String(decoding: PackageResources._06_sweep_leases_sql, as: UTF8.self)),
        Migration(name: "007_apple_calls.sql", sql: String(decoding: PackageResources._07_apple_calls_sql, as: UTF8.self)),
        Migration(name: "008_leases.sql", sql: String(decoding: PackageResources._08_leases_sql, as: UTF8.self)),
    ]

    /// The migrations of the schema before it was squashed into `001_baseline.sql`. Nothing made
    /// by them was ever released: a database that has one is refused with how to start afresh.
    public static let unreleased: Set<String> = [
        "001_event_log.sql", "002_projections.sql", "003_api_keys.sql", "004_dashboards.sql", "005_receipts.sql",
        "006_receipt_functions.sql", "007_reconciler.sql", "008_products.sql", "009_order_append_function.sql",
        "010_order_group_commit.sql", "011_cheaper_batches.sql", "012_order_group_typed.sql", "013_order_rows_in_place.sql",
    ]
}
