import AppleReceipts
import Foundation
import LedgerStore
import Logging

/// Fetches App Store Connect's daily sales reports into the ledger (docs/finance.md): each day of
/// a range that has none stored (or every day of it, `again`), stored as Apple sent it. A day
/// without sales is stored as such; a day Apple has not published yet is left for a later run, as
/// are the days after Apple turned away (rate-limited or down past the client's tries).
public struct SalesReportFetch: Sendable {
    let api: AppStoreConnectAPI
    let store: AppleSalesStore
    let logger: Logger

    public init(api: AppStoreConnectAPI, store: AppleSalesStore, logger: Logger) {
        self.api = api
        self.store = store
        self.logger = logger
    }

    /// What a run did, by day.
    public struct Summary: Sendable, Codable, Equatable {
        public var new: [String] = []
        public var restated: [String] = []
        public var unchanged: [String] = []
        public var noSales: [String] = []
        public var notYetPublished: [String] = []
        /// Days Apple refused or did not answer, with why; the run stopped at the first that
        /// Apple was away for or refused the key for.
        public var failed: [String: String] = [:]
        public init() {}
    }

    /// Apple keeps daily reports for 365 days.
    public static let daysKept = 365

    /// The last day Apple may have published: yesterday in Pacific time.
    public static func lastPublishedDay(now: Date = Date()) -> String { pacificDay(-1, from: now) }

    /// The first day Apple still keeps.
    public static func firstKeptDay(now: Date = Date()) -> String { pacificDay(-daysKept, from: now) }

    /// The day (`YYYY-MM-DD`) `offset` days from `now`'s in Pacific time, the time Apple's reports count in.
    static func pacificDay(_ offset: Int, from now: Date) -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "America/Los_Angeles") ?? .gmt
        let parts = calendar.dateComponents([.year, .month, .day], from: calendar.date(byAdding: .day, value: offset, to: now) ?? now)
        return String(format: "%04d-%02d-%02d", parts.year ?? 1970, parts.month ?? 1, parts.day ?? 1)
    }

    /// Every day from `from` to `to` (`YYYY-MM-DD`, both included).
    static func days(from: String, to: String) -> [String] {
        let style = Date.ISO8601FormatStyle()
        guard var day = try? Date(from + "T00:00:00Z", strategy: style), let end = try? Date(to + "T00:00:00Z", strategy: style) else { return [] }
        var days: [String] = []
        while day <= end {
            days.append(String(day.formatted(style).prefix(10)))
            day.addTimeInterval(86_400)
        }
        return days
    }

    /// Fetches the days from `from` to `to` (`YYYY-MM-DD`; defaults: the first day Apple keeps,
    /// the last it may have published) that have no report stored, or all of them with `again`.
    public func run(from: String? = nil, to: String? = nil, again: Bool = false) async throws -> Summary {
        let settings = api.settings
        let (first, last) = (from ?? Self.firstKeptDay(), to ?? Self.lastPublishedDay())
        let days = again
            ? Self.days(from: first, to: last)
            : try await store.missingDays(vendor: settings.vendorNumber, version: settings.version, from: first, to: last)
        var summary = Summary()
        for day in days {
            let answer: AppStoreConnectAPI.DailyReport
            do {
                answer = try await api.dailySalesReport(day)
            } catch {
                summary.failed[day] = error.message
                logger.warning("sales report not fetched", metadata: ["sales.day": "\(day)", "error": "\(error.message)"])
                // Apple away, or a key it refuses: the other days would fare no better.
                if error.isAppleAway || ["app-store-connect-unauthorized", "app-store-connect-forbidden"].contains(error.code) { break }
                continue
            }
            switch answer {
            case .notYetPublished:
                summary.notYetPublished.append(day)
            case .noSales:
                let recorded = try await store.record(vendor: settings.vendorNumber, day: day, version: settings.version, file: nil, rows: [])
                if recorded == .unchanged { summary.unchanged.append(day) } else { summary.noSales.append(day) }
            case .report(let file):
                let report: AppleSalesReport
                do { report = try AppleSalesReport(file: file) } catch {
                    summary.failed[day] = error.message
                    continue
                }
                let rows = report.rows.map {
                    AppleSalesStore.Row(sku: $0.sku, parentIdentifier: $0.parentIdentifier, productType: $0.productType, units: $0.units,
                                        countryCode: $0.countryCode, fields: $0.fields)
                }
                switch try await store.record(vendor: settings.vendorNumber, day: day, version: settings.version, file: report.text, rows: rows) {
                case .new: summary.new.append(day)
                case .restated: summary.restated.append(day)
                case .unchanged: summary.unchanged.append(day)
                }
            }
        }
        return summary
    }
}
