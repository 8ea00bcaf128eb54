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
/// service in-process, trusting a signing chain made for this run only and asking stand-in App
/// Store Server APIs of its own (Apple's production and sandbox hosts), and plays two apps over
/// HTTP: the configured one (both environments; users and StoreKit-like clients with lost order
/// ids, several open orders, re-uploads, replayed events, a retired product, a client deleted
/// before it uploads, and App Review's Sandbox purchase, granted and kept out of revenue) and a
/// second one added with `POST /v1/apps` and its own key. Runs the reconciler and a history
/// sweep, compares a day of Apple's sales report (a stand-in App Store Connect) with the ledger
/// and sweeps where Apple counted more, and prints what happened per app and the report.
struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run a self-contained simulation against an in-process ledger and print the reconciliation report.")

    @Option(help: "Private cluster directory for the demo") var dataDir = "./.ledger-demo"
    @Option(help: "Simulated users") var users = 40
    @Option(help: "Share of purchases whose order id StoreKit loses (0 to 1)") var lostRate = 0.3
    @Option(help: "Random seed: the same seed plays the same story") var seed: UInt64 = 1
    @Flag(help: "Keep the database running after the demo until Enter is pressed (to explore it with psql)") var explore = false

    static let bundleId = "com.example.ledger-demo"
    static let appAppleId: Int64 = 1_000_000_001
    /// The second app, added over HTTP while the ledger runs.
    static let secondBundleId = "com.example.ledger-demo.puzzle"
    static let secondAppAppleId: Int64 = 1_000_000_002
    static let database = "ledger_demo"

    func run() async throws {
        guard (0...1).contains(lostRate) else { throw ValidationError("--lost-rate must be from 0 to 1") }
        guard users >= 1 else { throw ValidationError("--users must be at least 1") }
        var quiet = Logger(label: "ledger-demo")
        quiet.logLevel = .error
        let logger = quiet
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .error
            return handler
        }
        let progress = DemoProgress()
        let watcher = progress.watch()
        defer { watcher.cancel() }
        progress.enter("starting its private PostgreSQL")
        let opened = try await OpenedDatabase.open(.privateCluster(dataDirectory: dataDir), logger: logger)
        defer {
            progress.enter("stopping its private PostgreSQL")
            try? opened.close(logger: logger)
        }
        progress.enter("preparing its database")
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

        // The throwaway App Store Server API, which knows every Apple account's purchases: a
        // production host and a sandbox host, each serving both apps (each with its own key).
        let standIn = AppStoreServerStandIn(bundleID: Self.bundleId, environment: "Production")
        let second = AppStoreServerStandIn(bundleID: Self.secondBundleId, environment: "Production")
        let sandboxes = [try standIn.twin(in: "Sandbox"), try second.twin(in: "Sandbox")]
        let keyFile = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-demo-key-\(getpid()).p8").path
        try standIn.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: keyFile) }

        var configuration = LedgerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = try ProcessRunner.freeLocalPort()
        configuration.apple.rootCertificateFiles = [rootFile]
        configuration.apple.bundleID = Self.bundleId
        // Production and Sandbox, as a shipped app's ledger: App Review buys in the sandbox.
        configuration.apple.appID = Self.appAppleId
        configuration.apple.environments = [.production, .sandbox]
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
        progress.enter("starting its Apple stand-ins")
        try await AppStoreServerStandIn.run([standIn, second]) { productionURL in
            try await AppStoreServerStandIn.run(sandboxes) { sandboxURL in
                var configuration = settings
                configuration.apple.apiURL = productionURL
                configuration.apple.apiSandboxURL = sandboxURL
                try await Self.serveAndPlay(
                    configuration, database: database, probing: probe, chain: chain, standIn: standIn, second: second,
                    sandboxes: sandboxes, seed: seed, users: users, lostRate: lostRate, progress: progress, logger: logger)
            }
        }
        let psql = opened.privateCluster.map { _ in PrivateCluster(directory: dataDir).psqlCommand(database: Self.database) } ?? "psql"
        if explore {
            progress.enter(nil)
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
        probing: PostgresConnection.Configuration, chain: ThrowawaySigningChain, standIn: AppStoreServerStandIn,
        second: AppStoreServerStandIn, sandboxes: [AppStoreServerStandIn], seed: UInt64, users: Int, lostRate: Double,
        progress: DemoProgress, logger: Logger
    ) async throws {
        progress.enter("starting the ledger's server")
        let client = PostgresClient(configuration: demoDatabase, backgroundLogger: logger)
        let application = try buildApplication(configuration: configuration, client: client, probing: probing, logger: logger)
        let group = ServiceGroup(configuration: .init(services: [application], gracefulShutdownSignals: [], logger: logger))
        let server = Task { try await group.run() }

        let base = "http://127.0.0.1:\(configuration.port)"
        let http = HTTPClient(eventLoopGroupProvider: .singleton)
        let played: Result<Void, any Error>
        do {
            try await Self.waitUntilReady(http, base)
            progress.enter("making an API key")
            let key = try await withPostgresClient(demoDatabase, logger: logger) { client in
                try await APIKeyStore(database: Database(client: client, logger: logger)).create(name: "demo", scopes: [.admin])
            }
            var story = DemoStory(
                http: http, base: base, key: key, chain: chain, standIn: standIn, second: second, seed: seed, lostRate: lostRate)
            let orders = ServiceAssembly(database: Database(client: client, logger: logger)).orders
            story.history = { id, order in
                try await orders.create(id, order, tokenGiven: false, metadata: Data(#"{"actor":"demo: the team's earlier backend"}"#.utf8)).order
            }
            progress.enter("adding the second app")
            try await story.addSecondApp()
            progress.enter("importing the team's history")
            try await story.importHistory()
            progress.enter("playing the users' purchases")
            try await story.play(users: users)
            progress.enter("playing App Review's purchase")
            try await story.playAppReview()
            progress.enter("playing the subscription")
            try await story.playSubscription()
            progress.enter("answering a consumption request")
            try await story.answerConsumptionRequest()
            progress.enter("preparing a missed notification")
            try await story.prepareMissedNotification()
            // Every app's backfill in every environment it accepts, each with its app's key.
            progress.enter("backfilling notifications")
            let database = Database(client: client, logger: logger)
            let apps = AppDirectory(catalog: AppCatalog(database: database), maximumAge: .seconds(configuration.appsMaximumAge), logger: logger)
            let backfills = try await ServiceAssembly(database: database).notificationBackfills(
                api: LazyAppStoreServerAPI(catalog: AppCatalog(database: database), hosts: configuration.apple.appStoreServerAPIHosts(), logger: logger),
                verifier: try configuration.apple.verifier(logger: logger).choosingApps(from: apps))
            var backfilled = NotificationBackfill.Summary()
            for backfill in backfills {
                let summary = try await backfill.run(since: Date(timeIntervalSinceNow: -3600))
                backfilled.notifications += summary.notifications
                backfilled.applied += summary.applied
                backfilled.repeated += summary.repeated
            }
            story.backfill = backfilled
            progress.enter("comparing Apple's sales report")
            try await Self.playSales(&story, configuration: configuration, services: ServiceAssembly(database: database), logger: logger)
            progress.enter("reading the reconciliation report")
            story.report = try await story.requestJSON("GET", "/v1/reports/reconciliation")
            var secondKey = (asked: 0, refused: 0)
            for host in [second, sandboxes[1]] {
                secondKey.asked += await host.requests
                secondKey.refused += await host.refusedTokens
            }
            story.secondAppCalls = secondKey
            print(story.summary)
            let csv = try await story.request("GET", "/v1/reports/reconciliation", accept: "text/csv")
            print("\nReconciliation report (CSV):\n\(csv)")
            played = .success(())
        } catch {
            played = .failure(error)
        }
        // Stopped the same way whether the story ran to its end or not.
        progress.enter("stopping the ledger's server")
        try? await http.shutdown()
        await group.triggerGracefulShutdown()
        _ = try? await server.value
        progress.enter("stopping its Apple stand-ins")
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
    /// The configured app's production host, and the second app's.
    let standIn: AppStoreServerStandIn
    let second: AppStoreServerStandIn
    var random: DemoRandom
    let lostRate: Double
    /// What happened, per app (the app `app` names while it plays).
    var counts: [String: [String: Int]] = [:]
    var app = Demo.bundleId
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
    var secondHistories: [String: [String]] = [:]
    /// App Review's purchase: its transaction, its order, and the order's answer after delivery.
    var review: (transactionId: String, orderId: String, order: [String: Any])?
    /// The reconciliation report (JSON) at the end.
    var report: [String: Any] = [:]
    /// Requests the second app's hosts took, and how many of their tokens they refused.
    var secondAppCalls = (asked: 0, refused: 0)
    /// The subscriber's story, as the summary prints it.
    var subscriptionSummary: [String] = []
    /// The imported history and the replayed purchase, as the summary prints them.
    var historySummary: [String] = []
    /// Apple's sales report beside the ledger, the shortfall's sweep, as the summary prints them.
    var salesSummary: [String] = []
    /// Records an order of the team's history: one its earlier backend created at `createdAt`,
    /// before the ledger served the app (the subscriber's, bought months ago).
    var history: @Sendable (_ id: OrderID, _ order: OrderCreated) async throws -> Order = { _, _ in throw CommandFailure("no history") }

    init(
        http: HTTPClient, base: String, key: String, chain: ThrowawaySigningChain, standIn: AppStoreServerStandIn,
        second: AppStoreServerStandIn, seed: UInt64, lostRate: Double
    ) {
        self.http = http
        self.base = base
        self.key = key
        self.chain = chain
        self.standIn = standIn
        self.second = second
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
        var app = Demo.bundleId
    }

    /// Adds the second app over HTTP, as an operator would (`POST /v1/apps`): both environments,
    /// its Apple id, and its own App Store Server API key (tokens with its bundle id as `bid`).
    mutating func addSecondApp() async throws {
        let body: [String: Any] = [
            "bundleId": Demo.secondBundleId, "appAppleId": Demo.secondAppAppleId, "environments": ["Production", "Sandbox"],
            "apiKey": ["issuerId": AppStoreServerStandIn.issuerID, "keyId": AppStoreServerStandIn.keyID, "privateKey": second.privateKeyPEM],
        ]
        let added = try await requestJSON("POST", "/v1/apps", body: String(decoding: try JSONSerialization.data(withJSONObject: body), as: UTF8.self))
        guard added["bundleId"] as? String == Demo.secondBundleId else { throw CommandFailure("POST /v1/apps did not add the second app: \(added)") }
        count("added over POST /v1/apps with its own API key", in: Demo.secondBundleId)
    }

    /// `POST /v1/orders` of `app`: with two apps in the ledger, every order names its app.
    func orderBody(_ orderId: String, _ user: String, _ product: String, _ price: String, app: String = Demo.bundleId) -> String {
        #"{"orderId":"\#(orderId)","userId":"\#(user)","productId":"\#(product)","price":"\#(price)","currency":"USD","bundleId":"\#(app)"}"#
    }

    mutating func play(users: Int) async throws {
        _ = try await request("PUT", "/v1/products/gems.100", body: #"{"price":"0.99","currency":"USD","bundleId":"\#(Demo.bundleId)"}"#)
        _ = try await request("PUT", "/v1/products/gems.500", body: #"{"price":"4.99","currency":"USD","bundleId":"\#(Demo.bundleId)"}"#)
        _ = try await request("PUT", "/v1/products/gems.legacy", body: #"{"status":"retired","price":"1.99","currency":"USD","bundleId":"\#(Demo.bundleId)"}"#)
        _ = try await request("PUT", "/v1/products/hints.10", body: #"{"price":"1.99","currency":"USD","bundleId":"\#(Demo.secondBundleId)"}"#)
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
                    let created = try await requestJSON("POST", "/v1/orders", body: orderBody(orderId, user, product, price))
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
                        _ = try await request("POST", "/v1/orders", body: orderBody("\(orderId)-abandoned", user, product, price))
                        count("orders abandoned")
                    }
                }
                transactionNumber += 1
                let transactionId = String(100_000_000 + Int(random.seed % 1000) * 100_000 + transactionNumber)
                let lost = legacy || random.chance(lostRate)
                let purchaseDate = Date().addingTimeInterval(1)
                let payload = SignedTransactionPayload(
                    transactionId: transactionId, originalTransactionId: transactionId, bundleId: Demo.bundleId, productId: product,
                    purchaseDate: purchaseDate.millisecondsSince1970, signedDate: Date().millisecondsSince1970, environment: "Production",
                    appAccountToken: lost ? nil : token, appTransactionId: account, price: product == "gems.500" ? 4990 : 990, currency: "USD")
                let jws = try chain.sign(payload)
                histories[account, default: []].append(jws)
                pending.append(Pending(transactionId: transactionId, orderId: orderId, user: user, jws: jws, lost: lost, payload: payload))
                if lost { count("order ids lost by StoreKit") }
            }
        }
        pending += try await playSecondApp(users: max(2, users / 4))
        // A client pays and is deleted before it uploads: only Apple knows of the purchase.
        let deletedUser = "demo-user-deleted"
        let deletedAccount = try await logIn(deletedUser, account: "demo-account-deleted")
        let deletedOrder = "\(deletedUser)-order-0"
        let created = try await requestJSON("POST", "/v1/orders", body: orderBody(deletedOrder, deletedUser, "gems.500", "4.99"))
        count("orders created")
        let paid = SignedTransactionPayload(
            transactionId: String(900_000_000 + Int(random.seed % 1000)), bundleId: Demo.bundleId, productId: "gems.500",
            purchaseDate: Date().millisecondsSince1970, signedDate: Date().millisecondsSince1970, environment: "Production",
            appAccountToken: created["appAccountToken"] as? String, appTransactionId: deletedAccount, price: 4990, currency: "USD")
        histories[deletedAccount, default: []].append(try chain.sign(paid))
        count("clients deleted before uploading")
        // First launch: every client uploads what it holds; matched purchases are delivered.
        var still: [Pending] = []
        for item in pending {
            app = item.app
            let answer = try await upload(item)
            count("first upload: \(answer["outcome"] as? String ?? "?")")
            if try await deliverIfMatched(answer) {
                if answer["state"] as? String == "verified", item.app == Demo.bundleId { delivered.append(item) }
                continue
            }
            still.append(item)
        }
        // A client that re-posts on every launch: the same proof, the same answer, nothing appended.
        for item in pending.prefix(5) {
            app = item.app
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
            if undone["orderId"] != nil { count("pairings undone by support", in: item.app) }
            break
        }
        // Next launch: the clients still holding transactions upload again; paired ones now match.
        for item in still {
            app = item.app
            let answer = try await upload(item)
            count("second upload: \(answer["outcome"] as? String ?? "?")")
            _ = try await deliverIfMatched(answer)
        }
        // A history sweep asks Apple for the accounts of users with open orders: the deleted
        // client's purchase is found and tied to its order by its token; the rest is known.
        for (account, signed) in histories {
            await standIn.setHistory(account, [.init(revision: "\(account)-1", hasMore: false, signedTransactions: signed)])
        }
        for (account, signed) in secondHistories {
            await second.setHistory(account, [.init(revision: "\(account)-1", hasMore: false, signedTransactions: signed)])
        }
        app = Demo.bundleId
        recovery = try await requestJSON("POST", "/v1/recover", body: "{}")
        let recovered = try await requestJSON("GET", "/v1/orders/\(deletedOrder)")
        if recovered["state"] as? String == "verified" {
            _ = try await request("POST", "/v1/orders/\(deletedOrder)/events", body: #"{"type":"delivered","data":{}}"#)
            count("recovered orders delivered")
        }
    }

    /// The second app's customers: each logs in and buys hints once or twice, Production-signed;
    /// some order ids are lost, for the reconciler to pair within this app. Returns the
    /// purchases their clients hold, to upload with the first app's.
    mutating func playSecondApp(users: Int) async throws -> [Pending] {
        app = Demo.secondBundleId
        defer { app = Demo.bundleId }
        var pending: [Pending] = []
        var transactionNumber = 0
        for userIndex in 0..<users {
            let user = "puzzle-user-\(userIndex)"
            let account = try await logIn(user, account: "puzzle-account-\(userIndex)", app: Demo.secondBundleId, appAppleId: Demo.secondAppAppleId)
            for purchase in 0..<random.int(1...2) {
                let orderId = "\(user)-order-\(purchase)"
                let created = try await requestJSON("POST", "/v1/orders", body: orderBody(orderId, user, "hints.10", "1.99", app: Demo.secondBundleId))
                count("orders created")
                transactionNumber += 1
                let transactionId = String(200_000_000 + Int(random.seed % 1000) * 100_000 + transactionNumber)
                let lost = random.chance(lostRate)
                let payload = SignedTransactionPayload(
                    transactionId: transactionId, originalTransactionId: transactionId, bundleId: Demo.secondBundleId, productId: "hints.10",
                    purchaseDate: Date().addingTimeInterval(1).millisecondsSince1970, signedDate: Date().millisecondsSince1970,
                    environment: "Production", appAccountToken: lost ? nil : created["appAccountToken"] as? String, appTransactionId: account,
                    price: 1990, currency: "USD")
                let jws = try chain.sign(payload)
                secondHistories[account, default: []].append(jws)
                pending.append(Pending(
                    transactionId: transactionId, orderId: orderId, user: user, jws: jws, lost: lost, payload: payload, app: Demo.secondBundleId))
                if lost { count("order ids lost by StoreKit") }
            }
        }
        return pending
    }

    /// App Review buys in the sandbox against the production build, which talks to this
    /// (production) ledger: the reviewer's Sandbox-signed purchase is granted like any other,
    /// and the reports keep it out of revenue (`sandboxTotals`, never `totals`).
    mutating func playAppReview() async throws {
        app = Demo.bundleId
        let (user, orderId) = ("app-reviewer", "app-review-order-0")
        let created = try await requestJSON("POST", "/v1/orders", body: orderBody(orderId, user, "gems.500", "4.99"))
        count("orders created")
        let transactionId = String(300_000_000 + Int(random.seed % 1000))
        let payload = SignedTransactionPayload(
            transactionId: transactionId, originalTransactionId: transactionId, bundleId: Demo.bundleId, productId: "gems.500",
            purchaseDate: Date().millisecondsSince1970, signedDate: Date().millisecondsSince1970, environment: "Sandbox",
            appAccountToken: created["appAccountToken"] as? String, price: 4990, currency: "USD")
        let item = Pending(transactionId: transactionId, orderId: orderId, user: user, jws: try chain.sign(payload), lost: false, payload: payload)
        let answer = try await upload(item)
        count("App Review's Sandbox purchase: \(answer["outcome"] as? String ?? "?") \(answer["state"] as? String ?? "?")")
        _ = try await deliverIfMatched(answer)
        review = (transactionId, orderId, try await requestJSON("GET", "/v1/orders/\(orderId)"))
    }

    /// A customer asks Apple to refund a delivered purchase: Apple's CONSUMPTION_REQUEST arrives,
    /// and the ledger answers it from what it knows (within a few seconds here).
    mutating func answerConsumptionRequest() async throws {
        guard let item = delivered.first else { return }
        _ = try await request("PUT", "/v1/products/gems.100", body: #"{"price":"0.99","currency":"USD","sampleContentProvided":false,"refundPreference":"DECLINE","bundleId":"\#(Demo.bundleId)"}"#)
        _ = try await request("PUT", "/v1/products/gems.500", body: #"{"price":"4.99","currency":"USD","sampleContentProvided":false,"refundPreference":"DECLINE","bundleId":"\#(Demo.bundleId)"}"#)
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
            data: .init(
                bundleId: Demo.bundleId, appAppleId: Demo.appAppleId, environment: "Production", signedTransactionInfo: transaction,
                consumptionRequestReason: reason)))
    }

    /// At login the app sends the signed AppTransaction naming the user's Apple account.
    mutating func logIn(_ user: String, account: String, app: String = Demo.bundleId, appAppleId: Int64 = Demo.appAppleId) async throws -> String {
        let signed = try chain.sign(SignedAppTransactionPayload(
            appTransactionId: account, bundleId: app, receiptType: "Production", receiptCreationDate: Date().millisecondsSince1970,
            appAppleId: appAppleId))
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

    /// Counts `what` for `app` (nil: the app now playing).
    mutating func count(_ what: String, in app: String? = nil) { counts[app ?? self.app, default: [:]][what, default: 0] += 1 }

    var summary: String {
        var lines = ["Demo: what the simulated clients did and saw, per app"]
        let rows = report["rows"] as? [[String: Any]] ?? []
        func revenue(_ app: String, _ environment: String) -> Decimal {
            rows.filter { $0["bundleId"] as? String == app && $0["environment"] as? String == environment }
                .reduce(Decimal(0)) { $0 + (Decimal(string: $1["revenue"] as? String ?? "0") ?? 0) }
        }
        let apps = [
            (Demo.bundleId, "the LEDGER_APPLE_* settings' app: Production and Sandbox, app id \(Demo.appAppleId)"),
            (Demo.secondBundleId, "added over HTTP: Production and Sandbox, app id \(Demo.secondAppAppleId), its own API key"),
        ]
        for (app, what) in apps {
            lines.append("App \(app) (\(what))")
            for (what, n) in (counts[app] ?? [:]).sorted(by: { $0.key < $1.key }) { lines.append("  \(what): \(n)") }
            lines.append("  revenue (Production, in totals): \(revenue(app, "Production")) USD; Sandbox (sandboxTotals, not revenue): \(revenue(app, "Sandbox")) USD")
        }
        lines.append("  App Store Server API requests with its own key: \(secondAppCalls.asked), \(secondAppCalls.refused) refused")
        if let review {
            let totals = report["totals"] as? [String: Any] ?? [:]
            let sandbox = report["sandboxTotals"] as? [String: Any] ?? [:]
            lines.append("App Review: the reviewer's Sandbox purchase \(review.transactionId) (order \(review.orderId) of \(Demo.bundleId)) was granted: order \(review.order["state"] as? String ?? "?"), environment \(review.order["environment"] as? String ?? "?"); not in revenue: totals (Production) revenue \(totals["revenue"] as? String ?? "?") USD, sandboxTotals revenue \(sandbox["revenue"] as? String ?? "?") USD")
        }
        lines += historySummary
        lines += subscriptionSummary
        lines += salesSummary
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

    func request(
        _ method: String, _ path: String, body: String? = nil, accept: String = "application/json", contentType: String = "application/json"
    ) async throws -> String {
        var request = HTTPClientRequest(url: base + path)
        request.method = .init(rawValue: method)
        request.headers.add(name: "Authorization", value: "Bearer \(key)")
        request.headers.add(name: "Accept", value: accept)
        if let body {
            request.headers.add(name: "Content-Type", value: contentType)
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
