import AppStoreStandIn
import Foundation
import LedgerCore
import LedgerServices
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// `ledger unmatch`, run as an operator runs it: the built executable against the database.
@Suite("ledger unmatch")
struct UnmatchCommandTests {
    @Test("undoes a support pairing from the command line, and says why when it cannot")
    func undoesFromTheCommandLine() async throws {
        try await withTestDatabase { db in
            let metadata = Data(#"{"appendedBy":"test"}"#.utf8)
            let services = ServiceAssembly(database: db.database)
            let receipts = services.receipts
            let orderID = OrderID(unchecked: "cli-order")
            _ = try await services.orders.create(
                orderID, OrderCreated(userId: UserID(unchecked: "cli-user"), productId: ProductID(unchecked: "gems.100")),
                tokenGiven: false, metadata: metadata)
            let transaction = AppleTransaction(
                transactionId: TransactionID(unchecked: "7000001"), originalTransactionId: "7000001", productId: ProductID(unchecked: "gems.100"),
                purchaseDate: Date(), environment: "Sandbox", bundleId: "com.example.game", format: .jws,
                receiptSha256: String(repeating: "ab", count: 32))
            let pooled = try await receipts.apply(transaction, claim: .init(userId: UserID(unchecked: "cli-user"), orderId: nil), metadata: metadata)
            #expect(pooled.outcome == .unmatched)
            let paired = try await services.support.match(
                transaction.transactionId, to: orderID, force: false, reason: nil, metadata: metadata)
            #expect(paired.state == .verified)

            let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-unmatch-\(UUID().uuidString.prefix(8))")
            try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: work) }
            let environment = ["LEDGER_DATABASE_URL": db.configuration.url, "LEDGER_LOG_LEVEL": "warning", "USER": "support-ann"]
            let (status, output) = try await LedgerChild.run(
                ["unmatch", "7000001", "--reason", "wrong character"], environment: environment, log: work.appendingPathComponent("1.log"))
            #expect(status == 0, "\(output)")
            #expect(output.contains("order cli-order is created again"), "\(output)")
            let order = try #require(try await services.orders.order(orderID))
            #expect(order.state == .created && order.transactionId == nil)
            let appendedBy = try await scalarText(db, "SELECT metadata->>'appendedBy' FROM events WHERE type = 'pairing-undone'")
            #expect(appendedBy == "ledger unmatch (support-ann)")

            let (again, refusal) = try await LedgerChild.run(
                ["unmatch", "7000001", "--reason", "again"], environment: environment, log: work.appendingPathComponent("2.log"))
            #expect(again != 0)
            #expect(refusal.contains("is paired with no order"), "\(refusal)")
        }
    }
}

/// `ledger lookup`, run as an operator runs it, against the stand-in App Store Server API.
@Suite("ledger lookup")
struct LookupCommandTests {
    @Test("takes an Apple order's purchases in from the command line; an unknown order is named")
    func looksUp() async throws {
        let apple = try TestApple()
        let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
        try await withTestDatabase { db in
            await standIn.setOrder("MQ7CLI", [try await apple.sign(TestApple.transaction("9200001"))])
            try await withAppleCommandEnvironment("lookup", apple, standIn, db) { environment, work in
                let (status, output) = try await LedgerChild.run(
                    ["lookup", "MQ7CLI", "--user", "cli-user"], environment: environment, log: work.appendingPathComponent("1.log"))
                #expect(status == 0, "\(output)")
                #expect(output.contains("transaction 9200001, unmatched"), "\(output)")
                let (missing, refusal) = try await LedgerChild.run(
                    ["lookup", "MQ0000"], environment: environment, log: work.appendingPathComponent("2.log"))
                #expect(missing != 0)
                #expect(refusal.contains("apple-order-not-found"), "\(refusal)")
                // What is no Apple order id is refused as the route refuses it, and Apple is not asked.
                let asked = await standIn.requests
                let (bad, badOutput) = try await LedgerChild.run(
                    ["lookup", "bad id!"], environment: environment, log: work.appendingPathComponent("3.log"))
                #expect(bad == 64 && badOutput.contains("appleOrderId must be the letters and digits"), "\(badOutput)")
                #expect(await standIn.requests == asked)
            }
        }
    }
}

