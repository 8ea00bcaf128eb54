import ArgumentParser
import Foundation
import LedgerServer
import LedgerStore

/// `ledger report [reconciliation|apple] --from --to [--format …]`: a report on stdout.
struct Report: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a report: the reconciliation report (the default) or Apple's sales beside the ledger's.",
        subcommands: [Reconciliation.self, AppleSales.self], defaultSubcommand: Reconciliation.self)
}

/// `ledger report apple --from --to [--format table|csv|json]`: Apple's sales beside the ledger's (docs/finance.md).
struct AppleSales: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "apple", abstract: "Apple's daily sales (App Store Connect's reports) beside the ledger's, per day, app and product.")
    @OptionGroup var options: ConfigurationOptions
    @Option(help: "First day (2026-11-01); default 30 days ago in Pacific time") var from: String?
    @Option(help: "Last day (included); default yesterday in Pacific time, the last Apple may have published") var to: String?
    @Option(help: "table, csv or json") var format = "table"

    func run() async throws {
        guard ["table", "csv", "json"].contains(format) else { throw ValidationError("--format must be table, csv or json") }
        let (start, end) = try optionValue { try ReportPeriod.days(from: from, to: to) }
        let report = try await withLedgerDatabase(options) { client, logger in
            try await AppleSalesComparison.make(database: Database(client: client, logger: logger), from: start, to: end)
        }
        switch format {
        case "csv": print(report.csv, terminator: "")
        case "json":
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
            print(String(decoding: try encoder.encode(report), as: UTF8.self))
        default: print(report.table, terminator: "")
        }
    }
}

/// `ledger report [reconciliation] --from --to [--format csv|json]`: the reconciliation report on stdout.
struct Reconciliation: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reconciliation", abstract: "Print the reconciliation report (per day, product, currency and environment; the unmatched pool).")
    @OptionGroup var options: ConfigurationOptions
    @Option(help: "First day (2026-11-01) or time; default 30 days ago") var from: String?
    @Option(help: "Last day (included) or time (excluded); default now") var to: String?
    @Option(help: "csv or json") var format = "csv"

    func run() async throws {
        guard ["csv", "json"].contains(format) else { throw ValidationError("--format must be csv or json") }
        let (start, end) = try optionValue { try ReportPeriod.parse(from: from, to: to) }
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
