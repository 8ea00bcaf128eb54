import ArgumentParser
import Foundation
import LedgerCore
import LedgerJSON
import LedgerServer
import LedgerServices
import LedgerStore
import Logging
import PostgresNIO
import PrivatePostgres
import Synchronization

/// `ledger-bench import`: a history of `--orders` finished orders, each with its granted Apple
/// transaction (five events each), imported into a ledger that is serving live order creations;
/// then the same event rows loaded with psql's plain `\copy` into a copy of the log table (its
/// keys and checks, no projections), in the same run. Prints both throughputs, their ratio, and
/// the live creations' latencies during the import.
struct BenchImport: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "import", abstract: "History import against a plain COPY of the same events, with live appends.")

    @OptionGroup var options: BenchOptions
    @Option(help: "Orders in the history (five events each)") var orders = 1_000_000
    @Option(help: "Live order creations per second during the import") var liveRate = 50

    func run() async throws {
        let logger = benchLogger
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-bench-import-\(getpid())")
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: work) }
        let file = work.appendingPathComponent("history.csv")
        try Self.writeHistory(orders: orders, to: file)
        let data = try Data(contentsOf: file)
        let history = try HistoryFile(data, format: .csv)

        try await options.withBenchDatabase { bench in
            let (summary, seconds, live, events) = try await withPostgresClient(bench, logger: logger) { client in
                let database = Database(client: client, logger: logger)
                let importer = HistoryImport(orders: ServiceAssembly(database: database).orders)
                // The live side has a writer of its own, as another server would.
                let serving = ServiceAssembly(database: database).orders
                let stop = LiveStop()
                async let live = Self.liveCreations(serving, rate: liveRate, until: stop)
                let start = ContinuousClock.now
                let summary = try await importer.run(history.lines, source: "history.csv")
                let seconds = (ContinuousClock.now - start).inSeconds
                stop.stop()
                let latencies = try await live
                let events = try await client.query("SELECT count(*)::int FROM events WHERE metadata ? 'importedFrom'", logger: logger)
                    .collect().first!.decode(Int.self)
                return (summary, seconds, LatencySummary(operations: latencies.count, seconds: seconds, latencies: latencies), events)
            }
            let copySeconds = try Self.copyBaseline(
                bench, work: work, table: "events", columns: "global_position, stream_id, stream_version, event_id, type, data, metadata, recorded_at, transaction_id",
                filter: "metadata ? 'importedFrom'")

            print("History import of \(orders) finished orders (\(events) events) into a serving ledger, against psql's \\copy of the same events into a copy of the log table (no projections)")
            printTableHeader(["load", "orders", "events", "seconds", "events/s"], leftAligned: [0])
            printTableRow(["`ledger import` (HistoryImport)", "\(summary.imported)", "\(events)", format(seconds, decimals: 1), format(Double(events) / max(seconds, 0.001))])
            printTableRow(["`\\copy` into a copy of `events`", "-", "\(events)", format(copySeconds, decimals: 1), format(Double(events) / max(copySeconds, 0.001))])
            print("Ratio import / COPY: \(format(copySeconds / max(seconds, 0.001), decimals: 2)); already present \(summary.alreadyPresent), refused \(summary.refused)")
            print("Live order creations during the import: \(live.operations) at \(liveRate)/s, p50 \(format(live.percentile(50), decimals: 2)) ms, p99 \(format(live.percentile(99), decimals: 2)) ms")
        }
    }

    /// A history CSV: finished orders of 10,000 users, each with its transaction, a year ago.
    static func writeHistory(orders: Int, to file: URL) throws {
        FileManager.default.createFile(atPath: file.path, contents: nil)
        let handle = try FileHandle(forWritingTo: file)
        defer { try? handle.close() }
        var text = "orderId,userId,productId,createdAt,state,price,currency,transactionId,purchaseDate\n"
        let base = Date().addingTimeInterval(-365 * 86_400)
        let style = Date.ISO8601FormatStyle()
        for index in 0..<orders {
            let created = base.addingTimeInterval(Double(index) * 0.5)
            text += "h-\(index),u-\(index % 10_000),gems.100,\(created.formatted(style)),finished,0.99,USD,\(7_000_000_000 + index),\(created.addingTimeInterval(10).formatted(style))\n"
            if text.utf8.count > 1 << 20 {
                handle.write(Data(text.utf8))
                text = ""
            }
        }
        handle.write(Data(text.utf8))
    }

    /// Set when the import is done.
    final class LiveStop: Sendable {
        private let done = Mutex(false)
        func stop() { done.withLock { $0 = true } }
        var stopped: Bool { done.withLock { $0 } }
    }

    /// Order creations at `rate` per second until `stop`; their latencies in milliseconds.
    static func liveCreations(_ orders: OrderLedger, rate: Int, until stop: LiveStop) async throws -> [Double] {
        var latencies: [Double] = []
        let interval = Duration.seconds(1) / max(1, rate)
        var next = ContinuousClock.now
        var index = 0
        while !stop.stopped {
            next += interval
            let start = ContinuousClock.now
            _ = try await orders.create(
                OrderID(unchecked: "live-\(index)"), OrderCreated(userId: UserID(unchecked: "live-\(index % 100)"), productId: ProductID(unchecked: "gems.100")),
                tokenGiven: false, metadata: Data("{\"appendedBy\":\"bench\"}".utf8))
            latencies.append((ContinuousClock.now - start).inSeconds * 1000)
            index += 1
            if next > ContinuousClock.now { try await Task.sleep(until: next) }
        }
        return latencies
    }

    /// Seconds psql's `\copy` takes to load `table`'s rows (`filter`'s), exported first, into a
    /// copy of the table with its keys and checks.
    static func copyBaseline(
        _ configuration: PostgresClient.Configuration, work: URL, table: String, columns: String, filter: String = "true"
    ) throws -> Double {
        let binaries = try PostgresBinaries.locate()
        let psql = FileManager.default.isExecutableFile(atPath: binaries.directory + "/psql") ? binaries.directory + "/psql" : "/usr/bin/psql"
        var connection = ["-X", "-q", "-v", "ON_ERROR_STOP=1", "-U", configuration.username]
        if let socket = configuration.unixSocketPath {
            let url = URL(fileURLWithPath: socket)
            connection += ["-h", url.deletingLastPathComponent().path, "-p", String(url.lastPathComponent.split(separator: ".").last ?? "5432")]
        } else {
            connection += ["-h", configuration.host ?? "localhost", "-p", "\(configuration.port ?? 5432)"]
        }
        connection += ["-d", configuration.database ?? configuration.username]
        if let password = configuration.password { setenv("PGPASSWORD", password, 1) }
        let runner = ProcessRunner(workingDirectory: work)
        let rows = work.appendingPathComponent("\(table).copy").path
        for command in [
            "\\copy (SELECT \(columns) FROM \(table) WHERE \(filter)) TO '\(rows)'",
            "CREATE TABLE \(table)_copy (LIKE \(table) INCLUDING ALL)",
        ] {
            let outcome = try runner.runBlocking(psql, connection + ["-c", command])
            guard outcome.status == 0 else { throw ValidationError("psql failed: \(outcome.output)") }
        }
        let start = ContinuousClock.now
        let outcome = try runner.runBlocking(psql, connection + ["-c", "\\copy \(table)_copy (\(columns)) FROM '\(rows)'"])
        let seconds = (ContinuousClock.now - start).inSeconds
        guard outcome.status == 0 else { throw ValidationError("psql failed: \(outcome.output)") }
        return seconds
    }
}
