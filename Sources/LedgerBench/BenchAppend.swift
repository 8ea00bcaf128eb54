import ArgumentParser
import Foundation
import LedgerCore
import LedgerServer
import LedgerStore
import Logging
import NIOPosix
import PostgresNIO
import PrivatePostgres

/// `ledger-bench append`: single-event streams appended through the ledger's writer (group
/// commit, each acknowledged after COMMIT), next to pgbench's single-row INSERT of the same shape,
/// at each concurrency, in one run.
struct BenchAppend: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "append",
        abstract: "Appends per second through the writer against a pgbench INSERT baseline."
    )

    @OptionGroup var options: BenchOptions
    @Option(help: "Seconds per measurement")
    var seconds = 15
    @Option(help: "Comma-separated concurrency levels")
    var concurrency = "1,8,32"

    static let benchDatabase = "ledger_bench"

    func run() async throws {
        let levels = concurrency.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard !levels.isEmpty, levels.allSatisfy({ $0 > 0 && $0 <= 256 }) else {
            throw ValidationError("--concurrency takes numbers from 1 to 256, such as 1,8,32")
        }
        let configuration = try options.load()
        let logger = benchLogger
        let opened = try await OpenedDatabase.open(configuration.database, logger: logger)
        defer { try? opened.close(logger: logger) }

        let benchConfiguration = try await Self.prepareDatabase(opened.clientConfiguration, logger: logger)
        let version = try await withPostgresClient(benchConfiguration, logger: logger) { client in
            let rows = try await client.query("SELECT current_setting('server_version')", logger: logger)
            for try await version in rows.decode(String.self) { return version }
            return "?"
        }
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-bench-\(getpid())")
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: work) }
        let baseline = PgbenchBaseline(binaries: try PostgresBinaries.locate(), configuration: benchConfiguration, workDirectory: work)

        print("Appends through the writer vs pgbench single-row INSERT: PostgreSQL \(version), \(ProcessInfo.processInfo.activeProcessorCount) cores, \(seconds) s per cell; callers and group-commit writer on the connections' event loop")
        printTableHeader(["concurrency", "ledger events/s", "p50 ms", "p99 ms", "pgbench rows/s", "p50 ms", "p99 ms", "ratio"])
        var batching: [String] = []
        for level in levels {
            let (ledger, perTransaction) = try await measureAppends(benchConfiguration, concurrency: level, logger: logger)
            batching.append("\(level): \(format(perTransaction, decimals: 1))")
            let base = try baseline.run(concurrency: level, seconds: seconds)
            printTableRow(["\(level)"] + ledger.cells + base.cells + [format(ledger.ratio(to: base), decimals: 2)])
        }
        print("Appends per group-commit transaction, by concurrency: \(batching.joined(separator: ", "))")
        try await dropDatabase(opened.clientConfiguration, logger: logger)
    }

    /// Appends per second and latencies, and the mean number of appends per group commit.
    func measureAppends(_ configuration: PostgresClient.Configuration, concurrency: Int, logger: Logger) async throws -> (LatencySummary, Double) {
        var configuration = configuration
        configuration.options.maximumConnections = concurrency
        configuration.options.minimumConnections = concurrency
        let seconds = self.seconds
        // The callers on the connections' loop too, where the writer runs.
        return try await withWriterLoop(configuration, logger: logger) { database, executor in
            try await withTaskExecutorPreference(executor) {
                let writer = LedgerWriter(database: database)
                let run = UUID().uuidString.prefix(8)
                // Warm up the pool and the server's caches, unmeasured.
                _ = try await appendLoop(writer, workers: concurrency, for: .seconds(1), prefix: "warm-\(run)")
                let before = writer.groupCommitStatistics
                let start = ContinuousClock.now
                let latencies = try await appendLoop(writer, workers: concurrency, for: .seconds(seconds), prefix: "bench-\(run)")
                let elapsedSeconds = (ContinuousClock.now - start).inSeconds
                let after = writer.groupCommitStatistics
                let perTransaction = Double(after.writes - before.writes) / Double(max(1, after.groups - before.groups))
                return (LatencySummary(operations: latencies.count, seconds: elapsedSeconds, latencies: latencies), perTransaction)
            }
        }
    }

    /// Each worker appends one-event streams until the time is up; returns every latency in ms.
    func appendLoop(_ writer: LedgerWriter, workers: Int, for duration: Duration, prefix: String) async throws -> [Double] {
        let deadline = ContinuousClock.now + duration
        let body = Data(#"{"orderId": "o-1", "userId": "u-1", "productId": "p-1", "price": "0.99"}"#.utf8)
        let metadata = Data(#"{"by": "bench"}"#.utf8)
        let ids = LoadEventIDs()
        return try await withThrowingTaskGroup(of: [Double].self) { group in
            for worker in 0..<workers {
                group.addTask {
                    var latencies: [Double] = []
                    var index = 0
                    while ContinuousClock.now < deadline {
                        let stream = try StreamID("\(prefix)-\(worker)-\(index)")
                        let event = try NewEvent(id: ids.id(worker: worker, index: index), type: "created", data: body, metadata: metadata)
                        let started = ContinuousClock.now
                        _ = try await writer.append([event], to: stream, expected: .noStream)
                        let took = ContinuousClock.now - started
                        latencies.append(took.inSeconds * 1000)
                        index += 1
                    }
                    return latencies
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
    }

    /// A fresh scratch database, migrated unless asked not to, with pgbench's baseline table;
    /// answers its configuration.
    static func prepareDatabase(_ server: PostgresClient.Configuration, migrate: Bool = true, logger: Logger) async throws -> PostgresClient.Configuration {
        var bench = server
        bench.database = benchDatabase
        try await BenchAppend().recreateDatabase(server, logger: logger)
        try await withPostgresClient(bench, logger: logger) { client in
            if migrate { try await Migrator(logger: logger).migrate(client) }
            try await client.query(PostgresQuery(unsafeSQL: PgbenchBaseline.tableSQL), logger: logger)
        }
        return bench
    }

    /// Drops and creates a scratch database (`name` is one of this program's constants).
    func recreateDatabase(_ server: PostgresClient.Configuration, named name: String = benchDatabase, logger: Logger) async throws {
        try await resetDatabase(name, on: server, logger: logger)
    }

    func dropDatabase(_ server: PostgresClient.Configuration, named name: String = benchDatabase, logger: Logger) async throws {
        try await resetDatabase(name, on: server, create: false, logger: logger)
    }
}

/// The load's event ids: unique within a run (the run's random half, then the worker and its
/// count), made without a system call. Foundation's `UUID()` opens and reads /dev/urandom for
/// every id on Linux: measured with perf in `append` at 32 clients, that took a sixth of the
/// event loop the writer shares with its callers, and so slowed the writer under test.
struct LoadEventIDs {
    private let run = UUID()

    func id(worker: Int, index: Int) -> EventID {
        var uuid = run.uuid
        withUnsafeMutableBytes(of: &uuid) { bytes in
            bytes.storeBytes(of: UInt16(truncatingIfNeeded: worker).bigEndian, toByteOffset: 8, as: UInt16.self)
            bytes.storeBytes(of: UInt32(truncatingIfNeeded: index).bigEndian, toByteOffset: 10, as: UInt32.self)
        }
        return EventID(UUID(uuid: uuid))
    }
}

/// Runs `body` on the database as `ledger serve` sets it up: the connections on an event loop of
/// their own, the group-commit writer on that loop too (`executor`); the loop ends after the client.
func withWriterLoop<Result: Sendable>(
    _ configuration: PostgresClient.Configuration, logger: Logger,
    _ body: @Sendable (_ database: Database, _ executor: EventLoopTaskExecutor) async throws -> Result
) async throws -> Result {
    let loop = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    let executor = EventLoopTaskExecutor(loop.next())
    let outcome: Swift.Result<Result, any Error>
    do {
        outcome = .success(try await withPostgresClient(configuration, eventLoopGroup: loop, logger: logger) { client in
            try await body(Database(client: client, logger: logger, writerExecutor: executor), executor)
        })
    } catch {
        outcome = .failure(error)
    }
    try? await loop.shutdownGracefully()
    return try outcome.get()
}
