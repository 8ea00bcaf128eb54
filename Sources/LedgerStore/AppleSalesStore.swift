import Foundation
import LedgerCore
import PostgresNIO

/// App Store Connect's daily sales reports as Apple sent them (migration 026): each day's
/// revisions, and each line with every column by name.
public struct AppleSalesStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// What storing a day's answer did.
    public enum Recorded: String, Sendable, Equatable {
        /// The day was not stored before.
        case new
        /// The same file (or no sales again): nothing changed.
        case unchanged
        /// Apple restated the day: a new revision.
        case restated
    }

    /// A line of a report, the columns the comparison reads and all of them (`values`, in the
    /// order of the report's header).
    public struct Row: Sendable {
        public var sku: String
        public var parentIdentifier: String
        public var productType: String
        public var units: Int
        public var countryCode: String
        public var values: [String]

        public init(sku: String, parentIdentifier: String, productType: String, units: Int, countryCode: String, values: [String]) {
            self.sku = sku
            self.parentIdentifier = parentIdentifier
            self.productType = productType
            self.units = units
            self.countryCode = countryCode
            self.values = values
        }
    }

    /// Stores `day`'s answer: the report's text (its SHA-256) and its rows, or nil for "no sales". The
    /// same answer as the latest revision changes nothing; another is a new revision. One writer
    /// per day at a time.
    public func record(vendor: String, day: String, version: String, file: Data?, header: [String] = [], rows: [Row]) async throws -> Recorded {
        guard rows.allSatisfy({ $0.values.count == header.count && !$0.values.contains(where: { $0.contains("\t") }) }) else {
            throw AppleSalesStoreError.columns("a line of the report of \(day) has not one value per header column (\(header.count)), or a value with a tab")
        }
        let sha = file.map(sha256Hex)
        let outcome = file == nil ? "no-sales" : "report"
        return try await database.transaction { tx in
            let connection = tx.connection
            let logger = database.logger
            try await connection.guardedQuery(
                "SELECT pg_advisory_xact_lock(hashtextextended(\("sales-" + vendor + "-" + day + "-" + version), 0))", logger: logger)
            let latest = try await connection.guardedQuery(
                """
                SELECT revision, outcome, sha256 FROM apple_sales_reports
                 WHERE vendor_number = \(vendor) AND report_date = \(day)::date AND version = \(version)
                 ORDER BY revision DESC LIMIT 1
                """, logger: logger)
            var last: (Int, String, String?)?
            for try await row in latest.decode((Int, String, String?).self) { last = row }
            if let last, last.1 == outcome, last.2 == sha { return .unchanged }
            let revision = (last?.0 ?? 0) + 1
            try await connection.guardedQuery(
                """
                INSERT INTO apple_sales_reports (vendor_number, report_date, version, revision, outcome, sha256, row_count)
                VALUES (\(vendor), \(day)::date, \(version), \(revision), \(outcome), \(sha), \(rows.count))
                """, logger: logger)
            if !rows.isEmpty {
                // The columns the comparison reads; then every column by name, made by PostgreSQL
                // from the header and each line's values (sent tab-separated: a value has no tab,
                // the report being split on them).
                try await connection.guardedQuery(
                    """
                    INSERT INTO apple_sales_rows (vendor_number, report_date, version, revision, line, sku, parent_identifier,
                                                  product_type, units, country_code)
                    SELECT \(vendor), \(day)::date, \(version), \(revision), x.line, x.sku, x.parent, x.type, x.units, x.country
                      FROM unnest(\(Array(1...rows.count)), \(rows.map(\.sku)), \(rows.map(\.parentIdentifier)), \(rows.map(\.productType)),
                                  \(rows.map(\.units)), \(rows.map(\.countryCode)))
                           AS x(line, sku, parent, type, units, country)
                    """, logger: logger)
                try await connection.guardedQuery(
                    """
                    INSERT INTO apple_sales_fields (vendor_number, report_date, version, revision, line, fields)
                    SELECT \(vendor), \(day)::date, \(version), \(revision), x.line, jsonb_object(\(header)::text[], string_to_array(x.text, E'\\t'))
                      FROM unnest(\(Array(1...rows.count)), \(rows.map { $0.values.joined(separator: "\t") })) AS x(line, text)
                    """, logger: logger)
            }
            return last == nil ? .new : .restated
        }
    }

    /// The days from `from` to `to` (`YYYY-MM-DD`, both included) with no report stored for
    /// `vendor` and `version`, and those from `noSalesFrom` on whose latest revision is "no
    /// sales" (an answer that may yet be followed by the day's report), oldest first.
    public func missingDays(vendor: String, version: String, from: String, to: String, noSalesFrom: String? = nil) async throws -> [String] {
        let rows = try await database.query(
            """
            SELECT to_char(d, 'YYYY-MM-DD') FROM generate_series(\(from)::date, \(to)::date, interval '1 day') AS d
             WHERE coalesce((SELECT r.outcome = 'no-sales' AND d::date >= coalesce(\(noSalesFrom)::date, 'infinity') FROM apple_sales_reports r
                              WHERE r.vendor_number = \(vendor) AND r.version = \(version) AND r.report_date = d::date
                              ORDER BY r.revision DESC LIMIT 1), true)
             ORDER BY 1
            """)
        var days: [String] = []
        for try await day in rows.decode(String.self) { days.append(day) }
        return days
    }

    /// A day's latest revision: its number, outcome and rows; nil when none is stored.
    public func latest(vendor: String, day: String, version: String) async throws -> (revision: Int, outcome: String, rows: Int)? {
        let rows = try await database.query(
            """
            SELECT revision, outcome, row_count FROM apple_sales_reports
             WHERE vendor_number = \(vendor) AND report_date = \(day)::date AND version = \(version)
             ORDER BY revision DESC LIMIT 1
            """)
        for try await row in rows.decode((Int, String, Int).self) { return row }
        return nil
    }

    /// A day, app and product where Apple counted more purchases than the ledger saw, in all
    /// the day's countries together (`missing`: how many more).
    public struct Shortfall: Sendable, Equatable {
        public var day: String
        public var bundleId: BundleID?
        public var productId: ProductID
        public var missing: Int
    }

    /// The cause of a row whose shortfall purchases waiting in the pool account for (migration
    /// 032): the ledger knows them, so no sweep is run for them.
    public static let pooledCause = "purchases the ledger holds in its pool, paid to no order yet"

    /// The shortfalls of the days `from` to `to` (`YYYY-MM-DD`) in Apple's reports, oldest first:
    /// never one the pool accounts for.
    public func shortfalls(from: String, to: String) async throws -> [Shortfall] {
        let rows = try await database.query(
            """
            SELECT to_char(day, 'YYYY-MM-DD'), bundle_id, product_id, sum(apple_purchases - ledger_purchases)::integer
              FROM ledger_apple_sales(\(from)::date, \(to)::date)
             WHERE cause NOT IN ('no report of Apple''s for the day yet', \(Self.pooledCause))
             GROUP BY 1, 2, 3
            HAVING sum(apple_purchases - ledger_purchases) > 0
             ORDER BY 1, 2, 3
            """)
        var found: [Shortfall] = []
        for try await (day, bundle, product, missing) in rows.decode((String, String?, String, Int).self) {
            found.append(Shortfall(day: day, bundleId: bundle.map(BundleID.init(unchecked:)), productId: ProductID(unchecked: product), missing: missing))
        }
        return found
    }

    /// The users with open orders (`created`, `payment-added`) of `shortfall`'s app and product
    /// created that day or the day before (Pacific time, as Apple's reports count): a purchase of
    /// the day pays an order created before it.
    public func openOrderUsers(_ shortfall: Shortfall) async throws -> [UserID] {
        let rows = try await database.query(
            """
            SELECT DISTINCT user_id FROM orders
             WHERE product_id = \(shortfall.productId.rawValue) AND bundle_id IS NOT DISTINCT FROM \(shortfall.bundleId?.rawValue)
               AND state IN ('created', 'payment-added')
               AND created_at >= ((\(shortfall.day)::date - 1)::timestamp AT TIME ZONE 'America/Los_Angeles')
               AND created_at < ((\(shortfall.day)::date + 1)::timestamp AT TIME ZONE 'America/Los_Angeles')
             ORDER BY 1
            """)
        var users: [UserID] = []
        for try await user in rows.decode(String.self) { users.append(UserID(unchecked: user)) }
        return users
    }

    /// Records what the sweep for `shortfall` did, in place of an earlier one's.
    public func recordSweep(_ shortfall: Shortfall, users: Int, accounts: Int, found: Int, failed: Int) async throws {
        try await database.query(
            """
            INSERT INTO apple_sales_sweeps (day, bundle_id, product_id, swept_at, missing, users, accounts, found, failed)
            VALUES (\(shortfall.day)::date, \(shortfall.bundleId?.rawValue ?? ""), \(shortfall.productId.rawValue), now(), \(shortfall.missing),
                    \(users), \(accounts), \(found), \(failed))
            ON CONFLICT (day, bundle_id, product_id) DO UPDATE
               SET swept_at = now(), missing = EXCLUDED.missing, users = EXCLUDED.users, accounts = EXCLUDED.accounts,
                   found = EXCLUDED.found, failed = EXCLUDED.failed
            """)
    }
}

/// A report the store cannot keep as it is.
public enum AppleSalesStoreError: Error, CustomStringConvertible {
    case columns(String)

    public var description: String {
        switch self {
        case .columns(let message): message
        }
    }
}
