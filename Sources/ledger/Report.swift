import ArgumentParser
import Foundation
import LedgerServer
import LedgerStore

/// `ledger report --from --to [--format csv|json]`: the reconciliation report on stdout.
struct Report: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the reconciliation report (per day, product, currency and environment; the unmatched pool).")
    @OptionGroup var options: ConfigurationOptions
    @Option(help: "First day (2026-11-01) or time; default 30 days ago") var from: String?
    @Option(help: "Last day (included) or time (excluded); default now") var to: String?
    @Option(help: "csv or json") var format = "csv"

    func run() async throws {
        guard ["csv", "json"].contains(format) else { throw CommandFailure("--format must be csv or json") }
        let (start, end) = try ReportPeriod.parse(from: from, to: to)
        let report = try await withLedgerDatabase(options) { client, logger in
            try await ReconciliationReport.make(database: Database(client: client, logger: logger), from: start, to: end)
        }
        if format == "csv" {
            print(report.csv, terminator: "")
        } else {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
            print(String(decoding: try encoder.encode(report), as: UTF8.self))
        }
    }
}