/// `ledger recover`, run as an operator runs it, against the stand-in App Store Server API.
@Suite("ledger recover")
struct RecoverCommandTests {
    @Test("sweeps one user's Apple account from the command line and says what it found; a second run finds nothing new")
    func recovers() async throws {
        let apple = try TestApple()
        let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
        try await withTestDatabase { db in
            let metadata = Data(#"{"appendedBy":"test"}"#.utf8)
            let services = ServiceAssembly(database: db.database)
            _ = try await services.orders.create(
                OrderID(unchecked: "cli-open"), OrderCreated(userId: UserID(unchecked: "cli-user"), productId: ProductID(unchecked: "gems.100")),
                tokenGiven: false, metadata: metadata)
            let account = AppleAccount(appTransactionId: AppTransactionID(unchecked: "acct-cli"), environment: "Sandbox", bundleId: TestApple.bundleId)
            _ = try await services.accounts.link(account, to: UserID(unchecked: "cli-user"), metadata: metadata)
            var purchase = TestApple.transaction("9300001", product: "coins.500")
            purchase.appTransactionId = "acct-cli"
            await standIn.setHistory("acct-cli", [.init(revision: "c1", hasMore: false, signedTransactions: [try await apple.sign(purchase)])])

            try await withAppleCommandEnvironment("recover", apple, standIn, db, ["LEDGER_RECOVERY_AFTER": "0"]) { environment, work in
                let (status, output) = try await LedgerChild.run(
                    ["recover", "--user", "cli-user"], environment: environment, log: work.appendingPathComponent("1.log"))
                #expect(status == 0, "\(output)")
                #expect(output.contains("swept 1 Apple accounts, 1 pages, 1 transactions"), "\(output)")
                #expect(output.contains("new to the ledger: unmatched 1"), "\(output)")
                let (again, second) = try await LedgerChild.run(
                    ["recover"], environment: environment, log: work.appendingPathComponent("2.log"))
                #expect(again == 0, "\(second)")
                #expect(second.contains("swept 1 Apple accounts, 1 pages, 0 transactions"), "\(second)")
                #expect(second.contains("new to the ledger: none"), "\(second)")
                let (bad, refusal) = try await LedgerChild.run(
                    ["recover", "--user", ""], environment: environment, log: work.appendingPathComponent("3.log"))
                #expect(bad == 64 && refusal.contains("--user"), "\(refusal)")
                // Apple down for the account: work left, and the exit status says so.
                await standIn.queue(Array(repeating: .serverError, count: 5))
                let (failed, failure) = try await LedgerChild.run(
                    ["recover", "--user", "cli-user"], environment: environment, log: work.appendingPathComponent("4.log"))
                #expect(failed == 1 && failure.contains("1 accounts could not be read (apple-api-unavailable 1)"), "\(failure)")
            }
            #expect(try await scalarText(db, "SELECT user_id FROM apple_transactions WHERE transaction_id = '9300001'") == "cli-user")
        }
    }
}

/// `ledger backfill`, run as an operator runs it, against the stand-in App Store Server API.
@Suite("ledger backfill")
struct BackfillCommandTests {
    @Test("backfills notifications and refunds from the command line and says what it applied; again, nothing new; a bad date is named")
    func backfills() async throws {
        try await Self.withMissedNotification(of: "9400001") { apple, standIn, db in
            try await withAppleCommandEnvironment("backfill", apple, standIn, db) { environment, work in
                let (status, output) = try await LedgerChild.run(
                    ["backfill", "notifications", "--since", "2026-11-01"], environment: environment, log: work.appendingPathComponent("1.log"))
                #expect(status == 0, "\(output)")
                #expect(output.contains("1 notifications") && output.contains("applied 1 new to the ledger; 0 applied before"), "\(output)")
                let (again, second) = try await LedgerChild.run(
                    ["backfill", "notifications"], environment: environment, log: work.appendingPathComponent("2.log"))
                #expect(again == 0 && second.contains("applied 0 new to the ledger; 1 applied before"), "\(second)")
                let (bad, refusal) = try await LedgerChild.run(
                    ["backfill", "notifications", "--since", "yesterday"], environment: environment, log: work.appendingPathComponent("3.log"))
                #expect(bad != 0 && refusal.contains("--since must be a day such as 2026-11-01 or an ISO 8601 time"), "\(refusal)")
                let (refunds, summary) = try await LedgerChild.run(
                    ["backfill", "refunds", "--all"], environment: environment, log: work.appendingPathComponent("4.log"))
                #expect(refunds == 0 && summary.contains("read the refund history of 0 Apple accounts"), "\(summary)")
                // Apple's failure is not the command line's: no usage, not 64.
                await standIn.setNotifications([.init(revision: "same", hasMore: true, signedTransactions: []), .init(revision: "same", hasMore: true, signedTransactions: [])])
                let (stopped, why) = try await LedgerChild.run(
                    ["backfill", "notifications", "--since", "2026-11-01"], environment: environment, log: work.appendingPathComponent("5.log"))
                #expect(stopped == 1 && why.contains("Error: stopped: ") && why.contains("named the position it was asked from (same) again"), "\(why)")
                #expect(!why.contains("Usage:"), "\(why)")
            }
        }
    }

