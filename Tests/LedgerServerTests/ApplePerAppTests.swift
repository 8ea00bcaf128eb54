import AppleReceipts
import AppStoreStandIn
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore
import LedgerTestSupport
import Testing

/// Apple per app (issue 39): the work that asks the App Store Server API runs per app with that
/// app's key (its token's `bid` the app's bundle id), at the host of the environment of the
/// transaction it concerns; an app without a key is skipped while the others' work goes on.
@Suite("Apple per app and per environment")
struct ApplePerAppTests {
    static let gameB = "com.example.game-b"
    let apple: TestApple
    init() throws { apple = try TestApple() }

    /// The apps' clients a server of `configuration` has, on `db`.
    func clients(_ configuration: LedgerConfiguration, _ db: TestDatabase) -> LazyAppStoreServerAPI {
        LazyAppStoreServerAPI(
            catalog: AppCatalog(database: Database(client: db.client, logger: TestServer.logger)),
            hosts: configuration.apple.appStoreServerAPIHosts(), logger: TestServer.logger)
    }

    /// A server whose configured app (TestApple's, both environments) has `standIn`'s key in a
    /// file, with Apple's production host at `production` and its sandbox host at `sandbox`.
    func withServer(
        key standIn: AppStoreServerStandIn?, production: String, sandbox: String?,
        _ test: @Sendable @escaping (LedgerHTTP, TestDatabase, LedgerConfiguration) async throws -> Void
    ) async throws {
        let keyFile = NSTemporaryDirectory() + "iap-key-\(UUID()).p8"
        if let standIn { try standIn.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8) }
        defer { try? FileManager.default.removeItem(atPath: keyFile) }
        let configure: @Sendable (inout LedgerConfiguration) -> Void = { configuration in
            bothEnvironments(&configuration)
            if standIn != nil {
                configuration.apple.apiKeyID = AppStoreServerStandIn.keyID
                configuration.apple.apiIssuerID = AppStoreServerStandIn.issuerID
                configuration.apple.apiPrivateKeyFile = keyFile
            }
            configuration.apple.apiURL = production
            configuration.apple.apiSandboxURL = sandbox
            configuration.recoveryInterval = 0
            configuration.appleCallsInterval = 0
            configuration.backfillNotificationsAtStart = false
            configuration.refundCatchUpInterval = 0
            // Every open order is due a sweep at once (no background sweep runs: the interval is 0).
            configuration.recoveryAfter = 0
        }
        var seen = LedgerConfiguration()
        configure(&seen)
        seen.apple.rootCertificateFiles = [apple.rootFile]
        seen.apple.bundleID = TestApple.bundleId
        let configuration = seen
        try await withReceiptsApplication(apple, configure: configure) { http, db in try await test(http, db, configuration) }
    }

    /// Adds app B (Sandbox only) with `standIn`'s key stored in the ledger.
    func addGameB(_ http: LedgerHTTP, key standIn: AppStoreServerStandIn?) async throws {
        var body: [String: Any] = ["bundleId": Self.gameB, "environments": ["Sandbox"]]
        if let standIn { body["apiKey"] = ["issuerId": AppStoreServerStandIn.issuerID, "keyId": AppStoreServerStandIn.keyID, "privateKey": standIn.privateKeyPEM] }
        let (status, answer) = try await http.send(.post, "/v1/apps", json: body)
        #expect(status == .created || status == .ok, "\(answer)")
    }

    @Test("the hosts: LEDGER_APPLE_API_URL overrides both environments, the sandbox URL the sandbox's; Apple's own production host overrides nothing")
    func hosts() {
        var apple = LedgerConfiguration().apple
        #expect(apple.appStoreServerAPIHosts().productionURL == AppStoreServerAPI.productionURL)
        #expect(apple.appStoreServerAPIHosts().sandboxURL == AppStoreServerAPI.sandboxURL)
        apple.apiURL = "http://127.0.0.1:9000"
        #expect(apple.appStoreServerAPIHosts().productionURL == "http://127.0.0.1:9000")
        #expect(apple.appStoreServerAPIHosts().sandboxURL == "http://127.0.0.1:9000")
        apple.apiSandboxURL = "http://127.0.0.1:9001"
        #expect(apple.appStoreServerAPIHosts().sandboxURL == "http://127.0.0.1:9001")
        // Named Apple's production host (as a ledger of production once did): App Review's
        // Sandbox transactions are still asked about at the sandbox's host.
        apple.apiSandboxURL = nil
        for named in [AppStoreServerAPI.productionURL + "/", "https://API.storekit.itunes.apple.com"] {
            // Today's host, or the older one Apple's docs once gave.
            apple.apiURL = named
            #expect(apple.appStoreServerAPIHosts().productionURL == AppStoreServerAPI.productionURL, "\(named)")
            #expect(apple.appStoreServerAPIHosts().sandboxURL == AppStoreServerAPI.sandboxURL, "\(named)")
        }
    }

    @Test("calls about a Sandbox transaction go to the sandbox host, about a Production one to production's; each environment has its own backfill")
    func callsGoToTheTransactionsEnvironment() async throws {
        let production = AppStoreServerStandIn(bundleID: TestApple.bundleId, environment: "Production")
        let sandbox = try production.twin(in: "Sandbox")
        // As Apple's hosts: each knows its environment's transactions only.
        await production.setTransactions(["8900001"])
        await sandbox.setTransactions(["8900002"])
        try await production.run { productionURL in
            try await sandbox.run { sandboxURL in
                try await withServer(key: production, production: productionURL, sandbox: sandboxURL) { http, db, configuration in
                    for (order, id, environment) in [("env-p", "8900001", "Production"), ("env-s", "8900002", "Sandbox")] {
                        try await http.send(.post, "/v1/orders", json: newOrder(order))
                        let signed = try await apple.sign(TestApple.transaction(id, environment: environment))
                        let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": order, "signedTransaction": signed])
                        #expect(answer["state"] as? String == "verified" && answer["environment"] as? String == environment, "\(answer)")
                        try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "delivered", "data": [:]])
                    }
                    var settings = LedgerConfiguration()
                    settings.appleCalls = .init(finishAfterDelivery: true)
                    let calls = settings.appleCalls(secondServer(db), api: clients(configuration, db))
                    let summary = try await drain(calls, db)
                    #expect(summary.calls["finish sent"] == 2, "\(summary)")
                    let finishedAt = { (standIn: AppStoreServerStandIn) in await standIn.writes.map(\.path) }
                    #expect(await finishedAt(production) == ["/inApps/v1/transactions/8900001/finish"])
                    #expect(await finishedAt(sandbox) == ["/inApps/v1/transactions/8900002/finish"])
                    let refused = (await production.refusedTokens, await sandbox.refusedTokens)
                    #expect(refused == (0, 0))
                    #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) == 0, "no call left")

                    // A sweep of the user's accounts (an order is open) and the refund catch-up: each account at its host.
                    try await http.send(.post, "/v1/orders", json: newOrder("env-open"))
                    for (standIn, id) in [(production, "8900001"), (sandbox, "8900002")] {
                        await standIn.setHistory("app-tx-\(id)", [.init(revision: "h-\(id)", hasMore: false, signedTransactions: [])])
                        await standIn.setRefunds(id, [.init(revision: "r-\(id)", hasMore: false, signedTransactions: [])])
                    }
                    var sweeping = configuration
                    sweeping.recoveryAfter = 0
                    let sweep = try await sweeping.historySweep(
                        secondServer(db), api: clients(configuration, db), verifier: configuration.apple.verifier(logger: TestServer.logger)
                    ).run(user: UserID("u-1"))
                    #expect(sweep.accounts == 2 && sweep.failed == 0 && sweep.skipped == 0, "\(sweep)")
                    let refunds = try await configuration.refundCatchUp(
                        secondServer(db), api: clients(configuration, db), verifier: configuration.apple.verifier(logger: TestServer.logger)
                    ).run(all: true)
                    #expect(refunds.accounts == 2 && refunds.failed == 0, "\(refunds)")
                    #expect(try await scalar(db, """
                        SELECT string_agg(account_id || ' ' || environment, ',' ORDER BY account_id) FROM apple_history_cursors
                        """, as: String.self) == "app-tx-8900001 Production,app-tx-8900002 Sandbox")

                    // The notification backfill: one per environment the app accepts, each at its host, each with its position.
                    let backfills = try await secondServer(db).notificationBackfills(api: clients(configuration, db), verifier: try configuration.apple.verifier(logger: TestServer.logger))
                    #expect(backfills.map(\.environment) == [.production, .sandbox])
                    for backfill in backfills { _ = try await backfill.run() }
                    let asked = (await production.notificationRequests.count, await sandbox.notificationRequests.count)
                    #expect(asked == (1, 1), "each environment's host was asked once")
                    #expect(try await scalar(db, """
                        SELECT string_agg(bundle_id || ' ' || environment, ',' ORDER BY environment) FROM apple_notification_backfill WHERE finished_at IS NOT NULL
                        """, as: String.self) == "\(TestApple.bundleId) Production,\(TestApple.bundleId) Sandbox")
                }
            }
        }
    }

    @Test("a consumption answer goes to the environment Apple signed the request's transaction in, although the backend named Production for it")
    func consumptionGoesWhereAppleSigned() async throws {
        let production = AppStoreServerStandIn(bundleID: TestApple.bundleId, environment: "Production")
        let sandbox = try production.twin(in: "Sandbox")
        await sandbox.setTransactions(["8900005"])
        try await production.run { productionURL in
            try await sandbox.run { sandboxURL in
                try await withServer(key: production, production: productionURL, sandbox: sandboxURL) { http, db, configuration in
                    // App Review's purchase, verified by the backend itself, which named Production.
                    try await http.send(.post, "/v1/orders", json: newOrder("env-c"))
                    var claimed = receipt("8900005")
                    claimed["environment"] = "Production"
                    for (type, data) in [("receipt-received", claimed), ("verified", ["environment": "Production"]), ("delivered", [:])] {
                        let (status, answer) = try await http.send(.post, "/v1/orders/env-c/events", json: ["type": type, "data": data])
                        #expect(status == .created, "\(type): \(answer)")
                    }
                    let request = try await apple.notification("CONSUMPTION_REQUEST", transaction: TestApple.transaction("8900005", environment: "Sandbox"))
                    try await http.notifyAppleTaken(request)
                    var settings = LedgerConfiguration()
                    settings.appleCalls = .init(consumption: true)
                    let summary = try await drain(settings.appleCalls(secondServer(db), api: clients(configuration, db)), db)
                    #expect(summary.calls == ["consumption sent": 1], "\(summary)")
                    #expect(await sandbox.writes.map(\.path) == ["/inApps/v2/transactions/consumption/8900005"])
                    #expect(await production.writes.isEmpty)
                }
            }
        }
    }

    @Test("app B's lookups go with B's key and bundle id; bundleId is required with several apps; a key changed over HTTP is used at once")
    func appBWithItsKey() async throws {
        let standInA = AppStoreServerStandIn(bundleID: TestApple.bundleId)
        let standInB = AppStoreServerStandIn(bundleID: Self.gameB)
        await standInB.setOrder("MQB1", [])
        try await AppStoreServerStandIn.run([standInA, standInB]) { base in
            try await withServer(key: standInA, production: base, sandbox: nil) { http, _, _ in
                try await addGameB(http, key: standInB)
                let (required, requiredError) = try await http.send(.post, "/v1/apple-orders/MQB1/lookup", raw: "")
                #expect(required == .badRequest && errorOf(requiredError)["code"] as? String == "bundle-id-required", "\(requiredError)")
                let (unknown, unknownError) = try await http.send(.post, "/v1/apple-orders/MQB1/lookup?bundleId=com.example.none", raw: "")
                #expect(unknown == .badRequest && errorOf(unknownError)["code"] as? String == "unknown-app", "\(unknownError)")

                let (found, answer) = try await http.send(.post, "/v1/apple-orders/MQB1/lookup?bundleId=\(Self.gameB)", raw: "")
                #expect(found == .ok && answer["appleOrderId"] as? String == "MQB1", "\(answer)")
                let atB = (await standInB.requests, await standInB.refusedTokens)
                #expect(atB == (1, 0), "B's stand-in took B's token")
                let (other, otherError) = try await http.send(.post, "/v1/apple-orders/MQB1/lookup?bundleId=\(TestApple.bundleId)", raw: "")
                #expect(other == .notFound && errorOf(otherError)["code"] as? String == "apple-order-not-found", "A's order ids are A's")
                let atA = (await standInA.requests, await standInA.refusedTokens)
                #expect(atA == (1, 0))

                // B's key replaced by one Apple does not know for B: refused at once, no restart; put back: taken at once.
                let wrong = AppStoreServerStandIn(bundleID: Self.gameB)
                let (patched, _) = try await http.send(.patch, "/v1/apps/\(Self.gameB)", json: [
                    "apiKey": ["issuerId": AppStoreServerStandIn.issuerID, "keyId": AppStoreServerStandIn.keyID, "privateKey": wrong.privateKeyPEM]])
                #expect(patched == .ok)
                let (refused, refusal) = try await http.send(.post, "/v1/apple-orders/MQB1/lookup?bundleId=\(Self.gameB)", raw: "")
                #expect(refused == .badGateway && errorOf(refusal)["code"] as? String == "apple-api-unauthorized", "\(refusal)")
                try await http.send(.patch, "/v1/apps/\(Self.gameB)", json: [
                    "apiKey": ["issuerId": AppStoreServerStandIn.issuerID, "keyId": AppStoreServerStandIn.keyID, "privateKey": standInB.privateKeyPEM]])
                let (again, _) = try await http.send(.post, "/v1/apple-orders/MQB1/lookup?bundleId=\(Self.gameB)", raw: "")
                #expect(again == .ok)
            }
        }
    }

    @Test("a call about app B's transaction goes with B's key and bundle id, one about A's with A's")
    func callsGoWithTheTransactionsApp() async throws {
        let standInA = AppStoreServerStandIn(bundleID: TestApple.bundleId)
        let standInB = AppStoreServerStandIn(bundleID: Self.gameB)
        try await AppStoreServerStandIn.run([standInA, standInB]) { base in
            try await withServer(key: standInA, production: base, sandbox: nil) { http, db, configuration in
                try await addGameB(http, key: standInB)
                try await http.send(.post, "/v1/orders", json: newOrder("app-a").merging(["bundleId": TestApple.bundleId]) { $1 })
                let signed = try await apple.sign(TestApple.transaction("8910001", environment: "Sandbox"))
                try await http.send(.post, "/v1/receipts", json: ["orderId": "app-a", "signedTransaction": signed])
                // B's purchase, taken in as a verified transaction of B (proofs of B verify once the verifier reads the apps).
                let (created, order) = try await http.send(.post, "/v1/orders", json: newOrder("app-b").merging(["bundleId": Self.gameB]) { $1 })
                #expect(created == .created && order["bundleId"] as? String == Self.gameB, "\(order)")
                let purchase = AppleTransaction(
                    transactionId: TransactionID(unchecked: "8910002"), originalTransactionId: "8910002", productId: ProductID(unchecked: "gems.100"),
                    purchaseDate: Date(timeIntervalSinceNow: -60), environment: "Sandbox", bundleId: Self.gameB, format: .jws, receiptSha256: sha)
                let taken = try await secondServer(db).receipts.apply(
                    purchase, claim: .init(userId: UserID("u-1"), orderId: OrderID("app-b"), poolUserId: nil), metadata: Data("{}".utf8))
                #expect(taken.outcome == .matched, "\(taken)")
                for id in ["app-a", "app-b"] { try await http.send(.post, "/v1/orders/\(id)/events", json: ["type": "delivered", "data": [:]]) }

                var settings = LedgerConfiguration()
                settings.appleCalls = .init(finishAfterDelivery: true)
                let summary = try await drain(settings.appleCalls(secondServer(db), api: clients(configuration, db)), db)
                #expect(summary.calls["finish sent"] == 2, "\(summary)")
                let atA = await standInA.writes.map(\.path)
                let atB = await standInB.writes.map(\.path)
                #expect(atA == ["/inApps/v1/transactions/8910001/finish"] && atB == ["/inApps/v1/transactions/8910002/finish"], "\(atA) \(atB)")
                let refused = (await standInA.refusedTokens, await standInB.refusedTokens)
                #expect(refused == (0, 0))
                #expect(try await scalar(db, "SELECT string_agg(DISTINCT bundle_id, ',') FROM apple_transactions", as: String.self)
                    == "\(Self.gameB),\(TestApple.bundleId)")
            }
        }
    }

    @Test("an app without a key is skipped with a log line and a metric, while another app's work goes on")
    func appWithoutKeySkipped() async throws {
        let standInB = AppStoreServerStandIn(bundleID: Self.gameB)
        await standInB.setOrder("MQB2", [])
        try await standInB.run { base in
            // The configured app has no key; app B has its own.
            try await withServer(key: nil, production: base, sandbox: nil) { http, db, configuration in
                try await addGameB(http, key: standInB)
                let (found, answer) = try await http.send(.post, "/v1/apple-orders/MQB2/lookup?bundleId=\(Self.gameB)", raw: "")
                #expect(found == .ok, "\(answer)")
                let (skipped, skipError) = try await http.send(.post, "/v1/apple-orders/MQB2/lookup?bundleId=\(TestApple.bundleId)", raw: "")
                #expect(skipped == .serviceUnavailable && errorOf(skipError)["code"] as? String == "apple-api-not-configured", "\(skipError)")
                let metrics = String(buffer: try await http.client.execute(uri: "/metrics", method: .get).body)
                #expect(metrics.contains(#"ledger_apple_apps_skipped_total{app="\#(TestApple.bundleId)"} 1"#), "\(metrics)")

                // The backfills: B's alone (the configured app is skipped), and it runs.
                let backfills = try await secondServer(db).notificationBackfills(
                    api: clients(configuration, db), verifier: try configuration.apple.verifier(logger: TestServer.logger))
                #expect(backfills.map(\.app) == [BundleID(unchecked: Self.gameB)] && backfills.map(\.environment) == [.sandbox])
                let backfill = try #require(backfills.first)
                let summary = try await backfill.run()
                #expect(summary.finished && summary.refusal == nil, "\(summary)")
                let atB = (await standInB.notificationRequests.count, await standInB.refusedTokens)
                #expect(atB == (1, 0))
            }
        }
    }

    @Test("one user's sweep is of one app: user ids are per app, so it names the app once the ledger holds several")
    func oneUsersSweepIsOfOneApp() async throws {
        let standInA = AppStoreServerStandIn(bundleID: TestApple.bundleId)
        let standInB = AppStoreServerStandIn(bundleID: Self.gameB)
        try await AppStoreServerStandIn.run([standInA, standInB]) { base in
            try await withServer(key: standInA, production: base, sandbox: nil) { http, db, _ in
                try await addGameB(http, key: standInB)
                // User u-1 of each app bought once (each an Apple account of its own) and has an order open.
                try await http.send(.post, "/v1/orders", json: newOrder("sw-a").merging(["bundleId": TestApple.bundleId]) { $1 })
                let signed = try await apple.sign(TestApple.transaction("8920001", environment: "Sandbox"))
                let (_, paidA) = try await http.send(.post, "/v1/receipts", json: ["orderId": "sw-a", "signedTransaction": signed])
                #expect(paidA["outcome"] as? String == "matched", "\(paidA)")
                try await http.send(.post, "/v1/orders", json: newOrder("sw-b").merging(["bundleId": Self.gameB]) { $1 })
                let purchase = AppleTransaction(
                    transactionId: TransactionID(unchecked: "8920002"), originalTransactionId: "8920002", productId: ProductID(unchecked: "gems.100"),
                    purchaseDate: Date(timeIntervalSinceNow: -60), environment: "Sandbox", bundleId: Self.gameB, appTransactionId: "app-tx-8920002",
                    format: .jws, receiptSha256: sha)
                let paidB = try await secondServer(db).receipts.apply(
                    purchase, claim: .init(userId: UserID("u-1"), orderId: OrderID("sw-b"), poolUserId: nil), metadata: Data("{}".utf8))
                #expect(paidB.outcome == .matched, "\(paidB)")
                for (order, app) in [("sw-a-open", TestApple.bundleId), ("sw-b-open", Self.gameB)] {
                    let (created, answer) = try await http.send(.post, "/v1/orders", json: newOrder(order).merging(["bundleId": app]) { $1 })
                    #expect(created == .created && answer["userId"] as? String == "u-1", "\(answer)")
                }
                await standInA.setHistory("app-tx-8920001", [.init(revision: "h-a", hasMore: false, signedTransactions: [])])
                await standInB.setHistory("app-tx-8920002", [.init(revision: "h-b", hasMore: false, signedTransactions: [])])

                let (required, requiredError) = try await http.send(.post, "/v1/recover", json: ["userId": "u-1"])
                #expect(required == .badRequest && errorOf(requiredError)["code"] as? String == "bundle-id-required", "\(requiredError)")
                let (inBody, inBodyError) = try await http.send(.post, "/v1/recover", json: ["userId": "u-1", "bundleId": Self.gameB])
                #expect(inBody == .badRequest && errorOf(inBodyError)["field"] as? String == "bundleId", "\(inBodyError)")
                #expect((errorOf(inBodyError)["message"] as? String)?.contains("?bundleId=") == true, "where the app goes instead: \(inBodyError)")
                let (unknown, unknownError) = try await http.send(.post, "/v1/recover?bundleId=com.example.none", json: ["userId": "u-1"])
                #expect(unknown == .badRequest && errorOf(unknownError)["code"] as? String == "unknown-app", "\(unknownError)")
                let askedA = await standInA.requests
                let (swept, summary) = try await http.send(.post, "/v1/recover?bundleId=\(Self.gameB)", json: ["userId": "u-1"])
                #expect(swept == .ok && summary["accounts"] as? Int == 1 && summary["failed"] as? Int == 0, "\(summary)")
                #expect(await standInA.requests == askedA, "app A's user u-1 is another user: not swept")
                #expect(try await scalar(db, "SELECT string_agg(account_id, ',') FROM apple_history_cursors", as: String.self) == "app-tx-8920002")
                // Every app's users, with no user named.
                let (all, allSummary) = try await http.send(.post, "/v1/recover", raw: "")
                #expect(all == .ok && allSummary["accounts"] as? Int == 2, "\(allSummary)")
            }
        }
    }

    @Test("a purchase Look Up Order ID names that may verify later (its app's Apple id is not set yet) is answered retry-later, not rejected")
    func lookupRetryLater() async throws {
        let standInB = AppStoreServerStandIn(bundleID: Self.gameB)
        let purchase = try await apple.sign(TestApple.transaction("8930001", environment: "Production", bundleId: Self.gameB))
        await standInB.setOrder("MQB3", [purchase])
        try await standInB.run { base in
            try await withServer(key: nil, production: base, sandbox: nil) { http, _, _ in
                let (added, app) = try await http.send(.post, "/v1/apps", json: [
                    "bundleId": Self.gameB, "environments": ["Production", "Sandbox"],
                    "apiKey": ["issuerId": AppStoreServerStandIn.issuerID, "keyId": AppStoreServerStandIn.keyID, "privateKey": standInB.privateKeyPEM],
                ])
                #expect(added == .created, "\(app)")
                let (found, answer) = try await http.send(.post, "/v1/apple-orders/MQB3/lookup?bundleId=\(Self.gameB)", raw: "")
                let entries = answer["transactions"] as? [[String: Any]] ?? []
                #expect(found == .ok && entries.count == 1, "\(answer)")
                #expect(entries.first?["outcome"] as? String == "retry-later" && entries.first?["reason"] as? String == "app-apple-id-missing", "\(answer)")
            }
        }
    }
}
