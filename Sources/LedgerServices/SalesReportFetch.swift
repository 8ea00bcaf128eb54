import AppleReceipts
import Foundation
import LedgerStore
import Logging

/// Fetches App Store Connect's daily sales reports into the ledger (docs/finance.md): each day of
/// a range that has none stored (or every day of it, `again`), stored as Apple sent it. A day
/// without sales is stored as such, and asked again by the runs of the week after it; a day
/// Apple has not published yet is left for a later run, as are the days after Apple turned away
/// (rate-limited or down past the client's tries).
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
    public static func pacificDay(_ offset: Int, from now: Date = Date()) -> String {
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

    /// Days asked and stored at once: Apple's answer, its reading and its storing overlap.
    public var daysAtOnce = 2

    /// For how many days (Pacific) after it a day Apple answered "no sales" for is asked again
    /// by every run: Apple has answered so for days whose report it published later.
    public static let noSalesAskedAgain = 7

    /// What became of one day.
    enum Outcome: Sendable {
        case notYetPublished
        case noSales(AppleSalesStore.Recorded)
        case report(AppleSalesStore.Recorded)
        /// Why; `stops`: Apple is away or refused the key, and the other days would fare no better.
        case failed(String, stops: Bool)
    }

    /// Fetches the days from `from` to `to` (`YYYY-MM-DD`; defaults: the first day Apple keeps,
    /// the last it may have published) that have no report stored, or all of them with `again`,
    /// `daysAtOnce` at a time; every list of the summary is in day order.
    public func run(from: String? = nil, to: String? = nil, again: Bool = false) async throws -> Summary {
        let settings = api.settings
        let (first, last) = (from ?? Self.firstKeptDay(), to ?? Self.lastPublishedDay())
        let days = again
            ? Self.days(from: first, to: last)
            : try await store.missingDays(
                vendor: settings.vendorNumber, version: settings.version, from: first, to: last,
                noSalesFrom: Self.pacificDay(-Self.noSalesAskedAgain))
        var summary = Summary()
        try await withThrowingTaskGroup(of: (String, Outcome).self) { group in
            var next = days.makeIterator()
            var stopped = false
            func start() -> Bool {
                guard !stopped, let day = next.next() else { return false }
                group.addTask { (day, try await fetch(day)) }
                return true
            }
            for _ in 0..<max(1, daysAtOnce) { guard start() else { break } }
            while let (day, outcome) = try await group.next() {
                switch outcome {
                case .notYetPublished: summary.notYetPublished.append(day)
                case .noSales(.new): summary.noSales.append(day)
                case .noSales(.restated): summary.restated.append(day)
                case .noSales(.unchanged): summary.unchanged.append(day)
                case .report(.new): summary.new.append(day)
                case .report(.restated): summary.restated.append(day)
                case .report(.unchanged): summary.unchanged.append(day)
                case .failed(let why, let stops):
                    summary.failed[day] = why
                    logger.warning("sales report not fetched", metadata: ["sales.day": "\(day)", "error": "\(why)"])
                    if stops { stopped = true }
                }
                _ = start()
            }
        }
        for path in [\Summary.new, \.restated, \.unchanged, \.noSales, \.notYetPublished] { summary[keyPath: path].sort() }
        return summary
    }

    /// Asks Apple for `day`'s report and stores what it answers.
    func fetch(_ day: String) async throws -> Outcome {
        let settings = api.settings
        let answer: AppStoreConnectAPI.DailyReport
        do {
            answer = try await api.dailySalesReport(day)
        } catch {
            return .failed(error.message, stops: error.isAppleAway || ["app-store-connect-unauthorized", "app-store-connect-forbidden"].contains(error.code))
        }
        switch answer {
        case .notYetPublished:
            return .notYetPublished
        case .noSales:
            return .noSales(try await store.record(vendor: settings.vendorNumber, day: day, version: settings.version, file: nil, rows: []))
        case .report(let file):
            let report: AppleSalesReport
            do {
                report = try AppleSalesReport(file: file)
                try report.check(day: day)
            } catch {
                return .failed(error.message, stops: false)
            }
            let rows = report.rows.map {
                AppleSalesStore.Row(sku: $0.sku, parentIdentifier: $0.parentIdentifier, productType: $0.productType, units: $0.units,
                                    countryCode: $0.countryCode, values: $0.values)
            }
            do {
                return .report(try await store.record(
                    vendor: settings.vendorNumber, day: day, version: settings.version, file: report.text, header: report.header, rows: rows))
            } catch {
                // A value of the report PostgreSQL will not store fails its day alone: the other
                // days are fetched, and this one is asked again by the next run.
                guard let refused = refusedValueMessage(error) else { throw error }
                return .failed("the database refused the report: \(refused)", stops: false)
            }
        }
    }
}