    /// `body` with a fresh database and a stand-in whose notification history holds one
    /// `ONE_TIME_CHARGE` of transaction `id`, which the ledger missed; afterwards the ledger holds it.
    static func withMissedNotification(
        of id: String, _ body: @Sendable (TestApple, AppStoreServerStandIn, TestDatabase) async throws -> Void
    ) async throws {
        let apple = try TestApple()
        let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
        try await withTestDatabase { db in
            let missed = try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction(id))
            await standIn.setNotifications([.init(revision: "end", hasMore: false, signedTransactions: [missed])])
            try await body(apple, standIn, db)
            #expect(try await scalarText(db, "SELECT transaction_id FROM apple_transactions WHERE transaction_id = \(id)") == id)
        }
    }
}

extension BackfillCommandTests {
    @Test("one backfill's failure (Apple down for production) leaves the other environment's to run, and the command exits 1 naming it")
    func oneFailureLeavesTheOthers() async throws {
        try await Self.withMissedNotification(of: "9400011") { apple, standIn, db in
            // Production's host is down: 500 to each of the client's five tries.
            let down = try standIn.twin(in: "Production")
            await down.queue(Array(repeating: .serverError, count: 5))
            try await withAppleCommandEnvironment("backfill-two", apple, standIn, db) { environment, work in
                try await down.run { downBase in
                    var both = environment
                    both["LEDGER_APPLE_ENVIRONMENT"] = "Production,Sandbox"
                    both["LEDGER_APPLE_APP_ID"] = "\(TestApple.appAppleId)"
                    both["LEDGER_APPLE_API_SANDBOX_URL"] = environment["LEDGER_APPLE_API_URL"]
                    both["LEDGER_APPLE_API_URL"] = downBase
                    let (status, output) = try await LedgerChild.run(
                        ["backfill", "notifications", "--since", "2026-11-01"], environment: both, log: work.appendingPathComponent("1.log"))
                    #expect(status == 1, "\(output)")
                    #expect(output.contains("(Production): failed") && output.contains("(Sandbox): read Apple's notification history"), "\(output)")
                    #expect(output.contains("1 of 2 backfills failed"), "\(output)")
                }
            }
        }
    }
}

