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

/// `ledger bench http`: order events appended over HTTP by concurrent keep-alive clients (each
/// order created, then taken through its events) against a `ledger serve` child process, next to
/// pgbench's single-row INSERT at the same concurrency; then the same server's floor (GET
/// /healthz from the same client), the most any route could reach; prints the server's peak RSS.
struct BenchHTTP: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "http", abstract: "Order events over HTTP against a pgbench INSERT baseline.")

    @OptionGroup var options: ConfigurationOptions
    @Option(help: "Seconds to measure")
    var seconds = 15
    @Option(help: "Concurrent keep-alive clients, comma-separated (one measurement each)")
    var concurrency = "1,8,32"

    func run() async throws {
        let configuration = try options.load()
        let logger = BenchAppend.logger
        let opened = try await OpenedDatabase.open(configuration.database, logger: logger)
        defer { try? opened.close(logger: logger) }
        let benchConfiguration = try await BenchAppend.prepareDatabase(opened.clientConfiguration, logger: logger)
        let key = try await withPostgresClient(benchConfiguration, logger: logger) { client in
            try await APIKeyStore(database: Database(client: client, logger: logger)).create(name: "bench", scopes: [.admin])
        }
        let work = try BenchServerChild.workDirectory("http")
        defer { try? FileManager.default.removeItem(at: work) }
        let levels = concurrency.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }.filter { $0 > 0 }
        guard !levels.isEmpty else { throw CommandFailure("--concurrency takes client counts such as 1,8,32") }
        let (measured, peakRSS) = try await BenchServerChild.run(database: benchConfiguration, work: work) { _, base, server in
            var results: [(events: Measured, floor: Measured)] = []
            for level in levels {
                let events = try await drive(base: base, key: key, concurrency: level, floor: false, server: server)
                let floor = try await drive(base: base, key: key, concurrency: level, floor: true, server: server)
                results.append((events, floor))
            }
            return results
        }
        let pgbench = PgbenchBaseline(binaries: try PostgresBinaries.locate(), configuration: benchConfiguration, workDirectory: work)
        let baselines = try levels.map { try pgbench.run(concurrency: $0, seconds: seconds) }
        print("Order events over HTTP (keep-alive clients, each order created then taken through 5 events) vs pgbench single-row INSERT at the same concurrency, \(seconds) s each; one server for all levels")
        printTableHeader(["clients", "HTTP events/s", "p50 ms", "p99 ms", "failed", "server CPU µs/event", "PostgreSQL CPU µs/event",
                          "pgbench rows/s", "p50 ms", "p99 ms", "ratio"])
        for (level, (result, baseline)) in zip(levels, zip(measured, baselines)) {
            let events = result.events
            printTableRow(["\(level)"] + events.latencies.cells + ["\(events.failures)", format(events.serverMicroseconds), format(events.postgresMicroseconds)]
                          + baseline.cells + [format(events.latencies.ratio(to: baseline), decimals: 2)])
        }
        print("")
        print("The same server's floor: GET /healthz (no database, no JSON body, no key) from the same client, \(seconds) s each; \"ratio\" is the most any route could reach against the pgbench figure above")
        printTableHeader(["clients", "requests/s", "p50 ms", "p99 ms", "server CPU µs/request", "ratio"])
        for (level, (result, baseline)) in zip(levels, zip(measured, baselines)) {
            printTableRow(["\(level)"] + result.floor.latencies.cells + [format(result.floor.serverMicroseconds), format(result.floor.latencies.ratio(to: baseline), decimals: 2)])
        }
        print("")
        print("Server peak RSS over the whole run: \(format(Double(peakRSS) / 1024, decimals: 1)) MB")
        try await BenchAppend().dropDatabase(opened.clientConfiguration, logger: logger)
    }

    /// One measured workload: the latencies of successful requests, the failures, and the CPU
    /// time the server and the local PostgreSQL processes spent per successful request.
    struct Measured {
        let latencies: LatencySummary
        let failures: Int
        let serverMicroseconds: Double
        let postgresMicroseconds: Double
    }

    /// Runs the workload (`floor`: GET /healthz instead) after a 2 s warm-up.
    func drive(base: String, key: String, concurrency: Int, floor: Bool, server: pid_t) async throws -> Measured {
        let loop = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let run = UUID().uuidString.prefix(6)
        var start = ContinuousClock.now
        let outcome: HTTPLoad.Outcome
        var cpuAtStart = (server: 0.0, postgres: 0.0)
        do {
            _ = try await workload(loop.next(), base: base, key: key, concurrency: concurrency, floor: floor, until: .now() + .seconds(2), prefix: "warm-\(run)")
            start = .now
            cpuAtStart = (ProcessCPU.seconds(of: server), ProcessCPU.postgresSeconds())
            outcome = try await workload(loop.next(), base: base, key: key, concurrency: concurrency, floor: floor, until: .now() + .seconds(Int64(seconds)), prefix: "run-\(run)")
        } catch {
            try? await loop.shutdownGracefully()
            throw error
        }
        let elapsed = (ContinuousClock.now - start).inSeconds
        let cpu = (server: ProcessCPU.seconds(of: server) - cpuAtStart.server, postgres: ProcessCPU.postgresSeconds() - cpuAtStart.postgres)
        try await loop.shutdownGracefully()
        let requests = Double(max(outcome.latencies.count, 1))
        return Measured(
            latencies: LatencySummary(operations: outcome.latencies.count, seconds: elapsed, latencies: outcome.latencies),
            failures: outcome.failures, serverMicroseconds: cpu.server / requests * 1_000_000,
            postgresMicroseconds: cpu.postgres / requests * 1_000_000)
    }

    /// Each client creates an order, then takes it through five events, one request at a time,
    /// then the next order, until the deadline (`floor`: GET /healthz, again and again).
    func workload(
        _ loop: any EventLoop, base: String, key: String, concurrency: Int, floor: Bool, until deadline: NIODeadline, prefix: String
    ) async throws -> HTTPLoad.Outcome {
        let host = String(base.dropFirst("http://".count))
        guard let port = host.split(separator: ":").last.flatMap({ Int($0) }) else { throw CommandFailure("no port in \(base)") }
        let headers = [("Authorization", "Bearer \(key)"), ("Content-Type", "application/json")]
        let health = [HTTPLoad.Request(method: "GET", path: "/healthz", host: host)]
        return try await HTTPLoad.run(on: loop, host: "127.0.0.1", port: port, connections: concurrency, until: deadline) { worker, n in
            if floor { return health }
            let id = "\(prefix)-\(worker)-\(n)"
            let now = LedgerJSON.formatDate(Date())
            let requests: [(String, String)] = [
                ("/v1/orders", #"{"orderId":"\#(id)","userId":"u-\#(worker)","productId":"gems.100","price":"0.99","currency":"USD"}"#),
                ("/v1/orders/\(id)/events", #"{"type":"payment-added","data":{"queuedAt":"\#(now)"}}"#),
                ("/v1/orders/\(id)/events", #"{"type":"receipt-received","data":{"transactionId":"t-\#(id)","productId":"gems.100","purchaseDate":"\#(now)","receiptSha256":"\#(String(repeating: "ab", count: 32))","format":"jws","matchedBy":"applicationUsername"}}"#),
                ("/v1/orders/\(id)/events", #"{"type":"verified","data":{"environment":"Sandbox"}}"#),
                ("/v1/orders/\(id)/events", #"{"type":"delivered","data":{}}"#),
                ("/v1/orders/\(id)/events", #"{"type":"finished","data":{}}"#),
            ]
            return requests.map { HTTPLoad.Request(method: "POST", path: $0.0, host: host, headers: headers, body: $0.1) }
        }
    }

    static func waitUntilReady(_ client: HTTPClient, _ base: String) async throws {
        for _ in 0..<300 {
            if let response = try? await client.execute(HTTPClientRequest(url: base + "/readyz"), timeout: .seconds(2)),
               response.status == .ok { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw CommandFailure("the server did not become ready within 30 s")
    }

    static func executablePath() throws -> String {
        let path = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
        return path
    }

    /// The peak resident set (VmHWM) of a process, in KiB.
    static func peakRSSKiB(of pid: pid_t) -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") } ?? ""
        return Int(line.split(separator: " ").dropFirst().first { Int($0) != nil } ?? "0") ?? 0
    }
}
