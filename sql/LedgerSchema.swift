// LedgerSchema: the SQL migrations and routines of `sql/`, embedded in the binary.

/// The SQL files of `sql/`, embedded in the binary: the numbered migrations in the order they
/// apply, and the routines' definition files.
///
/// SwiftPM embeds each file as a static property without a way to list them, so a new file is
/// added here too; `MigrationTests` fails when these lists and the folders disagree.
public enum LedgerSchema {
    /// One file: its name (which orders it) and its SQL text.
    public struct Migration: Sendable {
        public let name: String
        public let sql: String
        /// A routine file's every version, oldest first, as the SHA-256 of its text; the last is
        /// the file's now (`MigrationTests` holds it to the file, so an edit adds its checksum
        /// here). Empty for a migration, which never changes.
        public let versions: [String]

        init(name: String, sql: String, versions: [String] = []) {
            self.name = name
            self.sql = sql
            self.versions = versions
        }
    }

    /// `sql/migrations`: each applied once, in name order.
    public static let migrations: [Migration] = [
        Migration(name: "001_baseline.sql", sql: String(decoding: PackageResources._01_baseline_sql, as: UTF8.self)),
        Migration(name: "004_pool_received_at.sql", sql: String(decoding: PackageResources._04_pool_received_at_sql, as: UTF8.self)),
        Migration(name: "005_apple_accounts.sql", sql: String(decoding: PackageResources._05_apple_accounts_sql, as: UTF8.self)),
        Migration(name: "006_sweep_leases.sql", sql: String(decoding: PackageResources._06_sweep_leases_sql, as: UTF8.self)),
        Migration(name: "007_apple_calls.sql", sql: String(decoding: PackageResources._07_apple_calls_sql, as: UTF8.self)),
        Migration(name: "008_leases.sql", sql: String(decoding: PackageResources._08_leases_sql, as: UTF8.self)),
        Migration(name: "009_apple_call_errors.sql", sql: String(decoding: PackageResources._09_apple_call_errors_sql, as: UTF8.self)),
        Migration(name: "010_prorated_refunds.sql", sql: String(decoding: PackageResources._10_prorated_refunds_sql, as: UTF8.self)),
        Migration(name: "011_apps.sql", sql: String(decoding: PackageResources._11_apps_sql, as: UTF8.self)),
        Migration(name: "012_environments.sql", sql: String(decoding: PackageResources._12_environments_sql, as: UTF8.self)),
        Migration(name: "013_app_columns.sql", sql: String(decoding: PackageResources._13_app_columns_sql, as: UTF8.self)),
        Migration(name: "014_apple_per_app.sql", sql: String(decoding: PackageResources._14_apple_per_app_sql, as: UTF8.self)),
        Migration(name: "015_key_apps.sql", sql: String(decoding: PackageResources._15_key_apps_sql, as: UTF8.self)),
        Migration(name: "016_subscriptions.sql", sql: String(decoding: PackageResources._16_subscriptions_sql, as: UTF8.self)),
        Migration(name: "019_billing_retry_limit.sql", sql: String(decoding: PackageResources._19_billing_retry_limit_sql, as: UTF8.self)),
        Migration(name: "021_billed_periods.sql", sql: String(decoding: PackageResources._21_billed_periods_sql, as: UTF8.self)),
        Migration(name: "022_pool_skips_untyped_renewals.sql", sql: String(decoding: PackageResources._22_pool_skips_untyped_renewals_sql, as: UTF8.self)),
        Migration(name: "023_account_conflicts.sql", sql: String(decoding: PackageResources._23_account_conflicts_sql, as: UTF8.self)),
        Migration(name: "024_account_tokens.sql", sql: String(decoding: PackageResources._24_account_tokens_sql, as: UTF8.self)),
        Migration(name: "025_imported_history.sql", sql: String(decoding: PackageResources._25_imported_history_sql, as: UTF8.self)),
        Migration(name: "026_apple_sales_reports.sql", sql: String(decoding: PackageResources._26_apple_sales_reports_sql, as: UTF8.self)),
        Migration(name: "027_apple_sales_comparison.sql", sql: String(decoding: PackageResources._27_apple_sales_comparison_sql, as: UTF8.self)),
        Migration(name: "028_storefronts.sql", sql: String(decoding: PackageResources._28_storefronts_sql, as: UTF8.self)),
        Migration(
            name: "029_reversed_refunds_keep_holds.sql",
            sql: String(decoding: PackageResources._29_reversed_refunds_keep_holds_sql, as: UTF8.self)),
        Migration(name: "030_tokens_per_app.sql", sql: String(decoding: PackageResources._30_tokens_per_app_sql, as: UTF8.self)),
        Migration(
            name: "031_renewal_refunds_beside_apple.sql",
            sql: String(decoding: PackageResources._31_renewal_refunds_beside_apple_sql, as: UTF8.self)),
        Migration(
            name: "032_pool_and_held_renewals_beside_apple.sql",
            sql: String(decoding: PackageResources._32_pool_and_held_renewals_beside_apple_sql, as: UTF8.self)),
        Migration(
            name: "033_pool_refunds_beside_apple.sql",
            sql: String(decoding: PackageResources._33_pool_refunds_beside_apple_sql, as: UTF8.self)),
        Migration(name: "034_latest_period_index.sql", sql: String(decoding: PackageResources._34_latest_period_index_sql, as: UTF8.self)),
        Migration(name: "035_pool_refund_dates.sql", sql: String(decoding: PackageResources._35_pool_refund_dates_sql, as: UTF8.self)),
        Migration(name: "036_renewal_signed_at.sql", sql: String(decoding: PackageResources._36_renewal_signed_at_sql, as: UTF8.self)),
        Migration(name: "037_first_app_as_owner.sql", sql: String(decoding: PackageResources._37_first_app_as_owner_sql, as: UTF8.self)),
        Migration(name: "038_pool_shows_conflicts.sql", sql: String(decoding: PackageResources._38_pool_shows_conflicts_sql, as: UTF8.self)),
        Migration(name: "039_free_starts_bill_nothing.sql", sql: String(decoding: PackageResources._39_free_starts_bill_nothing_sql, as: UTF8.self)),
        Migration(name: "040_held_renewal_refunds.sql", sql: String(decoding: PackageResources._40_held_renewal_refunds_sql, as: UTF8.self)),
        Migration(name: "041_restores.sql", sql: String(decoding: PackageResources._41_restores_sql, as: UTF8.self)),
        Migration(name: "042_pool_skips_restores.sql", sql: String(decoding: PackageResources._42_pool_skips_restores_sql, as: UTF8.self)),
        Migration(name: "043_daily_refund_rule.sql", sql: String(decoding: PackageResources._43_daily_refund_rule_sql, as: UTF8.self)),
        Migration(name: "044_daily_renewal_refund_rule.sql", sql: String(decoding: PackageResources._44_daily_renewal_refund_rule_sql, as: UTF8.self)),
        Migration(name: "045_time_in_state.sql", sql: String(decoding: PackageResources._45_time_in_state_sql, as: UTF8.self)),
        Migration(name: "046_user_token_secret.sql", sql: String(decoding: PackageResources._46_user_token_secret_sql, as: UTF8.self)),
        Migration(name: "047_pool_refunds_each.sql", sql: String(decoding: PackageResources._47_pool_refunds_each_sql, as: UTF8.self)),
        Migration(name: "048_latest_order_refund.sql", sql: String(decoding: PackageResources._48_latest_order_refund_sql, as: UTF8.self)),
        Migration(name: "049_sales_without_restores.sql", sql: String(decoding: PackageResources._49_sales_without_restores_sql, as: UTF8.self)),
    ]

