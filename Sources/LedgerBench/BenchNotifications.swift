import AppleReceipts
import ArgumentParser
import AsyncHTTPClient
import Foundation
import LedgerCore
import LedgerStore
import NIOCore

/// `ledger-bench notifications`: subscription renewals signed as Apple signs `DID_RENEW` posted to
/// `POST /v1/notifications/apple` by concurrent keep-alive clients, each a new billed period of a
/// subscription bought beforehand through a receipt; against `bench receipts`' workload run in the
/// same server, in alternating rounds (issue 40: at least 0.80 of its rate). Then
/// `GET /v1/users/{userId}/subscriptions` under the same number of clients.
struct BenchNotifications: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "notifications", abstract: "Subscription renewals through Apple's notifications over HTTP, against receipts in the same run.")

    @OptionGroup var options: BenchOptions
    @Option(help: "Renewal notifications to post (each a new period of one of the subscriptions)")
    var renewals = 15_000
    @Option(help: "Receipts of the baseline workload (each for an order of its own)")
    var receipts = 15_000
    @Option(help: "Subscriptions bought (through a receipt of their start) before the clock starts")
    var subscriptions = 2_000
    @Option(help: "Concurrent keep-alive clients")
    var concurrency = 32
    @Option(help: "Requests of each workload posted before the clock starts, not counted")
    var warmup = 1_000
    @Option(help: "Rounds, each workload's share in turn (receipts, then notifications)")
    var rounds = 4
    @Option(help: "GET /v1/users/{userId}/subscriptions requests under load")
    var reads = 10_000

    static let product = "pro.monthly"
    static let month: TimeInterval = 30 * 86_400

    func validate() throws {
        guard subscriptions > 0, renewals > 0, receipts > 0, rounds > 0 else {
            throw ValidationError("--subscriptions, --renewals, --receipts and --rounds must be above 0")
        }
    }

    func run() async throws {
        let logger = benchLogger
        let baseline = try BenchReceipts.parse(["--receipts", "\(receipts)", "--concurrency", "\(concurrency)", "--warmup", "\(warmup)"])
        try await options.withBenchDatabase { benchConfiguration in
            let work = try BenchServerChild.workDirectory("notifications")
            defer { try? FileManager.default.removeItem(at: work) }
            let (chain, rootFile) = try BenchReceipts.signingChain(in: work)
            let run = String(UUID().uuidString.prefix(6).lowercased())
            let (key, receiptBodies, startBodies) = try await withPostgresClient(benchConfiguration, logger: logger) { client in
                let database = Database(client: client, logger: logger)
                let key = try await APIKeyStore(database: database).create(name: "bench", scopes: [.admin])
                let ledger = OrderLedger(writer: LedgerWriter(database: database))
                let receipts = try await baseline.prepare(chain: chain, run: run, total: receipts + warmup, ledger: ledger)
                return (key, receipts, try await prepareStarts(chain: chain, run: run, ledger: ledger))
            }
            let renewalBodies = try prepareRenewals(chain: chain, run: run, total: renewals + warmup)

            let environment = ["LEDGER_APPLE_ROOT_CERTS": rootFile, "LEDGER_APPLE_BUNDLE_ID": BenchReceipts.bundleId, "LEDGER_APPLE_ENVIRONMENT": "Sandbox"]
            let (measured, peakRSS) = try await BenchServerChild.run(
                server: try options.serverPath(), database: benchConfiguration, work: work, environment: environment
            ) { client, base, server in
                // The subscriptions, bought through their start's receipt; then both warm-ups.
                let (_, started) = try await baseline.post(startBodies, client: client, base: base, key: key)
                guard started == ["matched": subscriptions] else {
                    throw BenchFailure("the subscriptions' starts were answered \(started), not matched to their orders")
                }
                _ = try await baseline.post(Array(receiptBodies.prefix(warmup)), client: client, base: base, key: key)
                _ = try await post(Array(renewalBodies.prefix(warmup)), client: client, base: base)
                var receiptRuns: [LatencySummary] = []
                var renewalRuns: [LatencySummary] = []
                var (receiptCost, renewalCost) = (RequestCost(), RequestCost())
                var outcomes: [String: Int] = [:]
                for round in 0..<rounds {
                    let receiptShare = slice(Array(receiptBodies.dropFirst(warmup)), round)
                    let start = ContinuousClock.now
                    let (latencies, _) = try await receiptCost.measure(server: server) {
                        try await baseline.post(receiptShare, client: client, base: base, key: key)
                    }
                    receiptRuns.append(LatencySummary(operations: latencies.count, seconds: (ContinuousClock.now - start).inSeconds, latencies: latencies))
                    let renewalShare = slice(Array(renewalBodies.dropFirst(warmup)), round)
                    let renewalStart = ContinuousClock.now
                    let (renewalLatencies, renewalOutcomes) = try await renewalCost.measure(server: server) {
                        try await post(renewalShare, client: client, base: base)
                    }
                    renewalRuns.append(LatencySummary(
                        operations: renewalLatencies.count, seconds: (ContinuousClock.now - renewalStart).inSeconds, latencies: renewalLatencies))
                    outcomes.merge(renewalOutcomes, uniquingKeysWith: +)
                }
                let reading = try await read(client: client, base: base, key: key)
                return ((receiptRuns, receiptCost), (renewalRuns, renewalCost), outcomes, started, reading)
            }
            let ((receiptRounds, receiptCost), (renewalRounds, renewalCost), outcomes, started, reading) = measured
            let (receiptSummary, renewalSummary) = (LatencySummary(combining: receiptRounds), LatencySummary(combining: renewalRounds))
            print("Subscription renewals through POST /v1/notifications/apple (DID_RENEW with its signed transaction and renewal info, \(concurrency) keep-alive clients, \(renewals) notifications after \(warmup) for warm-up, each a new period of one of \(subscriptions) subscriptions bought through receipts: \(started.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))), against `bench receipts` in the same server, \(rounds) alternating rounds")
            printTableHeader(
                ["workload", "requests/s", "p50 ms", "p99 ms", "ratio to receipts", "server CPU µs/request", "PostgreSQL CPU µs/request",
                 "busy CPU µs/request", "idle %", "outcomes"],
                leftAligned: [0, 9])
            printTableRow(["receipts"] + receiptSummary.cells + ["1.00"] + receiptCost.cells(per: receiptSummary.operations) + [""])
            let outcomeText = outcomes.sorted { $0.key < $1.key }.map { "\($0.key): \($0.value)" }.joined(separator: ", ")
            printTableRow(
                ["renewal notifications"] + renewalSummary.cells + [format(renewalSummary.ratio(to: receiptSummary), decimals: 2)]
                    + renewalCost.cells(per: renewalSummary.operations) + [outcomeText])
            print("By round (requests/s, receipts then renewals): "
                + zip(receiptRounds, renewalRounds).map { "\(format($0.perSecond)) / \(format($1.perSecond))" }.joined(separator: " · "))
            print("")
            if let reading {
                print("GET /v1/users/{userId}/subscriptions under load (\(concurrency) keep-alive clients, \(reading.operations) requests)")
                printTableHeader(["requests/s", "p50 ms", "p99 ms"])
                printTableRow(reading.cells)
            } else {
                print("GET /v1/users/{userId}/subscriptions: route not available (404)")
            }
            print("server peak RSS MB: \(format(Double(peakRSS) / 1024, decimals: 1))")
        }
    }

    /// Round `round`'s share of `bodies`.
    func slice(_ bodies: [String], _ round: Int) -> [String] {
        let size = (bodies.count + rounds - 1) / rounds
        return Array(bodies.dropFirst(round * size).prefix(size))
    }

    static func user(_ subscription: Int) -> String { "sub-user-\(subscription % 500)" }

    /// Subscription `index`'s start transaction id (its `originalTransactionId`).
    static func original(_ run: String, _ index: Int) -> String { "\(run)s\(index)" }

    static let started = Date(timeIntervalSinceNow: -3 * 365 * 86_400)

    /// Period `period` (0: the start) of subscription `index`, as Apple signs it.
    static func transaction(run: String, subscription index: Int, period: Int) -> SignedTransactionPayload {
        let original = Self.original(run, index)
        let purchased = started.addingTimeInterval(Double(period) * month)
        var payload = SignedTransactionPayload(
            transactionId: period == 0 ? original : "\(original)r\(period)", originalTransactionId: original, bundleId: BenchReceipts.bundleId,
            productId: product, purchaseDate: purchased.millisecondsSince1970, signedDate: Date().millisecondsSince1970,
            environment: "Sandbox", price: 9_990, currency: "USD")
        payload.type = "Auto-Renewable Subscription"
        payload.expiresDate = purchased.addingTimeInterval(month).millisecondsSince1970
        payload.webOrderLineItemId = "\(original)-\(period)"
        payload.transactionReason = period == 0 ? "PURCHASE" : "RENEWAL"
        payload.subscriptionGroupIdentifier = "bench-group"
        return payload
    }

    /// An open order per subscription and the receipt of its start, signed beforehand. The
    /// orders are of the ledger's history, created when the subscriptions were bought: a purchase
    /// older than its order never pays it (issue 41's guard).
    func prepareStarts(chain: ThrowawaySigningChain, run: String, ledger: OrderLedger) async throws -> [String] {
        var bodies: [String] = []
        for index in 0..<subscriptions {
            let orderID = "bench-\(run)-sub-\(index)"
            _ = try await ledger.create(
                try OrderID(orderID),
                OrderCreated(
                    userId: try UserID(Self.user(index)), productId: try ProductID(Self.product), price: "9.99", currency: "USD",
                    createdAt: Self.started),
                tokenGiven: false, metadata: Data("{}".utf8))
            let jws = try chain.sign(Self.transaction(run: run, subscription: index, period: 0))
            bodies.append(#"{"userId":"\#(Self.user(index))","orderId":"\#(orderID)","signedTransaction":"\#(jws)"}"#)
        }
        return bodies
    }

    /// `total` DID_RENEW notifications, the subscriptions in turn, each a period after the last,
    /// each with its transaction and renewal info signed, as Apple sends them.
    func prepareRenewals(chain: ThrowawaySigningChain, run: String, total: Int) throws -> [String] {
        try (0..<total).map { index in
            let transaction = Self.transaction(run: run, subscription: index % subscriptions, period: index / subscriptions + 1)
            let renewal = SignedRenewalInfoPayload(
                originalTransactionId: transaction.originalTransactionId, autoRenewProductId: Self.product, productId: Self.product,
                renewalDate: transaction.expiresDate, environment: "Sandbox", signedDate: Date().millisecondsSince1970)
            let notification = SignedNotificationPayload(
                notificationType: "DID_RENEW", notificationUUID: UUID().uuidString.lowercased(), signedDate: Date().millisecondsSince1970,
                data: .init(
                    bundleId: BenchReceipts.bundleId, environment: "Sandbox", signedTransactionInfo: try chain.sign(transaction),
                    signedRenewalInfo: try chain.sign(renewal)))
            return #"{"signedPayload":"\#(try chain.sign(notification))"}"#
        }
    }

    /// Posts `bodies` to the notification route from `concurrency` clients; answers the latencies
    /// of the answers that recorded the notification, and the count of each outcome (the type of
    /// the event it recorded, `repeated`, or the HTTP status).
    func post(_ bodies: [String], client: HTTPClient, base: String) async throws -> ([Double], [String: Int]) {
        try await load(bodies.count, client: client) { index in
            var request = HTTPClientRequest(url: base + "/v1/notifications/apple")
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: bodies[index]))
            return request
        } outcome: { status, answer in
            guard status == 200 else { return "HTTP \(status)" }
            guard answer.contains(#""applied":true"#) else { return "repeated" }
            guard let start = answer.range(of: #""type":""#)?.upperBound, let end = answer[start...].firstIndex(of: "\"") else { return "?" }
            return String(answer[start..<end])
        }
    }

    /// `reads` requests for the subscriptions of the users who hold them; nil when the route
    /// answers 404 (a ledger without it).
    func read(client: HTTPClient, base: String, key: String) async throws -> LatencySummary? {
        let subscriptions = subscriptions
        @Sendable func request(_ index: Int) -> HTTPClientRequest {
            var request = HTTPClientRequest(url: base + "/v1/users/\(Self.user(index % subscriptions))/subscriptions")
            request.headers.add(name: "Authorization", value: "Bearer \(key)")
            return request
        }
        let probe = try await client.execute(request(0), timeout: .seconds(30))
        _ = try await probe.body.collect(upTo: 1 << 24)
        guard probe.status.code != 404 else { return nil }
        let start = ContinuousClock.now
        let (latencies, outcomes) = try await load(reads, client: client, request: request) { status, _ in status == 200 ? "ok" : "HTTP \(status)" }
        guard outcomes.keys.allSatisfy({ $0 == "ok" }) else { throw BenchFailure("GET /v1/users/{userId}/subscriptions answered \(outcomes)") }
        return LatencySummary(operations: latencies.count, seconds: (ContinuousClock.now - start).inSeconds, latencies: latencies)
    }

    /// `count` requests from `concurrency` clients; the latencies (ms) of those whose outcome is
    /// not an HTTP status, and the count of each outcome.
    func load(
        _ count: Int, client: HTTPClient, request: @escaping @Sendable (Int) -> HTTPClientRequest,
        outcome: @escaping @Sendable (_ status: UInt, _ answer: String) -> String
    ) async throws -> ([Double], [String: Int]) {
        let concurrency = concurrency
        return try await withThrowingTaskGroup(of: ([Double], [String: Int]).self) { group in
            for worker in 0..<concurrency {
                group.addTask {
                    var latencies: [Double] = []
                    var outcomes: [String: Int] = [:]
                    for index in stride(from: worker, to: count, by: concurrency) {
                        let started = ContinuousClock.now
                        let response = try await client.execute(request(index), timeout: .seconds(30))
                        let body = try await response.body.collect(upTo: 1 << 24)
                        let took = ContinuousClock.now - started
                        let result = outcome(UInt(response.status.code), String(buffer: body))
                        outcomes[result, default: 0] += 1
                        if !result.hasPrefix("HTTP ") { latencies.append(took.inSeconds * 1000) }
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

