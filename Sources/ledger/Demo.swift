import AppleReceipts
import AppStoreStandIn
import ArgumentParser
import AsyncHTTPClient
import Foundation
import LedgerCore
import LedgerJSON
import LedgerServer
import LedgerServices
import LedgerStore
import Logging
import NIOCore
import PostgresNIO
import PrivatePostgres
import ServiceLifecycle

/// `ledger demo`: the whole ledger in one command, on a private database of its own. Starts the
/// service in-process, trusting a signing chain made for this run only and asking a stand-in App
/// Store Server API of its own, plays users and StoreKit-like clients over HTTP (lost order ids,
/// several open orders, re-uploads, replayed events, a retired product, a client deleted before
/// it uploads), runs the reconciler and a history sweep, and prints what happened and the report.
struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run a self-contained simulation against an in-process ledger and print the reconciliation report.")

    @Option(help: "Private cluster directory for the demo") var dataDir = "./.ledger-demo"
    @Option(help: "Simulated users") var users = 40
    @Option(help: "Share of purchases whose order id StoreKit loses (0 to 1)") var lostRate = 0.3
    @Option(help: "Random seed: the same seed plays the same story") var seed: UInt64 = 1
    @Flag(help: "Keep the database running after the demo until Enter is pressed (to explore it with psql)") var explore = false

    static let bundleId = "com.example.ledger-demo"
    static let database = "ledger_demo"

    func run() async throws {
        guard (0...1).contains(lostRate) else { throw CommandFailure("--lost-rate must be from 0 to 1") }
        var quiet = Logger(label: "ledger-demo")
        quiet.logLevel = .error
        let logger = quiet
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .error
            return handler
        }
        let opened = try await OpenedDatabase.open(.privateCluster(dataDirectory: dataDir), logger: logger)
        defer { try? opened.close(logger: logger) }
        var demoDatabase = opened.clientConfiguration
        demoDatabase.database = Self.database
        var demoProbe = opened.connectionConfiguration
        demoProbe.database = Self.database
        try await resetDatabase(Self.database, on: opened.clientConfiguration, logger: logger)

        // The throwaway "Apple": trusted by this process's server only.
        let chain = try ThrowawaySigningChain(name: "Order Ledger demo")
        let rootFile = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-demo-root-\(getpid()).pem").path
        try chain.rootPEM().write(toFile: rootFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: rootFile) }

        // The throwaway App Store Server API, which knows every Apple account's purchases.
        let standIn = AppStoreServerStandIn(bundleID: Self.bundleId)
        let keyFile = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-demo-key-\(getpid()).p8").path
        try standIn.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: keyFile) }

        var configuration = LedgerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = try ProcessRunner.freeLocalPort()
        configuration.apple.rootCertificateFiles = [rootFile]
        configuration.apple.bundleID = Self.bundleId
        configuration.apple.environments = [.sandbox]
        configuration.apple.apiKeyID = AppStoreServerStandIn.keyID
        configuration.apple.apiIssuerID = AppStoreServerStandIn.issuerID
        configuration.apple.apiPrivateKeyFile = keyFile
        configuration.reconcileInterval = 0
        configuration.recoveryInterval = 0
        // The demo's purchases are all made before its one pass and its one sweep: nothing left
        // to settle, every open order due.
        configuration.reconciler.settle = 0
        configuration.recoveryAfter = 0
        // Consumption answers on (the demo's terms obtain consent), made every second; the demo
        // runs its notification backfill itself, and no refund catch-up.
        configuration.appleCalls.consumption = true
        configuration.appleCallsInterval = 1
        configuration.backfillNotificationsAtStart = false
        configuration.refundCatchUpInterval = 0
        let settings = configuration
        let (seed, users, lostRate, database, probe) = (seed, users, lostRate, demoDatabase, demoProbe)
        try await standIn.run { apiURL in
            var configuration = settings
            configuration.apple.apiURL = apiURL
            try await Self.serveAndPlay(
                configuration, database: database, probing: probe, chain: chain, standIn: standIn, seed: seed, users: users, lostRate: lostRate, logger: logger)
        }
        let psql = opened.privateCluster.map { _ in PrivateCluster(directory: dataDir).psqlCommand(database: Self.database) } ?? "psql"
        if explore {
            print("Explore the data while this waits (Enter stops the database): \(psql)")
            _ = readLine()
        } else {
            print("The data stays in \(dataDir). To explore it: ledger demo --explore --seed \(seed) (or start the cluster with `ledger serve --data-dir \(dataDir)`), then: \(psql)")
        }
    }
}

