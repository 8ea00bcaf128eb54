import AppleReceipts
import ArgumentParser
import AsyncHTTPClient
import Foundation
import LedgerCore
import LedgerServer
import LedgerStore
import Logging
import NIOCore
import PostgresNIO

/// `ledger-bench receipts`: StoreKit 2 signed transactions posted to `POST /v1/receipts` by
/// concurrent keep-alive clients against a `ledger serve` child process that trusts a throwaway
/// signing chain made for this run; each receipt is verified (chain, signature) and applied to
/// its own open order (receipt-received + verified, the transaction claimed).
struct BenchReceipts: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "receipts", abstract: "Signed-transaction receipts verified and applied over HTTP.")

    @OptionGroup var options: BenchOptions
    @Option(help: "Receipts to post (each for an order of its own, made beforehand)")
    var receipts = 15_000
    @Option(help: "Concurrent keep-alive clients")
    var concurrency = 32
    @Option(help: "Receipts posted before the clock starts (connections and plans warm up), not counted")
    var warmup = 1_000
    @Option(help: "Apps the receipts are spread over, in turn (each its own bundle id, orders and transactions)")
    var apps = 1

    static let bundleId = "com.example.ledger-bench"

    /// The bundle id of app `index` of the run: the first is the one the server's settings name.
    static func bundleId(_ index: Int) -> String { index == 0 ? bundleId : "\(bundleId)-\(index + 1)" }

    func validate() throws {
        guard (1...16).contains(apps) else { throw ValidationError("--apps must be from 1 to 16") }
    }

    func run() async throws {
        let logger = benchLogger
        try await options.withBenchDatabase { benchConfiguration in
            let work = try BenchServerChild.workDirectory("receipts")
            defer { try? FileManager.default.removeItem(at: work) }

            let (chain, rootFile) = try Self.signingChain(in: work)
            let run = UUID().uuidString.prefix(6).lowercased()
            let (key, bodies) = try await withPostgresClient(benchConfiguration, logger: logger) { client in
                let database = Database(client: client, logger: logger)
                let key = try await APIKeyStore(database: database).create(name: "bench", scopes: [.admin])
                // Every app is held before the orders are made (the server's settings describe
                // the first, as a ledger of one app is run).
                if apps > 1 {
                    let catalog = AppCatalog(database: database)
                    for index in 0..<apps {
                        _ = try await catalog.add(try BundleID(Self.bundleId(index)), AppChanges(environments: [.sandbox]))
                    }
                }
                return (key, try await prepare(chain: chain, run: String(run), total: receipts + warmup, ledger: OrderLedger(writer: LedgerWriter(database: database))))
            }

            let environment = ["LEDGER_APPLE_ROOT_CERTS": rootFile, "LEDGER_APPLE_BUNDLE_ID": Self.bundleId, "LEDGER_APPLE_ENVIRONMENT": "Sandbox"]
            let (measured, peakRSS) = try await BenchServerChild.run(
                server: try options.serverPath(), database: benchConfiguration, work: work, environment: environment
            ) { client, base, server in
                try await drive(client, base: base, key: key, bodies: bodies, server: server)
            }
            let (summary, outcomes, cost) = measured
            print("Signed-transaction receipts over HTTP (\(concurrency) keep-alive clients, \(receipts) receipts after \(warmup) for warm-up, each verified and applied to its own order; \(apps) app\(apps == 1 ? "" : "s"), in turn)")
            printTableHeader(
                ["clients", "receipts/s", "p50 ms", "p99 ms", "server CPU µs/receipt", "PostgreSQL CPU µs/receipt", "busy CPU µs/receipt", "idle %",
                 "outcomes", "server peak RSS MB"],
                leftAligned: [8])
            let outcomeText = outcomes.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")
            printTableRow(
                ["\(concurrency)"] + summary.cells + cost.cells(per: summary.operations) + [outcomeText, format(Double(peakRSS) / 1024, decimals: 1)])
        }
    }

    /// A signing chain made for this run, its root written to a PEM file in `work` for the
    /// ledger to trust.
    static func signingChain(in work: URL) throws -> (ThrowawaySigningChain, rootFile: String) {
        let chain = try ThrowawaySigningChain(name: "Order Ledger benchmark")
        let rootFile = work.appendingPathComponent("bench-root.pem").path
        try chain.rootPEM().write(toFile: rootFile, atomically: true, encoding: .utf8)
        return (chain, rootFile)
    }

    /// One open order per receipt and the request body proving its purchase, signed beforehand
    /// so the measurement holds the server's work only.
    func prepare(chain: ThrowawaySigningChain, run: String, total: Int, ledger: OrderLedger) async throws -> [String] {
        let (concurrency, apps) = (concurrency, apps)
        return try await withThrowingTaskGroup(of: [String].self) { group in
            for worker in 0..<concurrency {
                group.addTask {
                    var bodies: [String] = []
                    for index in stride(from: worker, to: total, by: concurrency) {
                        let orderID = "bench-\(run)-\(index)"
                        let user = try UserID("user-\(index % 500)")
                        let app = Self.bundleId(index % apps)
                        _ = try await ledger.create(
                            try OrderID(orderID),
                            OrderCreated(
                                userId: user, productId: try ProductID("gems.100"), price: "0.99", currency: "USD",
                                bundleId: apps > 1 ? try BundleID(app) : nil),
                            tokenGiven: false, metadata: Data("{}".utf8))
                        let now = Date()
                        let payload = SignedTransactionPayload(
                            transactionId: "\(run)\(index)", originalTransactionId: "\(run)\(index)", bundleId: app,
                            productId: "gems.100", purchaseDate: now.millisecondsSince1970, signedDate: now.millisecondsSince1970,
                            environment: "Sandbox", price: 990, currency: "USD")
                        let jws = try chain.sign(payload)
                        bodies.append(#"{"userId":"\#(user.rawValue)","orderId":"\#(orderID)","signedTransaction":"\#(jws)"}"#)
                    }
                    return bodies
                }
            }
            return try await group.reduce(into: [String]()) { $0 += $1 }
        }
    }

    func drive(
        _ client: HTTPClient, base: String, key: String, bodies: [String], server: pid_t
    ) async throws -> (LatencySummary, [String: Int], RequestCost) {
        _ = try await post(Array(bodies.prefix(warmup)), client: client, base: base, key: key)
        var cost = RequestCost()
        let start = ContinuousClock.now
        let (latencies, outcomes) = try await cost.measure(server: server) {
            try await post(Array(bodies.dropFirst(warmup)), client: client, base: base, key: key)
        }
        let elapsed = ContinuousClock.now - start
        let seconds = elapsed.inSeconds
        return (LatencySummary(operations: latencies.count, seconds: seconds, latencies: latencies), outcomes, cost)
    }

    /// The `outcome` of a receipt answer, found without a JSON parser (the load generator should
    /// spend as little of the machine as it can).
    static func outcome(in answer: String) -> String {
        guard let start = answer.range(of: #""outcome":""#)?.upperBound,
              let end = answer[start...].firstIndex(of: "\"") else { return "?" }
        return String(answer[start..<end])
    }

    /// Posts `bodies` from `concurrency` clients; answers the latencies of matched receipts and
    /// the count of each outcome.
    func post(_ bodies: [String], client: HTTPClient, base: String, key: String) async throws -> ([Double], [String: Int]) {
        let concurrency = concurrency
        return try await withThrowingTaskGroup(of: ([Double], [String: Int]).self) { group in
            for worker in 0..<concurrency {
                group.addTask {
                    var latencies: [Double] = []
                    var outcomes: [String: Int] = [:]
                    for index in stride(from: worker, to: bodies.count, by: concurrency) {
                        var request = HTTPClientRequest(url: base + "/v1/receipts")
                        request.method = .POST
                        request.headers.add(name: "Authorization", value: "Bearer \(key)")
                        request.headers.add(name: "Content-Type", value: "application/json")
                        request.body = .bytes(ByteBuffer(string: bodies[index]))
                        let started = ContinuousClock.now
                        let response = try await client.execute(request, timeout: .seconds(30))
                        let body = try await response.body.collect(upTo: 1 << 20)
                        let took = ContinuousClock.now - started
                        let outcome = response.status == .ok ? Self.outcome(in: String(buffer: body)) : "HTTP \(response.status.code)"
                        outcomes[outcome, default: 0] += 1
                        if outcome == "matched" {
                            latencies.append(took.inSeconds * 1000)
                        }
                    }
                    return (latencies, outcomes)
                }
            }
            return try await group.reduce(into: ([Double](), [String: Int]())) { total, part in
                total.0 += part.0
                total.1.merge(part.1, uniquingKeysWith: +)
            }
        }
    }
}