/// `ledger demo`, as a newcomer runs it: its own private cluster, its own Apple stand-ins.
@Suite("ledger demo")
struct DemoCommandTests {
    @Test("plays its story to the end: two apps, lost order ids paired, an undo, a deleted client's purchase found by a history sweep, App Review's sandbox purchase kept out of revenue")
    func playsTheStory() async throws {
        // A folder the postgres account can enter (the checkout may be under a private folder).
        let work = URL(fileURLWithPath: "/var/tmp/ledger-demo-test-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o755])
        // Kept when the demo does not end (its data and log show where it stopped).
        let (status, output) = try await LedgerChild.run(
            ["demo", "--users", "8", "--data-dir", work.appendingPathComponent("data").path], environment: [:],
            log: work.appendingPathComponent("demo.log"))
        defer { try? FileManager.default.removeItem(at: work) }
        #expect(status == 0, "\(output)")
        #expect(output.contains("clients deleted before uploading: 1"), "\(output)")
        #expect(output.contains("purchases no client sent: matched 1"), "\(output)")
        #expect(output.contains("recovered orders delivered: 1"), "\(output)")
        #expect(output.contains("Consumption answer (order demo-user-0-order-0): sent, deliveryStatus DELIVERED"), "\(output)")
        #expect(output.contains("Notification backfill: 2 in Apple's history, 1 new to the ledger, 1 applied before"), "\(output)")
        #expect(output.contains("Reconciliation report (CSV):"), "\(output)")
        // The team's history first (issue 41): imported once, and a replayed old purchase refused.
        #expect(output.contains("History import (POST /v1/imports): 12 orders imported; again: 0 imported, 12 already present"), "\(output)")
        #expect(output.contains("of the imported history, sent with a new order: duplicate (duplicate-transaction, finishTransaction true); the new order is failed"), "\(output)")
        // The subscriber (issue 40): bought through an order, renewed twice through notifications
        // (the second a billing recovery in its grace period), one period refunded, and an order of
        // the same product abandoned at payment that stays open.
        #expect(output.contains("subscription bought: matched verified"), "\(output)")
        #expect(output.contains("subscription notifications: DID_RENEW: applied: 1"), "\(output)")
        #expect(output.contains("subscription notifications: DID_FAIL_TO_RENEW GRACE_PERIOD: applied: 1"), "\(output)")
        #expect(output.contains("subscription notifications: DID_RENEW BILLING_RECOVERY: applied: 1"), "\(output)")
        #expect(output.contains("subscription notifications: REFUND: applied: 1"), "\(output)")
        #expect(output.contains("after the renewals and a reconciler pass: payment-added: 1"), "\(output)")
        #expect(output.contains("  status active, expires "), "\(output)")
        #expect(output.contains(",subscription-renewal,1,,\n"), "a renewal's row in the report: \(output)")
        // Finance against Apple (issue 42): yesterday's sales report counts a purchase more than
        // the ledger saw; the sweep finds it, and the comparison then agrees.
        #expect(output.contains("  before: gems.500 US: Apple 2, ledger 1 — purchases Apple counted that the ledger never saw"), "\(output)")
        #expect(output.contains("Apple counted 1 more; 1 user(s) with open orders, 1 Apple account(s): 1 purchase(s) new to the ledger"), "\(output)")
        #expect(output.contains("  after: gems.500 US: Apple 2, ledger 2 — agrees"), "\(output)")

        // Two apps: the second, added over HTTP, sold and asked Apple with its own key.
        #expect(output.contains("App com.example.ledger-demo (") && output.contains("App com.example.ledger-demo.puzzle ("), "\(output)")
        #expect(output.contains("added over POST /v1/apps with its own API key: 1"), "\(output)")
        #expect(output.contains("App Store Server API requests with its own key: ") && output.contains(", 0 refused"), "\(output)")
        #expect(output.contains("App Review's Sandbox purchase: matched verified: 1"), "\(output)")
        #expect(output.contains("App Review: the reviewer's Sandbox purchase") && output.contains("order finished, environment Sandbox"), "\(output)")
        // The report (CSV): every app's production rows, and the reviewer's purchase in the
        // sandbox's totals alone, never in production's.
        let csv = output.components(separatedBy: "Reconciliation report (CSV):\n").last ?? ""
        let rows = csv.split(separator: "\n", omittingEmptySubsequences: false).dropFirst().prefix { !$0.isEmpty }
            .map { $0.split(separator: ",", omittingEmptySubsequences: false).map(String.init) }.filter { $0.count == 26 }
        let (day, verified, revenue, environment, bundle) = (0, 4, 10, 20, 21)
        let production = rows.filter { $0[day] != "total" && $0[environment] == "Production" }
        let sandbox = rows.filter { $0[day] != "total" && $0[environment] == "Sandbox" }
        #expect(Set(production.map { $0[bundle] }) == ["com.example.ledger-demo", "com.example.ledger-demo.puzzle"], "\(csv)")
        #expect(sandbox.map { [$0[bundle], $0[verified], $0[revenue]] } == [["com.example.ledger-demo", "1", "4.99"]], "\(csv)")
        let totals = rows.first { $0[day] == "total" && $0[environment] == "Production" }
        let sandboxTotals = rows.first { $0[day] == "total" && $0[environment] == "Sandbox" }
        let productionRevenue = production.reduce(Decimal(0)) { $0 + (Decimal(string: $1[revenue]) ?? 0) }
        #expect(totals.flatMap { Decimal(string: $0[revenue]) } == productionRevenue, "\(csv)")
        #expect(totals?[verified] == String(production.reduce(0) { $0 + (Int($1[verified]) ?? 0) }), "\(csv)")
        #expect(sandboxTotals.map { [$0[verified], $0[revenue]] } == ["1", "4.99"], "\(csv)")
    }
}

/// One value of a query's first row, as text.
func scalarText(_ db: TestDatabase, _ query: PostgresQuery) async throws -> String? {
    for try await value in try await db.client.query(query, logger: TestServer.logger).decode(String?.self) { return value }
    return nil
}

/// Runs `body` with the environment of a `ledger` command that asks the stand-in App Store Server
/// API (on `db`, trusting `apple`, with the stand-in's key in a file of a work folder of its own,
/// plus `extra`), while the stand-in serves.
func withAppleCommandEnvironment(
    _ command: String, _ apple: TestApple, _ standIn: AppStoreServerStandIn, _ db: TestDatabase, _ extra: [String: String] = [:],
    _ body: @Sendable (_ environment: [String: String], _ work: URL) async throws -> Void
) async throws {
    let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-\(command)-\(UUID().uuidString.prefix(8))")
    try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: work) }
    let keyFile = work.appendingPathComponent("key.p8").path
    try standIn.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
    try await standIn.run { base in
        let environment = [
            "LEDGER_DATABASE_URL": db.configuration.url, "LEDGER_LOG_LEVEL": "warning",
            "LEDGER_APPLE_ROOT_CERTS": apple.rootFile, "LEDGER_APPLE_BUNDLE_ID": TestApple.bundleId,
            "LEDGER_APPLE_ENVIRONMENT": "Sandbox", "LEDGER_APPLE_API_KEY_ID": AppStoreServerStandIn.keyID,
            "LEDGER_APPLE_API_ISSUER_ID": AppStoreServerStandIn.issuerID, "LEDGER_APPLE_API_PRIVATE_KEY": keyFile,
            "LEDGER_APPLE_API_URL": base,
        ].merging(extra) { _, given in given }
        try await body(environment, work)
    }
}