extension Demo {
    /// Serves the ledger in-process on `configuration` while the story plays against it.
    static func serveAndPlay(
        _ configuration: LedgerConfiguration, database demoDatabase: PostgresClient.Configuration,
        probing: PostgresConnection.Configuration, chain: ThrowawaySigningChain,
        standIn: AppStoreServerStandIn, seed: UInt64, users: Int, lostRate: Double, logger: Logger
    ) async throws {
        let client = PostgresClient(configuration: demoDatabase, backgroundLogger: logger)
        let application = try buildApplication(configuration: configuration, client: client, probing: probing, logger: logger)
        let group = ServiceGroup(configuration: .init(services: [application], gracefulShutdownSignals: [], logger: logger))
        let server = Task { try await group.run() }

        let base = "http://127.0.0.1:\(configuration.port)"
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        let played: Result<Void, any Error>
        do {
            try await Self.waitUntilReady(http, base)
            let key = try await withPostgresClient(demoDatabase, logger: logger) { client in
                try await APIKeyStore(database: Database(client: client, logger: logger)).create(name: "demo", scopes: [.admin])
            }
            var story = DemoStory(http: http, base: base, key: key, chain: chain, standIn: standIn, seed: seed, lostRate: lostRate)
            try await story.play(users: users)
            try await story.answerConsumptionRequest()
            try await story.prepareMissedNotification()
            let backfill = ServiceAssembly(database: Database(client: client, logger: logger)).notificationBackfill(
                api: LazyAppStoreServerAPI(settings: try configuration.requiredAppStoreServerAPI(), logger: logger),
                verifier: try configuration.apple.verifier(logger: logger))
            story.backfill = try await backfill.run(since: Date(timeIntervalSinceNow: -3600))
            print(story.summary)
            let csv = try await story.request("GET", "/v1/reports/reconciliation", accept: "text/csv")
            print("\nReconciliation report (CSV):\n\(csv)")
            played = .success(())
        } catch {
            played = .failure(error)
        }
        // Stopped the same way whether the story ran to its end or not.
        try? await http.shutdown()
        await group.triggerGracefulShutdown()
        _ = try? await server.value
        try played.get()
    }

