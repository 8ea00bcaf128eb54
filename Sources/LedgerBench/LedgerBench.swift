// LedgerBench: `ledger-bench`, the benchmarks (not shipped).

import ArgumentParser
import Foundation
import LedgerServer
import LedgerStore
import Logging
import PostgresNIO

/// `ledger-bench`: the ledger's benchmarks, each printed next to a baseline measured in the same
/// run. A tool of its own, not part of the shipped `ledger`: `scripts/bench` builds and runs it.
@main
struct LedgerBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ledger-bench",
        abstract: "Order Ledger's benchmarks, each against a baseline measured in the same run.",
        subcommands: [BenchAppend.self, BenchHTTP.self, BenchImport.self, BenchNotifications.self, BenchReceipts.self, BenchRebuild.self, BenchReconcile.self, BenchSales.self, BenchSweep.self]
    )

    /// As ArgumentParser runs a command, but a database error is printed with PostgreSQL's message
    /// (postgres-nio's own description of it is generic).
    static func main() async {
        do {
            var command = try parseAsRoot()
            if var command = command as? any AsyncParsableCommand { try await command.run() } else { try command.run() }
        } catch let error as PSQLError {
            FileHandle.standardError.write(Data("Error: \(String(reflecting: error))\n".utf8))
            Foundation.exit(1)
        } catch {
            exit(withError: error)
        }
    }
}

/// Where the benchmarks run: the database (as `ledger` finds it) and the `ledger` executable the
/// HTTP benchmarks start.
struct BenchOptions: ParsableArguments {
    @Option(help: "PostgreSQL URL (LEDGER_DATABASE_URL); unset: the private cluster under --data-dir")
    var databaseURL: String?
    @Option(help: "Private cluster directory (LEDGER_DATA_DIR, default ./.ledger)")
    var dataDir: String?
    @Option(help: "The ledger executable the HTTP benchmarks serve with (default: the ledger beside ledger-bench)")
    var server: String?
    @Flag(help: "Keep the bench database (ledger_bench) afterwards, to look at it with psql")
    var keepDatabase = false

    /// The configuration of these settings, the environment's where no flag is given.
    func load() throws -> LedgerConfiguration {
        typealias Key = LedgerConfiguration.Key
        var values = ProcessInfo.processInfo.environment.filter { Key.all.contains($0.key) }
        if let databaseURL { values[Key.databaseURL] = databaseURL }
        if let dataDir { values[Key.dataDirectory] = dataDir }
        return try LedgerConfiguration.load(values)
    }

    /// Opens the database, hands `body` a bench database made afresh and migrated on it, and drops
    /// that database once `body` is done.
    func withBenchDatabase<Result>(_ body: (_ bench: PostgresClient.Configuration) async throws -> Result) async throws -> Result {
        let opened = try await OpenedDatabase.open(try load().database, logger: benchLogger)
        defer { try? opened.close(logger: benchLogger) }
        let bench = try await BenchAppend.prepareDatabase(opened.clientConfiguration, logger: benchLogger)
        let result = try await body(bench)
        if !keepDatabase { try await BenchAppend().dropDatabase(opened.clientConfiguration, logger: benchLogger) }
        return result
    }

    /// The `ledger` to start for the HTTP benchmarks.
    func serverPath() throws -> String {
        if let server { return server }
        let own = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        return URL(fileURLWithPath: own).deletingLastPathComponent().appendingPathComponent("ledger").path
    }
}

/// The logger of every benchmark: errors only (pools warn when leased before their run loop
/// starts, which is harmless here).
let benchLogger: Logger = {
    var logger = Logger(label: "ledger-bench")
    logger.logLevel = .error
    return logger
}()

/// A benchmark that could not run, in one line.
struct BenchFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
