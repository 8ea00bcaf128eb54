import ArgumentParser
import Foundation
import LedgerServer
import LedgerServices
import LedgerStore

/// `ledger sales fetch`: App Store Connect's daily sales reports into the ledger (docs/finance.md).
struct Sales: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "App Store Connect's daily sales reports (needs LEDGER_APP_STORE_CONNECT_*).", subcommands: [Fetch.self])

    struct Fetch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Fetch the days with no report stored (Apple keeps 365), or --again every day of the range.")
        @OptionGroup var options: ConfigurationOptions
        @Option(help: "First day (2026-11-01); default the first day Apple keeps") var from: String?
        @Option(help: "Last day (included); default yesterday in Pacific time, the last Apple may have published") var to: String?
        @Flag(help: "Fetch every day of the range again: a restated day is stored as a new revision") var again = false

        func run() async throws {
            let configuration = try LedgerConfiguration.load(options.values())
            guard configuration.appStoreConnect != nil else {
                throw ValidationError("no App Store Connect key: set LEDGER_APP_STORE_CONNECT_ISSUER_ID, _KEY_ID, _PRIVATE_KEY and _VENDOR_NUMBER")
            }
            let (first, last) = (try from.map { try Self.day($0, "--from") }, try to.map { try Self.day($0, "--to") })
            let again = again
            let summary = try await withLedgerDatabase(options) { client, logger in
                let services = ServiceAssembly(database: Database(client: client, logger: logger))
                return try await configuration.salesReportFetch(services, logger: logger)!.run(from: first, to: last, again: again)
            }
            print("sales reports: \(summary.new.count) new, \(summary.restated.count) restated, \(summary.unchanged.count) unchanged, \(summary.noSales.count) without sales, \(summary.notYetPublished.count) not published yet (asked again next run), \(summary.failed.count) failed")
            for day in summary.restated { print("  \(day): restated by Apple, stored as a new revision") }
            for (day, why) in summary.failed.sorted(by: { $0.key < $1.key }) { print("  \(day): \(why)") }
            if !summary.failed.isEmpty { throw ExitCode(2) }
        }

        /// A day as the reports take it: `YYYY-MM-DD` (a time is taken as its UTC day).
        static func day(_ text: String, _ option: String) throws -> String {
            do { return String(try ReportPeriod.date(text, field: option).formatted(Date.ISO8601FormatStyle()).prefix(10)) } catch {
                throw ValidationError("\(error)")
            }
        }
    }
}