    /// Waits (30 s at most) for the demo's server to answer `/readyz` with 200.
    static func waitUntilReady(_ client: HTTPClient, _ base: String) async throws {
        for _ in 0..<300 {
            if let response = try? await client.execute(HTTPClientRequest(url: base + "/readyz"), timeout: .seconds(2)), response.status == .ok {
                return
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        throw CommandFailure("the demo's server did not become ready within 30 s")
    }
}

/// The simulated population: users, their orders and their StoreKit clients.
struct DemoStory {
    let http: HTTPClient
    let base: String
    let key: String
    let chain: ThrowawaySigningChain
    let standIn: AppStoreServerStandIn
    var random: DemoRandom
    let lostRate: Double
    var counts: [String: Int] = [:]
    var reconcile: [String: Any] = [:]
    var recovery: [String: Any] = [:]
    /// Delivered purchases: one gets a consumption request, one a refund the ledger misses.
    var delivered: [Pending] = []
    var consumption: [String: Any] = [:]
    var consumptionSent: String?
    var backfill: NotificationBackfill.Summary?
    var missedRefundOrder: String?
    /// Each Apple account's purchases, as Apple's transaction history lists them.
    var histories: [String: [String]] = [:]

    init(http: HTTPClient, base: String, key: String, chain: ThrowawaySigningChain, standIn: AppStoreServerStandIn, seed: UInt64, lostRate: Double) {
        self.http = http
        self.base = base
        self.key = key
        self.chain = chain
        self.standIn = standIn
        self.random = DemoRandom(seed: seed)
        self.lostRate = lostRate
    }

    /// One transaction a client holds until the backend says it may finish it.
    struct Pending {
        let transactionId: String
        let orderId: String
        let user: String
        let jws: String
        let lost: Bool
        let payload: SignedTransactionPayload
    }

    mutating func play(users: Int) async throws {
        _ = try await request("PUT", "/v1/products/gems.100", body: #"{"price":"0.99","currency":"USD"}"#)
        _ = try await request("PUT", "/v1/products/gems.500", body: #"{"price":"4.99","currency":"USD"}"#)
        _ = try await request("PUT", "/v1/products/gems.legacy", body: #"{"status":"retired","price":"1.99","currency":"USD"}"#)
        var pending: [Pending] = []
        var transactionNumber = 0
        for userIndex in 0..<users {
            let user = "demo-user-\(userIndex)"
            let account = try await logIn(user, account: "demo-account-\(userIndex)")
            for purchase in 0..<random.int(1...3) {
                // Old clients of a removed product buy it without an order.
                let legacy = random.chance(0.05)
                let product = legacy ? "gems.legacy" : (random.chance(0.7) ? "gems.100" : "gems.500")
                let orderId = "\(user)-order-\(purchase)"
                let price = product == "gems.500" ? "4.99" : product == "gems.legacy" ? "1.99" : "0.99"
                var token: String?
                if !legacy {
                    let created = try await requestJSON("POST", "/v1/orders", body: #"{"orderId":"\#(orderId)","userId":"\#(user)","productId":"\#(product)","price":"\#(price)","currency":"USD"}"#)
                    token = created["appAccountToken"] as? String
                    count("orders created")
                    let queuedAt = Date()
                    _ = try await request("POST", "/v1/orders/\(orderId)/events", body: #"{"type":"payment-added","eventId":"\#(DemoRandom.uuid(userIndex, purchase))","data":{"queuedAt":"\#(EventCoding.formatDate(queuedAt))"}}"#)
                    // A retry of the same event: answered, never stored twice.
                    if random.chance(0.2) {
                        _ = try await request("POST", "/v1/orders/\(orderId)/events", body: #"{"type":"payment-added","eventId":"\#(DemoRandom.uuid(userIndex, purchase))","data":{"queuedAt":"\#(EventCoding.formatDate(queuedAt))"}}"#)
                        count("events replayed")
                    }
                    if random.chance(0.25) {
                        // An abandoned second order for the same product: the reconciler must choose.
                        _ = try await request("POST", "/v1/orders", body: #"{"orderId":"\#(orderId)-abandoned","userId":"\#(user)","productId":"\#(product)","price":"\#(price)","currency":"USD"}"#)
                        count("orders abandoned")
                    }
                }
                transactionNumber += 1
                let transactionId = String(100_000_000 + Int(random.seed % 1000) * 100_000 + transactionNumber)
                let lost = legacy || random.chance(lostRate)
                let purchaseDate = Date().addingTimeInterval(1)
                let payload = SignedTransactionPayload(
                    transactionId: transactionId, originalTransactionId: transactionId, bundleId: Demo.bundleId, productId: product,
                    purchaseDate: purchaseDate.millisecondsSince1970, signedDate: Date().millisecondsSince1970, environment: "Sandbox",
                    appAccountToken: lost ? nil : token, appTransactionId: account, price: product == "gems.500" ? 4990 : 990, currency: "USD")
                let jws = try chain.sign(payload)
                histories[account, default: []].append(jws)
                pending.append(Pending(transactionId: transactionId, orderId: orderId, user: user, jws: jws, lost: lost, payload: payload))
                if lost { count("order ids lost by StoreKit") }
            }
        }
        // A client pays and is deleted before it uploads: only Apple knows of the purchase.
        let deletedUser = "demo-user-deleted"
        let deletedAccount = try await logIn(deletedUser, account: "demo-account-deleted")
        let deletedOrder = "\(deletedUser)-order-0"
        let created = try await requestJSON("POST", "/v1/orders", body: #"{"orderId":"\#(deletedOrder)","userId":"\#(deletedUser)","productId":"gems.500","price":"4.99","currency":"USD"}"#)
        count("orders created")
        let paid = SignedTransactionPayload(
            transactionId: String(900_000_000 + Int(random.seed % 1000)), bundleId: Demo.bundleId, productId: "gems.500",
            purchaseDate: Date().millisecondsSince1970, signedDate: Date().millisecondsSince1970, environment: "Sandbox",
            appAccountToken: created["appAccountToken"] as? String, appTransactionId: deletedAccount, price: 4990, currency: "USD")
        histories[deletedAccount, default: []].append(try chain.sign(paid))
        count("clients deleted before uploading")
        // First launch: every client uploads what it holds; matched purchases are delivered.
        var still: [Pending] = []
        for item in pending {
            let answer = try await upload(item)
            count("first upload: \(answer["outcome"] as? String ?? "?")")
            if try await deliverIfMatched(answer) {
                if answer["state"] as? String == "verified" { delivered.append(item) }
                continue
            }
            still.append(item)
        }
        // A client that re-posts on every launch: the same proof, the same answer, nothing appended.
        for item in pending.prefix(5) {
            _ = try await upload(item)
            count("re-uploads of finished purchases")
        }
        reconcile = try await requestJSON("POST", "/v1/reconcile", body: "{}")
        // Support finds one of the reconciler's pairings wrong before it is delivered, and undoes it.
        for item in still where item.lost {
            let pool = try await requestJSON("GET", "/v1/transactions/unmatched?transactionId=\(item.transactionId)")
            guard (pool["transactions"] as? [Any])?.isEmpty == true else { continue }
            let undone = try await requestJSON(
                "POST", "/v1/transactions/\(item.transactionId)/unmatch", body: #"{"reason":"paired with the wrong character"}"#)
            if undone["orderId"] != nil { count("pairings undone by support") }
            break
        }
        // Next launch: the clients still holding transactions upload again; paired ones now match.
        for item in still {
            let answer = try await upload(item)
            count("second upload: \(answer["outcome"] as? String ?? "?")")
            _ = try await deliverIfMatched(answer)
        }
        // A history sweep asks Apple for the accounts of users with open orders: the deleted
        // client's purchase is found and tied to its order by its token; the rest is known.
        for (account, signed) in histories {
            await standIn.setHistory(account, [.init(revision: "\(account)-1", hasMore: false, signedTransactions: signed)])
        }
        recovery = try await requestJSON("POST", "/v1/recover", body: "{}")
        let recovered = try await requestJSON("GET", "/v1/orders/\(deletedOrder)")
        if recovered["state"] as? String == "verified" {
            _ = try await request("POST", "/v1/orders/\(deletedOrder)/events", body: #"{"type":"delivered","data":{}}"#)
            count("recovered orders delivered")
        }
    }

    /// A customer asks Apple to refund a delivered purchase: Apple's CONSUMPTION_REQUEST arrives,
    /// and the ledger answers it from what it knows (within a few seconds here).
    mutating func answerConsumptionRequest() async throws {
        guard let item = delivered.first else { return }
        _ = try await request("PUT", "/v1/products/gems.100", body: #"{"price":"0.99","currency":"USD","sampleContentProvided":false,"refundPreference":"DECLINE"}"#)
        _ = try await request("PUT", "/v1/products/gems.500", body: #"{"price":"4.99","currency":"USD","sampleContentProvided":false,"refundPreference":"DECLINE"}"#)
        let notification = try signedNotification("CONSUMPTION_REQUEST", transaction: item.jws, reason: "UNINTENDED_PURCHASE")
        _ = try await requestJSON("POST", "/v1/notifications/apple", body: #"{"signedPayload":"\#(notification)"}"#)
        for _ in 0..<100 {
            let order = try await requestJSON("GET", "/v1/orders/\(item.orderId)")
            if let answer = (order["events"] as? [[String: Any]])?.last, answer["type"] as? String == "consumption-answer" {
                consumption = answer["data"] as? [String: Any] ?? [:]
                break
            }
            try await Task.sleep(for: .milliseconds(100))
        }
        consumptionSent = await standIn.writes.first { $0.path.hasSuffix("/consumption/\(item.transactionId)") }?.body
        count("consumption requests answered")
    }

    /// Apple refunds another delivered purchase while the ledger is not listening: its
    /// notification is only in Apple's notification history, beside the one the ledger received.
    mutating func prepareMissedNotification() async throws {
        var history: [String] = []
        if let item = delivered.first { history.append(try signedNotification("CONSUMPTION_REQUEST", transaction: item.jws, reason: "UNINTENDED_PURCHASE")) }
        if delivered.count > 1 {
            let item = delivered[1]
            var payload = item.payload
            payload.revocationDate = Date().millisecondsSince1970
            payload.revocationReason = 0
            history.append(try signedNotification("REFUND", transaction: try chain.sign(payload), reason: nil))
            missedRefundOrder = item.orderId
        }
        await standIn.setNotifications([.init(revision: "demo-history-end", hasMore: false, signedTransactions: history)])
    }

    /// A notification as Apple signs it, about `transaction` (signed). The same one each time
    /// for the same type and transaction, as Apple's retries and its history are.
    func signedNotification(_ type: String, transaction: String, reason: String?) throws -> String {
        let uuid = EventID.named("demo-notification", type, transaction).uuid.uuidString.lowercased()
        return try chain.sign(SignedNotificationPayload(
            notificationType: type, notificationUUID: uuid, signedDate: Date().millisecondsSince1970,
            data: .init(bundleId: Demo.bundleId, environment: "Sandbox", signedTransactionInfo: transaction, consumptionRequestReason: reason)))
    }

    /// At login the app sends the signed AppTransaction naming the user's Apple account.
    mutating func logIn(_ user: String, account: String) async throws -> String {
        let signed = try chain.sign(SignedAppTransactionPayload(
            appTransactionId: account, bundleId: Demo.bundleId, receiptType: "Sandbox", receiptCreationDate: Date().millisecondsSince1970))
        let linked = try await requestJSON("POST", "/v1/users/\(user)/app-transaction", body: #"{"signedAppTransaction":"\#(signed)"}"#)
        count("Apple accounts linked at login: \(linked["outcome"] as? String ?? "?")")
        return account
    }

    mutating func upload(_ item: Pending) async throws -> [String: Any] {
        let orderPart = item.lost ? "" : #","orderId":"\#(item.orderId)""#
        return try await requestJSON("POST", "/v1/receipts", body: #"{"userId":"\#(item.user)"\#(orderPart),"signedTransaction":"\#(item.jws)"}"#)
    }

    /// The backend grants the goods of a matched, verified order; the client then finishes.
    mutating func deliverIfMatched(_ answer: [String: Any]) async throws -> Bool {
        guard answer["outcome"] as? String == "matched", let order = answer["orderId"] as? String else { return false }
        if answer["state"] as? String == "verified" {
            _ = try await request("POST", "/v1/orders/\(order)/events", body: #"{"type":"delivered","data":{}}"#)
            _ = try await request("POST", "/v1/orders/\(order)/events", body: #"{"type":"finished","data":{}}"#)
            count("orders delivered and finished")
        }
        return true
    }

    mutating func count(_ what: String) { counts[what, default: 0] += 1 }

    var summary: String {
        var lines = ["Demo: what the simulated clients did and saw"]
        for (what, n) in counts.sorted(by: { $0.key < $1.key }) { lines.append("  \(what): \(n)") }
        let rules = (reconcile["byRule"] as? [String: Int] ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        lines.append("Reconciler: paired \(reconcile["paired"] as? Int ?? 0) of \(reconcile["considered"] as? Int ?? 0) orphans (\(rules.isEmpty ? "none" : rules)), \(reconcile["ambiguous"] as? Int ?? 0) ambiguous, \(reconcile["unknownUser"] as? Int ?? 0) without a user")
        let found = (recovery["ingested"] as? [String: Int] ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        lines.append("History sweep: \(recovery["accounts"] as? Int ?? 0) Apple accounts, \(recovery["transactions"] as? Int ?? 0) transactions, \(recovery["known"] as? Int ?? 0) known; purchases no client sent: \(found.isEmpty ? "none" : found)")
        if consumption.isEmpty {
            lines.append("Consumption answer: none recorded")
        } else {
            lines.append("Consumption answer (order \(delivered.first?.orderId ?? "-")): \(consumption["outcome"] as? String ?? "?"), deliveryStatus \(consumption["deliveryStatus"] as? String ?? "?"); sent to Apple: \(consumptionSent ?? "nothing")")
        }
        if let backfill {
            lines.append("Notification backfill: \(backfill.notifications) in Apple's history, \(backfill.applied) new to the ledger, \(backfill.repeated) applied before\(missedRefundOrder.map { "; the missed REFUND refunded order \($0)" } ?? "")")
        }
        return lines.joined(separator: "\n")
    }

    func requestJSON(_ method: String, _ path: String, body: String? = nil) async throws -> [String: Any] {
        let text = try await request(method, path, body: body)
        return (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
    }

    func request(_ method: String, _ path: String, body: String? = nil, accept: String = "application/json") async throws -> String {
        var request = HTTPClientRequest(url: base + path)
        request.method = .init(rawValue: method)
        request.headers.add(name: "Authorization", value: "Bearer \(key)")
        request.headers.add(name: "Accept", value: accept)
        if let body {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: body))
        }
        let response = try await http.execute(request, timeout: .seconds(30))
        let text = String(buffer: try await response.body.collect(upTo: 16 << 20))
        guard response.status.code < 500 else { throw CommandFailure("\(method) \(path) answered \(response.status.code): \(text)") }
        return text
    }
}

/// A small deterministic generator (SplitMix64): the same seed, the same story.
struct DemoRandom {
    var state: UInt64
    let seed: UInt64
    init(seed: UInt64) {
        self.seed = seed
        self.state = seed &+ 0x9E37_79B9_7F4A_7C15
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func chance(_ probability: Double) -> Bool { Double(next() % 1_000_000) / 1_000_000 < probability }
    mutating func int(_ range: ClosedRange<Int>) -> Int { range.lowerBound + Int(next() % UInt64(range.count)) }

    /// A fixed event id per user and purchase, so a replay sends the same one.
    static func uuid(_ user: Int, _ purchase: Int) -> String {
        String(format: "00000000-0000-4000-8000-%06d%06d", user % 1_000_000, purchase % 1_000_000)
    }
}