/// A bad setting, run as an operator meets it: named as it was given.
@Suite("ledger settings")
struct SettingsCommandTests {
    @Test("names a bad value by its flag when a flag gave it, by its environment variable otherwise, before opening any database")
    func namesTheSettingAsGiven() async throws {
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-settings-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: work) }
        let environment = ["LEDGER_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none", "LEDGER_RECONCILE_SETTLE": "soon"]
        let (flagged, flagOutput) = try await LedgerChild.run(
            ["serve", "--port", "abc", "--apple-api-rate", "0"], environment: environment, log: work.appendingPathComponent("1.log"))
        #expect(flagged != 0)
        #expect(flagOutput.contains("--port is abc, not a port number"), "\(flagOutput)")
        #expect(flagOutput.contains("--apple-api-rate is 0;"), "\(flagOutput)")
        #expect(flagOutput.contains("LEDGER_RECONCILE_SETTLE is soon"), "\(flagOutput)")
        #expect(!flagOutput.contains("LEDGER_PORT"), "\(flagOutput)")

        let (reported, operatorOutput) = try await LedgerChild.run(
            ["report", "--reconcile-settle", "x"], environment: environment, log: work.appendingPathComponent("2.log"))
        #expect(reported != 0)
        #expect(operatorOutput.contains("--reconcile-settle is x") && !operatorOutput.contains("LEDGER_RECONCILE_SETTLE"), "\(operatorOutput)")

        // A setting that goes with one given but is given neither way is named both ways.
        let (partial, partialOutput) = try await LedgerChild.run(
            ["serve", "--apple-api-key-id", "KEY123"], environment: ["LEDGER_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"],
            log: work.appendingPathComponent("3.log"))
        #expect(partial != 0)
        #expect(partialOutput.contains("--apple-api-issuer-id (or LEDGER_APPLE_API_ISSUER_ID) is missing"), "\(partialOutput)")
        #expect(partialOutput.contains("--apple-api-private-key (or LEDGER_APPLE_API_PRIVATE_KEY) is missing"), "\(partialOutput)")
    }

    @Test("a bad option's value is a usage error (64) with the command's own usage, before opening any database")
    func badValuesAreUsageErrors() async throws {
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-usage-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: work) }
        let environment = ["LEDGER_DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"]
        let cases: [([String], String, String)] = [
            (["report", "--format", "xml"], "--format must be csv or json", "ledger report reconciliation"),
            (["report", "apple", "--from", "2026-13-01"], "--from must be a day", "ledger report apple"),
            (["keys", "create", "--name", "k", "--scopes", "bogus"], "unknown scope bogus", "ledger keys create"),
            (["keys", "create", "--name", "k", "--scopes", ""], "--scopes names no scope", "ledger keys create"),
            (["keys", "create", "--name", "two\nlines", "--scopes", "read"], "--name: a key name has 1 to 128 characters, none a control character", "ledger keys create"),
            (["products", "set", "--product", "p", "--status", "gone"], "--status must be active or retired", "ledger products set"),
            // Padded ids, refused as the routes refuse them: no order names them.
            (["products", "set", "--product", " p"], "--product is \" p\", with white space at its start or end", "ledger products set"),
            (["lookup", "MQ7CLI", "--user", "u "], "--user is \"u \", with white space at its start or end", "ledger lookup"),
            (["recover", "--user", "u "], "--user is \"u \", with white space at its start or end", "ledger recover"),
            (["demo", "--users=-1"], "--users must be at least 1", "ledger demo"),
            (["backfill", "notifications", "--since", "2099-01-01"], "--since is 2099-01-01, after now: Apple's history ends now", "ledger backfill notifications"),
            (["apps", "set", "--bundle-id", "com.example.x", "--clear", "sku", "--sku", "X"], "--clear sku and --sku contradict each other; give one", "ledger apps set"),
        ]
        // A data directory that is a file is named as the setting, not as Foundation's error.
        let file = work.appendingPathComponent("a-file")
        try Data().write(to: file)
        let (dataDir, dataDirOutput) = try await LedgerChild.run(
            ["keys", "list", "--data-dir", file.path], environment: [:], log: work.appendingPathComponent("datadir.log"))
        #expect(dataDir == 1 && dataDirOutput.contains("the data directory \(file.path) (LEDGER_DATA_DIR, --data-dir) is a file, not a folder"), "\(dataDirOutput)")
        // A time no date can be: refused with the settings, not by PostgreSQL later.
        let (long, longOutput) = try await LedgerChild.run(
            ["recover", "--recovery-after", "9223372036854775807"], environment: environment, log: work.appendingPathComponent("long.log"))
        #expect(long != 0 && longOutput.contains("--recovery-after is 9223372036854775807, not a whole number of seconds (0 to 315360000, ten years)"), "\(longOutput)")
        for (index, (arguments, problem, command)) in cases.enumerated() {
            let (status, output) = try await LedgerChild.run(arguments, environment: environment, log: work.appendingPathComponent("\(index).log"))
            #expect(status == 64, "\(arguments): \(output)")
            #expect(output.contains("Error: \(problem)") && output.contains("Usage: \(command) "), "\(arguments): \(output)")
        }
        // A database that does not exist, or a server that refuses connections, is named at once
        // in PostgreSQL's or the network's words, not a minute later as a tripped pool.
        try await withTestDatabase { db in
            var missing = db.configuration
            missing.database = "no_such_database"
            let (status, output) = try await LedgerChild.run(
                ["keys", "list"], environment: ["LEDGER_DATABASE_URL": missing.url], log: work.appendingPathComponent("missing.log"))
            #expect(status == 1 && output.contains(#"database "no_such_database" does not exist (SQLSTATE 3D000)"#), "\(output)")
        }
        let (refused, refusedOutput) = try await LedgerChild.run(
            ["keys", "list"], environment: environment, log: work.appendingPathComponent("refused.log"))
        #expect(refused == 1 && refusedOutput.contains("the database could not be reached") && refusedOutput.contains("refused"), "\(refusedOutput)")
        // A port no TCP has is refused at once, not after a minute of failed connections.
        let (port, portOutput) = try await LedgerChild.run(
            ["keys", "list"], environment: ["LEDGER_DATABASE_URL": "postgres://nobody@127.0.0.1:99999/none"], log: work.appendingPathComponent("port.log"))
        #expect(port != 0 && portOutput.contains("has port 99999"), "\(portOutput)")
    }
}
