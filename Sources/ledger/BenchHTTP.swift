import ArgumentParser
import AsyncHTTPClient
import Foundation
import LedgerCore
import LedgerServer
import LedgerStore
import Logging
import NIOCore
import PostgresNIO

/// `ledger bench http`: order events appended over HTTP by concurrent keep-alive clients (each
/// order created, then taken through its events) against a `ledger serve` child process, next to
/// pgbench's single-row INSERT at the same concurrency; prints the server's peak RSS.
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
        let (measured, peakRSS) = try await BenchServerChild.run(database: benchConfiguration, work: work) { client, base in
            var results: [(LatencySummary, Int)] = []
            for level in levels {
                let (summary, failures, _) = try await drive(client, base: base, key: key, concurrency: level)
                results.append((summary, failures))
            }
            return results
        }
        let pgbench = PgbenchBaseline(binaries: try PostgresBinaries.locate(), configuration: benchConfiguration, workDirectory: work)
        print("Order events over HTTP (keep-alive clients, each order created then taken through 5 events) vs pgbench single-row INSERT at the same concurrency, \(seconds) s each; one server for all levels")
        print("| clients | HTTP events/s | p50 ms | p99 ms | failed | pgbench rows/s | p50 ms | p99 ms | ratio |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for (level, (ledger, failures)) in zip(levels, measured) {
            let baseline = try pgbench.run(concurrency: level, seconds: seconds)
            let ratio = baseline.perSecond > 0 ? ledger.perSecond / baseline.perSecond : .nan
            print("| \(level) | \(format(ledger.perSecond)) | \(format(ledger.percentile(50), decimals: 2)) | \(format(ledger.percentile(99), decimals: 2)) | \(failures) | \(format(baseline.perSecond)) | \(format(baseline.percentile(50), decimals: 2)) | \(format(baseline.percentile(99), decimals: 2)) | \(format(ratio, decimals: 2)) |")
        }
        print("")
        print("Server peak RSS over the whole run: \(format(Double(peakRSS) / 1024, decimals: 1)) MB")
        try await BenchAppend().dropDatabase(opened.clientConfiguration, logger: logger)
    }

    /// Runs the workload; answers the latencies of successful appends, failures, orders made.
    func drive(_ client: HTTPClient, base: String, key: String, concurrency: Int) async throws -> (LatencySummary, Int, Int) {
        let run = UUID().uuidString.prefix(6)
        _ = try await workload(client, base: base, key: key, concurrency: concurrency, until: .now + .seconds(2), prefix: "warm-\(run)")
        let start = ContinuousClock.now
        let (latencies, failures, orders) = try await workload(client, base: base, key: key, concurrency: concurrency, until: start + .seconds(seconds), prefix: "run-\(run)")
        return (LatencySummary(operations: latencies.count, seconds: (ContinuousClock.now - start).inSeconds, latencies: latencies), failures, orders)
    }

    func workload(_ client: HTTPClient, base: String, key: String, concurrency: Int, until deadline: ContinuousClock.Instant, prefix: String) async throws -> ([Double], Int, Int) {
        return try await withThrowingTaskGroup(of: ([Double], Int, Int).self) { group in
            for worker in 0..<concurrency {
                group.addTask {
                    var latencies: [Double] = []
                    var failures = 0
                    var orders = 0
                    while ContinuousClock.now < deadline {
                        let id = "\(prefix)-\(worker)-\(orders)"
                        let now = LedgerJSON.formatDate(Date())
                        let requests: [(String, String)] = [
                            ("/v1/orders", #"{"orderId":"\#(id)","userId":"u-\#(worker)","productId":"gems.100","price":"0.99","currency":"USD"}"#),
                            ("/v1/orders/\(id)/events", #"{"type":"payment-added","data":{"queuedAt":"\#(now)"}}"#),
                            ("/v1/orders/\(id)/events", #"{"type":"receipt-received","data":{"transactionId":"t-\#(id)","productId":"gems.100","purchaseDate":"\#(now)","receiptSha256":"\#(String(repeating: "ab", count: 32))","format":"jws","matchedBy":"applicationUsername"}}"#),
                            ("/v1/orders/\(id)/events", #"{"type":"verified","data":{"environment":"Sandbox"}}"#),
                            ("/v1/orders/\(id)/events", #"{"type":"delivered","data":{}}"#),
                            ("/v1/orders/\(id)/events", #"{"type":"finished","data":{}}"#),
                        ]
                        for (path, body) in requests {
                            var request = HTTPClientRequest(url: base + path)
                            request.method = .POST
                            request.headers.add(name: "Authorization", value: "Bearer \(key)")
                            request.headers.add(name: "Content-Type", value: "application/json")
                            request.body = .bytes(ByteBuffer(string: body))
                            let started = ContinuousClock.now
                            let response = try await client.execute(request, timeout: .seconds(30))
                            _ = try await response.body.collect(upTo: 1 << 20)
                            let took = ContinuousClock.now - started
                            if (200..<300).contains(response.status.code) {
                                latencies.append(took.inSeconds * 1000)
                            } else {
                                failures += 1
                            }
                        }
                        orders += 1
                    }
                    return (latencies, failures, orders)
                }
            }
            return try await group.reduce(into: ([Double](), 0, 0)) { $0.0 += $1.0; $0.1 += $1.1; $0.2 += $1.2 }
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
