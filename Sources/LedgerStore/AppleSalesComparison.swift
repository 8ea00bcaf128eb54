import Foundation
import LedgerCore
import PostgresNIO

/// Apple's daily sales beside the ledger's (`ledger_apple_sales`, migration 028): per day (the
/// report's, Pacific time), app, product and storefront country, production only, with what each
/// difference likely means and what to do.
public struct AppleSalesComparison: Sendable, Encodable, Equatable {
    public struct Row: Sendable, Encodable, Equatable {
        public var day: String
        public var bundleId: String?
        public var productId: String
        /// The storefront's country, ISO 3166-1 alpha-2 as Apple's reports name it; nil for the
        /// ledger's sales whose storefront it does not know (legacy receipts, imports).
        public var country: String?
        public var applePurchases: Int
        public var ledgerPurchases: Int
        /// Apple's purchases less the ledger's.
        public var purchaseDifference: Int
        public var appleRefunds: Int
        public var ledgerRefunds: Int
        /// Apple's refunds less the ledger's.
        public var refundDifference: Int
        public var cause: String
        public var nextStep: String
        /// What the latest sweep for the row's day, app and product found, where Apple counted
        /// more purchases than the ledger saw; '' when none ran.
        public var sweep: String

        init(day: String, bundleId: String?, productId: String, country: String?, applePurchases: Int, ledgerPurchases: Int,
             appleRefunds: Int, ledgerRefunds: Int, cause: String, nextStep: String, sweep: String) {
            (self.day, self.bundleId, self.productId, self.country) = (day, bundleId, productId, country)
            (self.cause, self.nextStep, self.sweep) = (cause, nextStep, sweep)
            (self.applePurchases, self.ledgerPurchases, self.purchaseDifference) = (applePurchases, ledgerPurchases, applePurchases - ledgerPurchases)
            (self.appleRefunds, self.ledgerRefunds, self.refundDifference) = (appleRefunds, ledgerRefunds, appleRefunds - ledgerRefunds)
        }

        private enum CodingKeys: String, CodingKey {
            case day, bundleId, productId, country, applePurchases, ledgerPurchases, purchaseDifference, appleRefunds, ledgerRefunds
            case refundDifference, cause, nextStep, sweep
        }

        /// Every member, an absent app or country as `null` (the API's schema requires them).
        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(day, forKey: .day)
            try container.encode(bundleId, forKey: .bundleId)
            try container.encode(productId, forKey: .productId)
            try container.encode(country, forKey: .country)
            try container.encode(applePurchases, forKey: .applePurchases)
            try container.encode(ledgerPurchases, forKey: .ledgerPurchases)
            try container.encode(purchaseDifference, forKey: .purchaseDifference)
            try container.encode(appleRefunds, forKey: .appleRefunds)
            try container.encode(ledgerRefunds, forKey: .ledgerRefunds)
            try container.encode(refundDifference, forKey: .refundDifference)
            try container.encode(cause, forKey: .cause)
            try container.encode(nextStep, forKey: .nextStep)
            try container.encode(sweep, forKey: .sweep)
        }
    }

    public var from: String
    public var to: String
    public var rows: [Row]

    /// The days `from` to `to` (`YYYY-MM-DD`, both included); `apps`: those apps' rows alone.
    public static func make(database: Database, from: String, to: String, apps: [BundleID]? = nil) async throws -> AppleSalesComparison {
        let rows = try await database.query(
            """
            SELECT to_char(day, 'YYYY-MM-DD'), bundle_id, product_id, country, apple_purchases, ledger_purchases, apple_refunds, ledger_refunds, cause, next_step, sweep
              FROM ledger_apple_sales(\(from)::date, \(to)::date)
             WHERE \(apps?.map(\.rawValue))::text[] IS NULL OR bundle_id = ANY(\(apps?.map(\.rawValue))::text[])
            """)
        var found: [Row] = []
        for try await (day, bundle, product, country, applePurchases, ledgerPurchases, appleRefunds, ledgerRefunds, cause, next, sweep)
            in rows.decode((String, String?, String, String?, Int, Int, Int, Int, String, String, String).self) {
            found.append(Row(day: day, bundleId: bundle, productId: product, country: country, applePurchases: applePurchases,
                             ledgerPurchases: ledgerPurchases,
                             appleRefunds: appleRefunds, ledgerRefunds: ledgerRefunds, cause: cause, nextStep: next, sweep: sweep))
        }
        return AppleSalesComparison(from: from, to: to, rows: found)
    }

    /// The rows as CSV with a header.
    public var csv: String {
        var text = "day,bundleId,productId,country,applePurchases,ledgerPurchases,purchaseDifference,appleRefunds,ledgerRefunds,refundDifference,cause,nextStep,sweep\n"
        for row in rows {
            let cells = [CSVField.value(row.day), CSVField.text(row.bundleId ?? ""), CSVField.text(row.productId), CSVField.text(row.country ?? ""),
                         String(row.applePurchases), String(row.ledgerPurchases), String(row.purchaseDifference), String(row.appleRefunds),
                         String(row.ledgerRefunds), String(row.refundDifference), CSVField.value(row.cause), CSVField.value(row.nextStep),
                         CSVField.value(row.sweep)]
            text += cells.joined(separator: ",") + "\n"
        }
        return text
    }

    /// The rows as a table for a terminal.
    public var table: String {
        var lines = ["day         app                        product          country  Apple  ledger  diff  Apple refunds  ledger refunds  cause"]
        for row in rows {
            let cells = [row.day.padding(toLength: 11, withPad: " ", startingAt: 0), (row.bundleId ?? "-").padding(toLength: 26, withPad: " ", startingAt: 0),
                         row.productId.padding(toLength: 16, withPad: " ", startingAt: 0),
                         (row.country ?? "?").padding(toLength: 7, withPad: " ", startingAt: 0),
                         String(row.applePurchases).leftPadded(5), String(row.ledgerPurchases).leftPadded(7), String(row.purchaseDifference).leftPadded(5),
                         String(row.appleRefunds).leftPadded(14), String(row.ledgerRefunds).leftPadded(15),
                         row.cause + (row.nextStep.isEmpty ? "" : " → " + row.nextStep) + (row.sweep.isEmpty ? "" : " (" + row.sweep + ")")]
            lines.append(cells.joined(separator: " "))
        }
        return lines.joined(separator: "\n") + "\n"
    }
}

extension String {
    fileprivate func leftPadded(_ width: Int) -> String {
        count >= width ? self : String(repeating: " ", count: width - count) + self
    }
}
