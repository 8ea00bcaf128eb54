import ArgumentParser
import Foundation
import LedgerServer
import LedgerServices
import LedgerStore

/// `ledger sales fetch`: App Store Connect's daily sales reports into the ledger (docs/finance.md).
struct Sales: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "App Store Connect's daily sales reports (needs LEDGER_APP_STORE_CONNECT_*).", subcommands: [Fetch.self, Sweep.self])

    struct Fetch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Fetch the days with no report stored (Apple keeps 365), or --again every day of the range; then sweep where Apple counted more purchases than the ledger saw.")
        @OptionGroup var options: ConfigurationOptions
        @Option(help: "First day (2026-11-01); default the first day Apple keeps") var from: String?
        @Option(help: "Last day (included); default yesterday in Pacific time, the last Apple may have published") var to: String?
        @Flag(help: "Fetch every day of the range again: a restated day is stored as a new revision") var again = false

        func run() async throws {
            let configuration = try options.configuration()
            guard configuration.appStoreConnect != nil else {
                throw CommandFailure("no App Store Connect key: set LEDGER_APP_STORE_CONNECT_ISSUER_ID, _KEY_ID, _PRIVATE_KEY and _VENDOR_NUMBER")
            }
            let (first, last) = (try from.map { try Self.day($0, "--from") }, try to.map { try Self.day($0, "--to") })
            if let first, let last, last < first { throw ValidationError("--to must not be before --from") }
            // A day not over in Pacific time has no report yet: an answer for it would be stored
            // as the day's and never asked again.
            if let last, last > SalesReportFetch.lastPublishedDay() {
                throw ValidationError("--to must be at most \(SalesReportFetch.lastPublishedDay()), yesterday in Pacific time: Apple publishes a day's report once the day is over there")
            }
            let again = again
            let (summary, swept) = try await withAppleWork(options, requiringKey: false) { work in
                let logger = work.services.database.logger
                let summary = try await configuration.salesReportFetch(work.services, logger: logger)!.run(from: first, to: last, again: again)
                // The days stored now: where Apple counted more than the ledger saw, the sweep
                // looks for what no client sent (only while an app has an App Store Server API key).
                let changed = summary.new + summary.restated
                guard !changed.isEmpty, try await work.api.anyKey() else { return (summary, [SalesShortfallSweep.Swept]?.none) }
                return (summary, try await configuration.salesShortfallSweep(work.services, api: work.api, verifier: work.verifier, logger: logger)
                    .run(days: changed))
            }
            print("sales reports: \(summary.new.count) new, \(summary.restated.count) restated, \(summary.unchanged.count) unchanged, \(summary.noSales.count) without sales, \(summary.notYetPublished.count) not published yet (asked again next run), \(summary.failed.count) failed")
            for day in summary.restated { print("  \(day): restated by Apple, stored as a new revision") }
            for (day, why) in summary.failed.sorted(by: { $0.key < $1.key }) { print("  \(day): \(why)") }
            if let swept { Sweep.print(swept) } else if !(summary.new + summary.restated).isEmpty {
                print("no app has an App Store Server API key: no sweep where Apple counted more purchases than the ledger saw")
            }
            if !summary.failed.isEmpty { throw ExitCode(2) }
        }

        /// A day as the reports take it: `YYYY-MM-DD` (a time is taken as its UTC day).
        static func day(_ text: String, _ option: String) throws -> String {
            do { return String(try ReportPeriod.date(text, field: option).formatted(Date.ISO8601FormatStyle()).prefix(10)) } catch {
                throw ValidationError("\(error)")
            }
        }
    }

    struct Sweep: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Sweep the Apple histories of the users with open orders where Apple's reports counted more purchases of a product on a day than the ledger saw.")
        @OptionGroup var options: ConfigurationOptions
        @Option(help: "First day (2026-11-01)") var from: String
        @Option(help: "Last day (included); default --from") var to: String?

        func run() async throws {
            let first = try Fetch.day(from, "--from")
            let last = try to.map { try Fetch.day($0, "--to") } ?? first
            // Days as YYYY-MM-DD compare as text.
            guard first <= last else { throw ValidationError("--to must not be before --from") }
            let swept = try await withAppleWork(options) { work in
                try await work.configuration.salesShortfallSweep(work.services, api: work.api, verifier: work.verifier, logger: work.services.database.logger)
                    .run(from: first, to: last)
            }
            Self.print(swept)
        }

        static func print(_ swept: [SalesShortfallSweep.Swept]) {
            guard !swept.isEmpty else {
                Swift.print("Apple counted no more purchases than the ledger saw: nothing to sweep")
                return
            }
            for row in swept {
                if row.noKey {
                    Swift.print("\(row.day) \(row.bundleId ?? "-") \(row.productId): Apple counted \(row.missing) more; not swept: the app has no App Store Server API key (ledger apps set)")
                    continue
                }
                Swift.print("\(row.day) \(row.bundleId ?? "-") \(row.productId): Apple counted \(row.missing) more; swept \(row.users) user(s), \(row.accounts) Apple account(s): \(row.found) transaction(s) new to the ledger\(row.failed > 0 ? ", \(row.failed) account(s) not read" : "")")
            }
        }
    }
}
