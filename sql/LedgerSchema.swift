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
        Migration(name: "001_event_log.sql", sql: String(decoding: PackageResources._01_event_log_sql, as: UTF8.self)),
        Migration(name: "002_projections.sql", sql: String(decoding: PackageResources._02_projections_sql, as: UTF8.self)),
        Migration(name: "003_api_keys.sql", sql: String(decoding: PackageResources._03_api_keys_sql, as: UTF8.self)),
        Migration(name: "004_dashboards.sql", sql: String(decoding: PackageResources._04_dashboards_sql, as: UTF8.self)),
        Migration(name: "005_receipts.sql", sql: String(decoding: PackageResources._05_receipts_sql, as: UTF8.self)),
        Migration(name: "006_receipt_functions.sql", sql: String(decoding: PackageResources._06_receipt_functions_sql, as: UTF8.self)),
        Migration(name: "007_reconciler.sql", sql: String(decoding: PackageResources._07_reconciler_sql, as: UTF8.self)),
        Migration(name: "008_products.sql", sql: String(decoding: PackageResources._08_products_sql, as: UTF8.self)),
        Migration(name: "009_order_append_function.sql", sql: String(decoding: PackageResources._09_order_append_function_sql, as: UTF8.self)),
        Migration(name: "010_order_group_commit.sql", sql: String(decoding: PackageResources._10_order_group_commit_sql, as: UTF8.self)),
        Migration(name: "011_cheaper_batches.sql", sql: String(decoding: PackageResources._11_cheaper_batches_sql, as: UTF8.self)),
        Migration(name: "012_order_group_typed.sql", sql: String(decoding: PackageResources._12_order_group_typed_sql, as: UTF8.self)),
        Migration(name: "013_order_rows_in_place.sql", sql: String(decoding: PackageResources._13_order_rows_in_place_sql, as: UTF8.self)),
    ]
}
