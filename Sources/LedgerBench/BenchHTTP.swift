import ArgumentParser
import AsyncHTTPClient
import Foundation
import LedgerCore
import LedgerServer
import LedgerStore
import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import PrivatePostgres

/// `ledger-bench http`: order events appended over HTTP by concurrent keep-alive clients (each
/// order created, then taken through its events) against a `ledger serve` child process, next to
/// two pgbench baselines at the same concurrency: the same durable work as an order event done by
/// hand, one transaction per event (`order-event`: lock the order's row, insert the event into the
/// ledger's log, update the row), and a bare single-row INSERT (`insert`, the floor of any durable
/// write), and the same orders through the write path alone, in this process (no HTTP); then the
/// same server's floor (GET /healthz from the same client), the most any route could reach;
/// prints the server's peak RSS.
///
/// The four take turns, in rounds, at each level, a different one first in each round: this
/// machine's speed swings by a third or more over minutes, and measured in turns all four see
/// the same phases. A ratio is the whole HTTP count over the whole baseline count, and each
/// round's own ratio is printed beside it.
struct BenchHTTP: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "http", abstract: "Order events over HTTP against two pgbench baselines.")

    @OptionGroup var options: BenchOptions
    @Option(help: "Seconds to measure each side at each level, in all (split over the rounds, in whole seconds)")
    var seconds = 15
    @Option(help: "Concurrent keep-alive clients, comma-separated (one set of rounds each)")
    var concurrency = "1,8,32"
    @Option(help: "Rounds at each level: the HTTP workload and the baselines take turns, seconds/rounds each")
    var rounds = 3

    func run() async throws {
        let configuration = try options.load()
        let logger = benchLogger
        let levels = concurrency.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }.filter { $0 > 0 }
        guard !levels.isEmpty else { throw BenchFailure("--concurrency takes client counts such as 1,8,32") }
        guard rounds >= 1, seconds >= rounds else { throw BenchFailure("--rounds takes 1 to --seconds rounds (a round is at least 1 s)") }
        let server = try options.serverPath()
        let opened = try await OpenedDatabase.open(configuration.database, logger: logger)
        defer { try? opened.close(logger: logger) }
        // The server migrates the database as it starts: a `--server` of another version of the
        // ledger finds it as it would make it.
        let benchConfiguration = try await BenchAppend.prepareDatabase(opened.clientConfiguration, migrate: false, logger: logger)
        let work = try BenchServerChild.workDirectory("http")
        defer { try? FileManager.default.removeItem(at: work) }
        let binaries = try PostgresBinaries.locate()
        let insert = PgbenchBaseline(binaries: binaries, configuration: benchConfiguration, workDirectory: work, workload: .insert)
        let orderEvent = PgbenchBaseline(binaries: binaries, configuration: benchConfiguration, workDirectory: work, workload: .orderEvent)
        let round = seconds / rounds
        let (results, peakRSS) = try await BenchServerChild.run(server: server, database: benchConfiguration, work: work) { _, base, child in
            let key = try await withPostgresClient(benchConfiguration, logger: logger) { client in
                for low in stride(from: 1, through: PgbenchBaseline.orders, by: 4_000) {
                    let high = min(low + 3_999, PgbenchBaseline.orders)
                    try await client.query(PostgresQuery(unsafeSQL: PgbenchBaseline.ordersSQL(low, high)), logger: logger)
                }
                return try await APIKeyStore(database: Database(client: client, logger: logger)).create(name: "bench", scopes: [.admin])
            }
            var results: [Level] = []
            for level in levels {
                var measured = Level()
                for number in 0..<rounds {
                    // Who goes first turns, so that a steady drift of the machine's speed favours
                    // none. The server stays up, idle, while the others run.
                    var events: Measured?, byHand: PgbenchBaseline.Measurement?, bare: PgbenchBaseline.Measurement?, alone: WritePath?
                    for side in (0..<4).map({ ($0 + number) % 4 }) {
                        switch side {
                        case 0: events = try await drive(base: base, key: key, concurrency: level, seconds: round, floor: false, server: child)
                        case 1: byHand = try orderEvent.measure(concurrency: level, seconds: round)
                        case 2: bare = try insert.measure(concurrency: level, seconds: round)
                        default: alone = try await writePath(benchConfiguration, concurrency: level, seconds: round)
                        }
                    }
                    measured.add(events!, byHand: byHand!, bare: bare!, alone: alone!)
                }
                measured.floor = try await drive(base: base, key: key, concurrency: level, seconds: round, floor: true, server: child)
                results.append(measured)
            }
            return results
        }
        print("Order events over HTTP (keep-alive clients, each order created then taken through 5 events) vs pgbench at the same concurrency: the same work by hand, one transaction per event (lock the order's row, insert the event, update the row), and a bare single-row INSERT; \(rounds) rounds of \(round) s each, taking turns; one server for all levels")
        printTableHeader(["clients", "HTTP events/s", "p50 ms", "p99 ms", "failed", "server CPU µs/event", "PostgreSQL CPU µs/event",
                          "by hand tx/s", "ratio", "by round", "INSERT rows/s", "ratio"])
        let merged = results.map { $0.merged() }
        for (level, (result, total)) in zip(levels, zip(results, merged)) {
            let events = total.events
            printTableRow(["\(level)"] + events.latencies.cells + ["\(events.failures)", format(events.serverMicroseconds), format(events.postgresMicroseconds)]
                          + [format(total.byHand.summary.perSecond), format(events.latencies.ratio(to: total.byHand.summary), decimals: 2),
                             result.byHandRatios.map { format($0, decimals: 2) }.joined(separator: " "),
                             format(total.bare.summary.perSecond), format(events.latencies.ratio(to: total.bare.summary), decimals: 2)])
        }
        print("")
        print("The baselines' latencies")
        printTableHeader(["clients", "by hand p50 ms", "p99 ms", "INSERT p50 ms", "p99 ms"])
        for (level, total) in zip(levels, merged) {
            printTableRow(["\(level)"] + Array(total.byHand.summary.cells.dropFirst()) + Array(total.bare.summary.cells.dropFirst()))
        }
        print("")
        print("The same server's floor: GET /healthz (no database, no JSON body, no key) from the same client, \(round) s once after the rounds; \"ratio\" is the most any route could reach against the INSERT figure above")
        printTableHeader(["clients", "requests/s", "p50 ms", "p99 ms", "server CPU µs/request", "ratio"])
        for (level, (result, total)) in zip(levels, zip(results, merged)) {
            guard let floor = result.floor else { continue }
            printTableRow(["\(level)"] + floor.latencies.cells + [format(floor.serverMicroseconds), format(floor.latencies.ratio(to: total.bare.summary), decimals: 2)])
        }
        print("")
        print("What one operation costs the whole machine (every core: the client, the server, PostgreSQL, the kernel), measured over the same rounds, and the share of the time the cores sat idle")
        printTableHeader(["clients", "HTTP: busy CPU µs/event", "idle %", "by hand: µs/transaction", "idle %", "INSERT: µs/row", "idle %", "floor: µs/request"])
        for (level, (result, total)) in zip(levels, zip(results, merged)) {
            let event = total.events.machine.microseconds(per: total.events.latencies.operations)
            let byHand = total.byHand.machine.microseconds(per: total.byHand.summary.operations)
            let row = total.bare.machine.microseconds(per: total.bare.summary.operations)
            printTableRow(["\(level)", format(event), format(total.events.machine.idlePercent), format(byHand), format(total.byHand.machine.idlePercent),
                           format(row), format(total.bare.machine.idlePercent),
                           result.floor.map { format($0.machine.microseconds(per: $0.latencies.operations)) } ?? "-"])
        }
        print("")
        print("The write path alone: the same orders appended through `OrderLedger` in the benchmark's process, with no HTTP, JSON, key or route (callers on the global executor, the writer on the connections' loop, as `ledger serve` runs them), taking turns with the others; \"CPU ceiling\": the most an HTTP event could reach against by hand, on the machine's CPU, if it cost only the write path and the floor (by hand µs/transaction over write path µs/event plus floor µs/request)")
        printTableHeader(["clients", "events/s", "ratio to by hand", "writes per group", "busy CPU µs/event", "idle %", "PostgreSQL CPU µs/event", "CPU ceiling"])
        for (level, (result, total)) in zip(levels, zip(results, merged)) {
            let alone = total.alone.measured
            let byHand = total.byHand.machine.microseconds(per: total.byHand.summary.operations)
            let event = alone.machine.microseconds(per: alone.latencies.operations)
            let floor = result.floor.map { $0.machine.microseconds(per: $0.latencies.operations) } ?? .nan
            printTableRow(["\(level)", format(alone.latencies.perSecond), format(alone.latencies.ratio(to: total.byHand.summary), decimals: 2),
                           format(total.alone.perGroup, decimals: 1), format(event), format(alone.machine.idlePercent), format(alone.postgresMicroseconds),
                           format(byHand / (event + floor), decimals: 2)])
        }
        print("")
        print("Server peak RSS over the whole run: \(format(Double(peakRSS) / 1024, decimals: 1)) MB")
        try await BenchAppend().dropDatabase(opened.clientConfiguration, logger: logger)
    }

    /// Runs the workload (`floor`: GET /healthz instead) for `seconds` after a 2 s warm-up.
    func drive(base: String, key: String, concurrency: Int, seconds: Int, floor: Bool, server: pid_t) async throws -> Measured {
        let loop = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let run = UUID().uuidString.prefix(6)
        var start = ContinuousClock.now
        let outcome: HTTPLoad.Outcome
        var cpuAtStart = (server: 0.0, postgres: 0.0)
        var machineAtStart = MachineCPU()
        do {
            _ = try await workload(loop.next(), base: base, key: key, concurrency: concurrency, floor: floor, until: .now() + .seconds(2), prefix: "warm-\(run)")
            start = .now
            cpuAtStart = (ProcessCPU.seconds(of: server), ProcessCPU.postgresSeconds())
            machineAtStart = .now()
            outcome = try await workload(loop.next(), base: base, key: key, concurrency: concurrency, floor: floor, until: .now() + .seconds(Int64(seconds)), prefix: "run-\(run)")
        } catch {
            try? await loop.shutdownGracefully()
            throw error
        }
        let elapsed = (ContinuousClock.now - start).inSeconds
        let cpu = (server: ProcessCPU.seconds(of: server) - cpuAtStart.server, postgres: ProcessCPU.postgresSeconds() - cpuAtStart.postgres)
        let machine = MachineCPU.now() - machineAtStart
        try await loop.shutdownGracefully()
        return Measured(
            latencies: LatencySummary(operations: outcome.latencies.count, seconds: elapsed, latencies: outcome.latencies),
            failures: outcome.failures, serverSeconds: cpu.server, postgresSeconds: cpu.postgres, machine: machine)
    }

    /// Each client creates an order, then takes it through five events, one request at a time,
    /// then the next order, until the deadline (`floor`: GET /healthz, again and again).
    func workload(
        _ loop: any EventLoop, base: String, key: String, concurrency: Int, floor: Bool, until deadline: NIODeadline, prefix: String
    ) async throws -> HTTPLoad.Outcome {
        let host = String(base.dropFirst("http://".count))
        guard let port = host.split(separator: ":").last.flatMap({ Int($0) }) else { throw BenchFailure("no port in \(base)") }
        let headers = [("Authorization", "Bearer \(key)"), ("Content-Type", "application/json")]
        let health = [HTTPLoad.Request(method: "GET", path: "/healthz", host: host)]
        return try await HTTPLoad.run(on: loop, host: "127.0.0.1", port: port, connections: concurrency, until: deadline) { worker, n in
            if floor { return health }
            let id = "\(prefix)-\(worker)-\(n)"
            let requests: [(String, String)] = [
                ("/v1/orders", #"{"orderId":"\#(id)","userId":"u-\#(worker)","productId":"gems.100","price":"0.99","currency":"USD"}"#)
            ] + Self.orderEvents(transaction: TransactionID(unchecked: "t-\(id)"), at: Date()).map {
                ("/v1/orders/\(id)/events", #"{"type":"\#($0.event.type.rawValue)","data":\#($0.data)}"#)
            }
            return requests.map { HTTPLoad.Request(method: "POST", path: $0.0, host: host, headers: headers, body: $0.1) }
        }
    }

    static func waitUntilReady(_ client: HTTPClient, _ base: String, server: pid_t, log: URL) async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            if let response = try? await client.execute(HTTPClientRequest(url: base + "/readyz"), timeout: .seconds(2)),
               response.status == .ok { return }
            // A server that refused to start (a database of another schema, a port taken) never
            // becomes ready: say why at once.
            if let code = try ProcessRunner.exitStatus(ofEnded: server) {
                let lines = ((try? String(contentsOf: log, encoding: .utf8)) ?? "").split(separator: "\n")
                throw BenchFailure("the server exited (\(code)) before it was ready: \(lines.last.map(String.init) ?? "(no output)")")
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw BenchFailure("the server did not become ready within 30 s")
    }

    /// The peak resident set (VmHWM) of a process, in KiB.
    static func peakRSSKiB(of pid: pid_t) -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") } ?? ""
        return Int(line.split(separator: " ").dropFirst().first { Int($0) != nil } ?? "0") ?? 0
    }
}