    /// `sql/routines`: applied after the migrations, and again when a database has an earlier
    /// version of their text. A database with a version not listed was given it by a newer
    /// ledger, and this one refuses to put its older text back.
    public static let routines: [Migration] = [
        Migration(
            name: "append_events.sql", sql: String(decoding: PackageResources.append_events_sql, as: UTF8.self),
            versions: [
                "32a6d7ebb207ec785d60d5f93dd6dd7f69dd3d3323cf587590b268389f687dd4",
                "6ca96bfc4fe05c3aba65f5a58eb6e2ad27cac7365a5a33022faffd76ed1c7a02",
                "4f67f9e7c20c4d3874670249315f8a5ac75cfdedd36fe557a2793dd2fd1505d9",
                "31d8608e775d153f9d0a2729b84e6099fceee096961e8f686d13bff582d07011",
                "b551b3333c666594bdd6c04db376a63ec050318daa8a059e00e7687fcff110d5",
                "3ff0772bc3cde78692c1c50d43eeb789326d9753254ae66b76c47510d3743869",
                "adce9662c1847f47c4e9c23f6287c39dd3e437fd290b3c9b7defbafbc88958d6",
                "a0ff16f616fbc9c197cfd3e92678c406e06a7885afab19e67abeb941b4f80e44",
                "6e682be5c765131fb2fc4f3bea52ce3881ba1cfd4548c5fd4be8cc812438ae48",
                "c00f3358e73a3fd743f05b94818fd3dc6f7af67949495fdd1bf466753f5d263b",
                "0571bf768c08d2aa33ae6fcc39c1f725828c9eb95fb84f74c9c7b0168a857fd8",
            ]),
        Migration(
            name: "read_for_write.sql", sql: String(decoding: PackageResources.read_for_write_sql, as: UTF8.self),
            versions: ["749544a6ace030bf754785b0c0d63ba9a9989eda015b2e718d4889d0f99dafcf"]),
    ]

    /// Migrations squashed into one after databases had applied them.
    public struct Squash: Sendable {
        /// The file they were squashed into, one of them.
        public let baseline: String
        /// Each file squashed, the baseline among them, with the SHA-256 it was applied with.
        public let former: [String: String]
        /// What the former files made that nothing defines now, dropped when the records are rewritten.
        public let cleanup: String
    }

    /// A database that recorded exactly these files with these checksums has its records rewritten
    /// to the squashed ones (the routines the files defined are definition files now, applied as
    /// such), instead of being refused for a changed baseline.
    public static let squashes: [Squash] = [
        // 002 and 003 held only routines (sql/routines); 002 had renamed 001's append routine
        // append_events_checked and called it for the uncommon case, which append_events now
        // checks itself.
        Squash(
            baseline: "001_baseline.sql",
            former: [
                "001_baseline.sql": "8820cf68b8d661b4e011b6352a499afa4691a9796fb4150c31d55069bb5f3d3e",
                "002_append_common_case.sql": "9be2cf7c4806077e25e8027c96f45e881dc71c8b476d5a7eb29e1dae5bdab236",
                "003_read_for_write.sql": "dc1455c809cc58c6771accd5cec9e3d287ece823831211804176785ad9b0a4f4",
            ],
            cleanup: """
                DROP PROCEDURE IF EXISTS append_events_checked(integer[], text[], bigint[], uuid[], text[], jsonb[], jsonb[], text[],
                    integer[], boolean[], text[], text[], text[], integer[], text[], text[], uuid[], text[], bigint[], text[], bigint[],
                    bigint[], bigint[], text[], text[], integer[], boolean[], text[], text[], text[], text[], bigint[], text[], text[],
                    bigint[], bigint[], text[], text[], uuid[], text[], text[], bigint, boolean, text[], text[], bigint[], bigint[])
                """
        )
    ]

    /// The migrations of the schema before it was squashed into `001_baseline.sql`. Nothing made
    /// by them was ever released: a database that has one is refused with how to start afresh.
    public static let unreleased: Set<String> = [
        "001_event_log.sql", "002_projections.sql", "003_api_keys.sql", "004_dashboards.sql", "005_receipts.sql",
        "006_receipt_functions.sql", "007_reconciler.sql", "008_products.sql", "009_order_append_function.sql",
        "010_order_group_commit.sql", "011_cheaper_batches.sql", "012_order_group_typed.sql", "013_order_rows_in_place.sql",
    ]
}
