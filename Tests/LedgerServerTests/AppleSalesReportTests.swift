import AppleReceipts
import AppStoreStandIn
import Foundation
import LedgerServer
import LedgerCore
import LedgerJSON
import LedgerServices
import LedgerStore
import LedgerTestSupport
import Testing

/// Issue 42, point 3: Apple's daily sales beside the ledger's, per day (Pacific), app (its SKU),
/// product and storefront country, production only, each difference with its likely cause and
/// next step.
@Suite("Apple's sales beside the ledger")
struct AppleSalesReportTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("Apple counted one purchase more and a refund the ledger lacks; the sandbox, other apps, downloads, restores and free subscriptions stay out")
    func comparesPerDayAppProductAndCountry() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let (named, app) = try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["sku": "GAME1"])
            #expect(named == .ok && app["sku"] as? String == "GAME1", "\(app)")
            // Noon UTC three days ago: that morning in Pacific time, the report's day.
            let noon = Calendar(identifier: .gregorian).startOfDay(for: Date(timeIntervalSinceNow: -3 * 86_400)).addingTimeInterval(12 * 3600)
            let day = String(noon.formatted(Date.ISO8601FormatStyle()).prefix(10))
            // The storefront as Apple signs it (alpha-3); nil: one the ledger does not know, as of
            // a legacy receipt.
            let purchases: [(String, String, String?)] = [
                ("gems.100", "Production", "USA"), ("gems.100", "Production", "DEU"), ("gems.500", "Production", "USA"),
                ("gems.100", "Sandbox", "USA"), ("gems.1000", "Production", nil),
            ]
            for (index, (product, environment, storefront)) in purchases.enumerated() {
                let order = "s-\(index)"
                var body = newOrder(order, user: "u-\(index)", product: product)
                if product == "gems.500" { body["quantity"] = 2 }  // two units: Apple counts units
                try await http.send(.post, "/v1/orders", json: body)
                var transaction = TestApple.transaction("870000\(index)", product: product, environment: environment, purchaseDate: noon.addingTimeInterval(Double(index) * 60))
                transaction.storefront = storefront
                transaction.quantity = body["quantity"] as? Int ?? 1
                let jws = try await apple.sign(transaction)
                let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": order, "signedTransaction": jws])
                #expect(answer["outcome"] as? String == "matched", "\(answer)")
            }
            let tsv = AppStoreConnectStandIn.tsv([
                ("gems.100", "GAME1", "IA1", 2, "US"), ("gems.100", "GAME1", "IA1", 1, "DE"),
                ("gems.500", "GAME1", "IA1", 2, "US"), ("gems.500", "GAME1", "IA1", -1, "US"), ("gems.1000", "GAME1", "IA1", 1, "FR"),
                ("hints.10", "OTHER", "IA1", 5, "US"), ("GAME1", "", "1", 40, "US"),
                // Restored purchases and free subscriptions (Apple's IA3 and IAC, -M on a Mac): no sale.
                ("gems.100", "GAME1", "IA3", 6, "DE"), ("gems.100", "GAME1", "IAC", 4, "DE"), ("gems.100", "GAME1", "IAC-M", 2, "US"),
            ], day: day)
            #expect(try await recordReport(tsv, day: day, db) == .new)

            let (status, answer) = try await http.send(.get, "/v1/reports/apple?from=\(day)&to=\(day)")
            #expect(status == .ok, "\(answer)")
            let found = (answer["rows"] as? [[String: Any]] ?? []).map {
                [$0["productId"] as? String ?? "", $0["country"] as? String ?? "-", "\($0["applePurchases"] ?? "")", "\($0["ledgerPurchases"] ?? "")", "\($0["purchaseDifference"] ?? "")",
                 "\($0["appleRefunds"] ?? "")", "\($0["ledgerRefunds"] ?? "")", $0["cause"] as? String ?? ""]
            }
            #expect(found == [
                ["gems.100", "DE", "1", "1", "0", "0", "0", "agrees"],
                ["gems.100", "US", "2", "1", "1", "0", "0", "purchases Apple counted that the ledger never saw"],
                ["gems.1000", "FR", "1", "0", "1", "0", "0", "sales the ledger holds without a storefront account for it"],
                ["gems.1000", "-", "0", "1", "-1", "0", "0", "sales the ledger holds without a storefront (legacy receipts, imports)"],
                ["gems.500", "US", "2", "2", "0", "1", "0", "refunds Apple counted that the ledger did not record"],
            ], "\(answer)")
            let next = (answer["rows"] as? [[String: Any]] ?? []).dropFirst().first?["nextStep"] as? String ?? ""
            #expect(next.contains("history sweep"), "\(next)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM dashboards.apple_sales WHERE day = \(day)::date", as: Int.self) == 5)
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE storefront = 'DEU'", as: Int.self) == 1)

            // Another app may not take the SKU.
            let (taken, error) = try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.other", "sku": "GAME1"])
            #expect(taken == .conflict && errorOf(error)["code"] as? String == "sku-taken", "\(error)")
        }
    }

    @Test("a purchase waiting in the pool is one the ledger holds: the comparison says so, and no sweep is run for it")
    func pooledPurchaseHeld() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["sku": "GAME1"])
            let bought = Date(timeIntervalSinceNow: -120)
            let day = pacificDay(bought)
            // Paid, uploaded without an order: it waits in the pool.
            var purchase = TestApple.transaction("8800031", environment: "Production", purchaseDate: bought)
            purchase.storefront = "USA"
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-pooled", "signedTransaction": try await apple.sign(purchase)])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            let store = AppleSalesStore(database: db.database)
            try await recordReport(AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 1, "US")], day: day), day: day, db)
            let (_, answer) = try await http.send(.get, "/v1/reports/apple?from=\(day)&to=\(day)")
            let found = (answer["rows"] as? [[String: Any]] ?? []).map { "\($0["applePurchases"] ?? "") \($0["ledgerPurchases"] ?? "") \($0["cause"] ?? "")" }
            #expect(found == ["1 0 purchases the ledger holds in its pool, paid to no order yet"], "\(answer)")
            let next = (answer["rows"] as? [[String: Any]] ?? []).first?["nextStep"] as? String ?? ""
            #expect(next.contains("/v1/transactions/unmatched"), "\(next)")
            #expect(try await store.shortfalls(from: day, to: day) == [], "the ledger knows it: no sweep")
        }
    }

    @Test("a day whose extra purchase waits in the pool beside a sale without a storefront: the pool's cause, and no sweep")
    func pooledBesideUnplaced() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["sku": "GAME1"])
            let bought = Date(timeIntervalSinceNow: -120)
            let day = pacificDay(bought)
            var pooledPurchase = TestApple.transaction("8800071", environment: "Production", purchaseDate: bought)
            pooledPurchase.storefront = "USA"
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-pool", "signedTransaction": try await apple.sign(pooledPurchase)])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            // A sale Apple signed no storefront for, paid to its order.
            try await http.send(.post, "/v1/orders", json: newOrder("o-unplaced", user: "u-paid"))
            var unplaced = TestApple.transaction("8800072", environment: "Production", purchaseDate: bought)
            unplaced.storefront = nil
            let (_, paid) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-unplaced", "signedTransaction": try await apple.sign(unplaced)])
            #expect(paid["outcome"] as? String == "matched", "\(paid)")
            try await recordReport(AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 2, "US")], day: day), day: day, db)
            let (_, answer) = try await http.send(.get, "/v1/reports/apple?from=\(day)&to=\(day)")
            let us = (answer["rows"] as? [[String: Any]] ?? []).first { $0["country"] as? String == "US" } ?? [:]
            #expect(us["cause"] as? String == "purchases the ledger holds in its pool, paid to no order yet", "\(answer)")
            #expect(try await AppleSalesStore(database: db.database).shortfalls(from: day, to: day) == [], "the ledger holds both: no sweep")
        }
    }

    @Test("an order's refund that arrived before the reversal of an earlier one counts beside Apple's, once each: two refunds")
    func orderRefundsOutOfOrderCountTwice() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let now = Date()
            try await http.send(.post, "/v1/orders", json: newOrder("o-twice", user: "u-twice"))
            var purchase = TestApple.transaction("8800081", environment: "Production", purchaseDate: now.addingTimeInterval(-600))
            purchase.storefront = "USA"
            let (_, paid) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-twice", "signedTransaction": try await apple.sign(purchase)])
            #expect(paid["outcome"] as? String == "matched", "\(paid)")
            func refund(at date: Date) async throws -> String {
                var revoked = purchase
                revoked.revocationDate = date.millisecondsSince1970
                return try await apple.notification("REFUND", transaction: revoked, environment: "Production", signedDate: date)
            }
            // The second refund first, the first, then the first's reversal.
            try await http.notifyAppleTaken(try await refund(at: now.addingTimeInterval(-100)))
            try await http.notifyAppleTaken(try await refund(at: now.addingTimeInterval(-300)))
            try await http.notifyAppleTaken(try await apple.notification(
                "REFUND_REVERSED", transaction: purchase, environment: "Production", signedDate: now.addingTimeInterval(-200)))
            #expect(try await http.send(.get, "/v1/orders/o-twice").1["state"] as? String == "refunded")
            let (from, to) = (pacificDay(now.addingTimeInterval(-300)), pacificDay(now.addingTimeInterval(-100)))
            #expect(try await scalar(db, "SELECT sum(ledger_refunds)::int FROM ledger_apple_sales(\(from)::date, \(to)::date)", as: Int.self) == 2)
        }
    }

    @Test("the comparison's default days are Pacific days, as Apple's reports count them: yesterday there is the last")
    func defaultDaysArePacific() throws {
        // 03:00 UTC on the 27th is 19:00 on the 26th in Los Angeles: Apple's last day is the 25th.
        let now = try #require(EventCoding.parseDate("2026-11-27T03:00:00Z"))
        let (from, to) = try ReportPeriod.days(from: nil, to: nil, now: now)
        #expect(from == "2026-10-27" && to == "2026-11-25", "\(from) \(to)")
        let (_, given) = try ReportPeriod.days(from: "2026-11-01", to: "2026-11-26", now: now)
        #expect(given == "2026-11-26")
        // A from of UTC's yesterday, without a to: that day alone, as before, not a refusal.
        let (day, end) = try ReportPeriod.days(from: "2026-11-26", to: nil, now: now)
        #expect(day == "2026-11-26" && end == "2026-11-26")
    }

    @Test("a purchase refunded while it waited in the pool: the ledger saw the sale and its refund, as Apple counts them, and the day agrees")
    func pooledPurchaseRefunded() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["sku": "GAME1"])
            let bought = Date(timeIntervalSinceNow: -120)
            let day = pacificDay(bought)
            var purchase = TestApple.transaction("8800041", environment: "Production", purchaseDate: bought)
            purchase.storefront = "USA"
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-pooled-r", "signedTransaction": try await apple.sign(purchase)])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            // Refunded before any order took it (revoked at its purchase's instant: the same day in every time zone).
            var refunded = purchase
            refunded.revocationDate = bought.millisecondsSince1970
            refunded.revocationReason = 1
            let (status, _) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded, environment: "Production"))
            #expect(status == .ok)
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '8800041'", as: String.self) == "refunded")

            let store = AppleSalesStore(database: db.database)
            try await recordReport(AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 1, "US"), ("gems.100", "GAME1", "IA1", -1, "US")], day: day), day: day, db)
            let (_, answer) = try await http.send(.get, "/v1/reports/apple?from=\(day)&to=\(day)")
            let found = (answer["rows"] as? [[String: Any]] ?? []).map {
                "\($0["applePurchases"] ?? "") \($0["ledgerPurchases"] ?? "") \($0["appleRefunds"] ?? "") \($0["ledgerRefunds"] ?? "") \($0["cause"] ?? "")"
            }
            #expect(found == ["1 1 1 1 agrees"], "\(answer)")
            #expect(try await store.shortfalls(from: day, to: day) == [], "nothing to sweep for")
        }
    }

    @Test("a pooled purchase refunded, reversed, refunded again, then told its first refund late: each refund counts once, on its day, as an order's")
    func pooledRefundToldLate() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let bought = Date(timeIntervalSinceNow: -3 * 86_400)
            var purchase = TestApple.transaction("8800051", environment: "Production", purchaseDate: bought)
            purchase.storefront = "USA"
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-pooled-late", "signedTransaction": try await apple.sign(purchase)])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            func status() async throws -> String? {
                try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '8800051'", as: String.self)
            }
            var first = purchase
            first.revocationDate = bought.millisecondsSince1970
            first.revocationReason = 1
            var second = purchase
            let refundedAgain = Date(timeIntervalSinceNow: -60)
            second.revocationDate = refundedAgain.millisecondsSince1970
            second.revocationReason = 1
            // Refunded, reversed an hour later, refunded again a minute ago.
            let reversed = bought.addingTimeInterval(3600)
            for (type, transaction, signed) in [("REFUND", first, bought), ("REFUND_REVERSED", first, reversed), ("REFUND", second, refundedAgain)] {
                let after = type == "REFUND" ? "refunded" : "unmatched"
                let (code, _) = try await http.notifyApple(
                    try await apple.notification(type, transaction: transaction, environment: "Production", signedDate: signed))
                #expect(code == .ok)
                #expect(try await status() == after, "after \(type)")
            }
            // The first refund's notification, signed before the reversal, arrives last (as one
            // whose UUID the log does not hold: Apple's retries and history resend it).
            let (code, _) = try await http.notifyApple(
                try await apple.notification("REFUND", transaction: first, environment: "Production", signedDate: bought.addingTimeInterval(1800)))
            #expect(code == .ok)
            #expect(try await status() == "refunded")
            #expect(try await scalar(db, """
                SELECT count(*)::int FROM events WHERE stream_id = 'transaction-8800051' AND type = 'notification-received'
                   AND (data ->> 'reversedBefore')::boolean
                """, as: Int.self) == 1, "the late copy is recorded as reversed before it arrived")

            let (from, to) = (pacificDay(bought), pacificDay(refundedAgain))
            #expect(from != to)
            let rows = try await db.client.query(
                "SELECT day::text, ledger_refunds FROM ledger_apple_sales(\(from)::date, \(to)::date) WHERE ledger_refunds > 0 ORDER BY day",
                logger: TestServer.logger)
            var refunds: [String] = []
            for try await (day, count) in rows.decode((String, Int).self) { refunds.append("\(day) \(count)") }
            #expect(refunds == ["\(from) 1", "\(to) 1"], "each refund Apple made, the reversed one too; the late copy not again")
        }
    }

    @Test("a pooled purchase's partial refund counts the units Apple refunded: a third of three is one")
    func pooledPartialRefundUnits() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            var purchase = TestApple.transaction("8800061", environment: "Production", purchaseDate: Date(timeIntervalSinceNow: -3600))
            purchase.quantity = 3
            purchase.storefront = "DEU"
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-thirds", "signedTransaction": try await apple.sign(purchase)])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            var refunded = purchase
            let when = Date(timeIntervalSinceNow: -60)
            refunded.revocationDate = when.millisecondsSince1970
            refunded.revocationType = "REFUND_PRORATED"
            refunded.revocationPercentage = 33_333
            try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await apple.sign(refunded)])
            let day = pacificDay(when)
            #expect(try await scalar(db, "SELECT sum(ledger_refunds)::int FROM ledger_apple_sales(\(day)::date, \(day)::date)", as: Int.self) == 1)
        }
    }

    /// Issue 42, point 4.
    @Test("where Apple counted a purchase more, the sweep of the users with open orders of the product finds it, and the comparison then agrees and says so")
    func shortfallSweeps() async throws {
        let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
        try await withAppleAPIApplication(apple, standIn, configure: { bothEnvironments(&$0); olderPurchases(&$0); $0.recoveryAfter = 0 }) { http, db, base in
            try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["sku": "GAME1"])
            let bought = Date(timeIntervalSinceNow: -120)
            let day = pacificDay(bought)
            // u-1's purchase reached the ledger; u-2's client paid and never sent its own.
            try await http.send(.post, "/v1/orders", json: newOrder("sf-1", user: "sf-u1"))
            let sent = try await apple.sign(TestApple.transaction("8800001", environment: "Production", purchaseDate: bought))
            let (_, matched) = try await http.send(.post, "/v1/receipts", json: ["orderId": "sf-1", "signedTransaction": sent])
            #expect(matched["outcome"] as? String == "matched", "\(matched)")
            let (_, open) = try await http.send(.post, "/v1/orders", json: newOrder("sf-2", user: "sf-u2"))
            let token = try #require((open["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            try await http.send(.post, "/v1/users/sf-u2/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("acct-sf2"))])
            var lost = TestApple.transaction("8800002", environment: "Production", appAccountToken: token, purchaseDate: bought)
            lost.appTransactionId = "acct-sf2"
            await standIn.setHistory("acct-sf2", [.init(revision: "sf1", hasMore: false, signedTransactions: [try await apple.sign(lost)])])
            // A user with an open order of another product: not swept.
            try await http.send(.post, "/v1/orders", json: newOrder("sf-3", user: "sf-u3", product: "gems.500"))
            try await http.send(.post, "/v1/users/sf-u3/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("acct-sf3"))])

            // Another app, without an App Store Server API key: its shortfall is not swept.
            #expect(try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.nokey", "sku": "GAME2"]).0 == .created)
            try await recordReport(AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 2, "US"), ("gems.100", "GAME2", "IA1", 1, "US")], day: day), day: day, db)
            let (_, before) = try await http.send(.get, "/v1/reports/apple?from=\(day)&to=\(day)")
            let shortfall = (before["rows"] as? [[String: Any]] ?? []).map { "\($0["applePurchases"] ?? "") \($0["ledgerPurchases"] ?? "") \($0["sweep"] ?? "")" }
            #expect(shortfall == ["2 1 ", "1 0 "], "\(before)")

            var configuration = trusting(apple)
            bothEnvironments(&configuration)
            olderPurchases(&configuration)
            configuration.recoveryAfter = 0
            let sweep = configuration.salesShortfallSweep(
                secondServer(db), api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base, timeout: .seconds(60)), logger: TestServer.logger),
                verifier: try configuration.apple.verifier(logger: TestServer.logger), logger: TestServer.logger)
            // A fetch that stored the days either side of it (the day itself stored before) sweeps neither it nor them.
            let around = [pacificDay(bought.addingTimeInterval(-86_400)), pacificDay(bought.addingTimeInterval(86_400))]
            #expect(try await sweep.run(days: around).isEmpty, "only the days a fetch stored are swept")
            #expect(await standIn.historyQueries.isEmpty)
            let swept = try await sweep.run(from: day, to: day)
            var notSwept = SalesShortfallSweep.Swept(day: day, bundleId: "com.example.nokey", productId: "gems.100", missing: 1, users: 0, accounts: 0, found: 0, failed: 0)
            notSwept.noKey = true
            #expect(swept == [.init(day: day, bundleId: TestApple.bundleId, productId: "gems.100", missing: 1, users: 1, accounts: 1, found: 1, failed: 0), notSwept], "\(swept)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_sales_sweeps WHERE bundle_id = 'com.example.nokey'", as: Int.self) == 0, "no sweep said to have run")
            #expect(await standIn.historyQueries.count == 1, "only the account of the user with an open order of the product")
            let (_, order) = try await http.send(.get, "/v1/orders/sf-2")
            #expect(order["state"] as? String == "verified" && order["transactionId"] as? String == "8800002", "\(order)")

            let (_, after) = try await http.send(.get, "/v1/reports/apple?from=\(day)&to=\(day)")
            let row = (after["rows"] as? [[String: Any]] ?? []).first { $0["bundleId"] as? String == TestApple.bundleId } ?? [:]
            #expect(row["applePurchases"] as? Int == 2 && row["ledgerPurchases"] as? Int == 2 && row["cause"] as? String == "agrees", "\(after)")
            #expect((row["sweep"] as? String)?.hasPrefix("swept 1 user(s), 1 Apple account(s) at ") == true, "\(row)")
            #expect((row["sweep"] as? String)?.hasSuffix(": 1 transaction(s) new to the ledger") == true, "\(row)")
            // Nothing short any more but the app that cannot ask Apple: a second run sweeps nothing.
            #expect(try await sweep.run(from: day, to: day) == [notSwept])
        }
    }

    /// Issue 42, point 1's background job, with point 4.
    @Test("inside ledger serve, the background fetch asks until Apple publishes the day, stores it, and sweeps where Apple counted more")
    func backgroundFetch() async throws {
        let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
        let connect = AppStoreConnectStandIn()
        let day = SalesReportFetch.lastPublishedDay()
        await connect.setUnpublished(day)
        let keyFile = NSTemporaryDirectory() + "connect-key-\(UUID()).p8"
        try connect.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: keyFile) }
        try await connect.run { connectURL in
            try await withAppleAPIApplication(apple, standIn, configure: { configuration in
                bothEnvironments(&configuration)
                olderPurchases(&configuration)
                configuration.recoveryAfter = 0
                var settings = LedgerConfiguration.AppStoreConnect(
                    issuerID: AppStoreConnectStandIn.issuerID, keyID: AppStoreConnectStandIn.keyID, privateKeyFile: keyFile, vendorNumber: connect.vendorNumber)
                settings.url = connectURL
                configuration.appStoreConnect = settings
                configuration.salesFetchInterval = 1
            }) { http, db, _ in
                try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["sku": "GAME1"])
                // Yesterday morning (Pacific) the user ordered and paid; the client never sent it.
                var pacific = Calendar(identifier: .gregorian)
                pacific.timeZone = TimeZone(identifier: "America/Los_Angeles")!
                let parts = day.split(separator: "-").compactMap { Int($0) }
                let morning = try #require(pacific.date(from: DateComponents(year: parts[0], month: parts[1], day: parts[2], hour: 9)))
                let order = try await secondServer(db).orders.create(
                    OrderID(unchecked: "bg-1"), OrderCreated(userId: UserID(unchecked: "bg-u1"), productId: ProductID(unchecked: "gems.100"),
                                                             bundleId: BundleID(unchecked: TestApple.bundleId), createdAt: morning),
                    tokenGiven: false, metadata: Data(#"{"appendedBy":"test"}"#.utf8)).order
                try await http.send(.post, "/v1/users/bg-u1/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("acct-bg"))])
                var lost = TestApple.transaction("8900001", environment: "Production", appAccountToken: order.appAccountToken, purchaseDate: morning.addingTimeInterval(60))
                lost.appTransactionId = "acct-bg"
                await standIn.setHistory("acct-bg", [.init(revision: "bg1", hasMore: false, signedTransactions: [try await apple.sign(lost)])])
                await connect.setReport(day, tsv: AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 1, "US")], day: day))
                // Published only once a run asked for it and found it not published (stored nothing).
                var asked = false
                for _ in 0..<2400 where !asked {
                    try await Task.sleep(for: .milliseconds(50))
                    asked = await connect.asked.contains(day)
                }
                #expect(asked, "a background run asked for the day within 2 minutes")
                #expect(try await scalar(db, "SELECT count(*)::int FROM apple_sales_reports WHERE report_date = \(day)::date", as: Int.self) == 0)
                await connect.publish(day)
                // However slow the machine: the test's whole run has its own time limit.
                var swept = 0
                for _ in 0..<2400 where swept == 0 {
                    try await Task.sleep(for: .milliseconds(50))
                    swept = try await scalar(db, "SELECT count(*)::int FROM apple_sales_sweeps WHERE day = \(day)::date AND found = 1", as: Int.self) ?? 0
                }
                #expect(swept == 1, "the background fetch stored the day and swept within 2 minutes")
                let (_, paid) = try await http.send(.get, "/v1/orders/bg-1")
                #expect(paid["state"] as? String == "verified" && paid["transactionId"] as? String == "8900001", "\(paid)")
                let (_, report) = try await http.send(.get, "/v1/reports/apple?from=\(day)&to=\(day)")
                let row = (report["rows"] as? [[String: Any]] ?? []).first ?? [:]
                #expect(row["cause"] as? String == "agrees" && (row["sweep"] as? String ?? "").contains("1 transaction(s) new"), "\(report)")
                #expect(await connect.asked.filter { $0 == day }.count >= 2, "asked while unpublished, then again")
            }
        }
    }

    @Test("a subscription renewal's refund is on the ledger's side of its refund day: Apple's refund line agrees")
    func renewalRefund() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["sku": "GAME1"])
            let services = secondServer(db)
            // Bought through an order in the United States; its renewal refunded today.
            try await http.send(.post, "/v1/orders", json: ["orderId": "sub-r", "userId": "su-r", "productId": "pro.monthly", "price": "9.99", "currency": "USD"])
            var periods = (0..<2).map { SubscriptionFixture.signed("9400001", period: $0) }
            periods[0].storefront = "USA"
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "sub-r", "signedTransaction": try await apple.sign(periods[0])])
            #expect(answer["state"] as? String == "verified", "\(answer)")
            try await SubscriptionFixture.record(services, periods, user: "su-r")
            try await SubscriptionFixture.refund(services, periods[1])

            let day = pacificDay(Date())
            let tsv = AppStoreConnectStandIn.tsv([("pro.monthly", "GAME1", "IAY", -1, "US")], day: day)
            let report = try AppleSalesReport(file: Data(tsv.utf8))
            let rows = report.rows.map {
                AppleSalesStore.Row(sku: $0.sku, parentIdentifier: $0.parentIdentifier, productType: $0.productType, units: $0.units, countryCode: $0.countryCode, values: $0.values)
            }
            #expect(try await AppleSalesStore(database: db.database).record(vendor: "85000000", day: day, version: "1_0", file: Data(tsv.utf8), header: report.header, rows: rows) == .new)
            let (status, compared) = try await http.send(.get, "/v1/reports/apple?from=\(day)&to=\(day)")
            #expect(status == .ok, "\(compared)")
            let found = (compared["rows"] as? [[String: Any]] ?? []).map {
                [$0["productId"] as? String ?? "", $0["country"] as? String ?? "-", "\($0["appleRefunds"] ?? "")", "\($0["ledgerRefunds"] ?? "")", $0["cause"] as? String ?? ""]
            }
            #expect(found == [["pro.monthly", "US", "1", "1", "agrees"]], "\(compared)")
        }
    }

    @Test("refunds count as Apple counts units: a third of an order of three is one, a renewal refund reversed since still counts, a renewal an order holds counts once")
    func refundsAsAppleCountsThem() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["sku": "GAME1"])
            let services = secondServer(db)
            let now = Date()
            // Three gems.100 bought in the United States; Apple refunds one of them.
            var body = newOrder("three", user: "u-3")
            body["quantity"] = 3
            try await http.send(.post, "/v1/orders", json: body)
            var three = TestApple.transaction("8710001", environment: "Production", purchaseDate: now.addingTimeInterval(-7200))
            three.storefront = "USA"
            three.quantity = 3
            let (_, bought) = try await http.send(.post, "/v1/receipts", json: ["orderId": "three", "signedTransaction": try await apple.sign(three)])
            #expect(bought["state"] as? String == "verified", "\(bought)")
            three.revocationDate = now.millisecondsSince1970
            three.revocationReason = 0
            three.revocationType = "REFUND_PRORATED"
            three.revocationPercentage = 33_333
            #expect(try await http.notifyApple(try await apple.notification("REFUND", transaction: three, environment: "Production")).0 == .ok)

            // pro.monthly: a renewal refunded and the refund reversed; another subscription's
            // renewal, held by the backend's own order, refunded.
            for original in ["9400101", "9400201"] {
                try await http.send(.post, "/v1/orders", json: ["orderId": "s-\(original)", "userId": "su-\(original)", "productId": "pro.monthly", "price": "9.99", "currency": "USD"])
                var periods = (0..<2).map { SubscriptionFixture.signed(original, period: $0) }
                periods[0].storefront = "USA"
                periods[1].storefront = "USA"
                let (_, started) = try await http.send(.post, "/v1/receipts", json: ["orderId": "s-\(original)", "signedTransaction": try await apple.sign(periods[0])])
                #expect(started["state"] as? String == "verified", "\(started)")
                if original == "9400201" {
                    try await SubscriptionFixture.heldByOwnOrder(http, "held-\(original)", user: "su-\(original)", renewal: periods[1], storefront: "USA")
                }
                try await SubscriptionFixture.record(services, periods, user: "su-\(original)")
                var refunded = periods[1]
                refunded.revocationDate = now.millisecondsSince1970
                refunded.revocationType = "REFUND_FULL"
                #expect(try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded, environment: "Production")).0 == .ok)
                if original == "9400101" {
                    let (reversed, answer) = try await http.notifyApple(try await apple.notification("REFUND_REVERSED", transaction: periods[1], environment: "Production"))
                    #expect(reversed == .ok && answer["type"] as? String == "subscription-period-refund-reversed", "\(answer)")
                }
            }
            #expect(try await scalar(db, "SELECT state FROM orders WHERE order_id = 'held-9400201'", as: String.self) == "refunded")

            let day = pacificDay(now)
            let tsv = AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", -1, "US"), ("pro.monthly", "GAME1", "IAY", -2, "US")], day: day)
            #expect(try await recordReport(tsv, day: day, db) == .new)
            let (status, compared) = try await http.send(.get, "/v1/reports/apple?from=\(day)&to=\(day)")
            #expect(status == .ok, "\(compared)")
            let refunds = (compared["rows"] as? [[String: Any]] ?? []).filter { $0["country"] as? String == "US" }.map {
                [$0["productId"] as? String ?? "", "\($0["appleRefunds"] ?? "")", "\($0["ledgerRefunds"] ?? "")"]
            }
            #expect(refunds == [["gems.100", "1", "1"], ["pro.monthly", "2", "2"]], "\(compared)")
        }
    }

    /// Apple's report of `day` (its TSV), stored as the sales fetch stores it.
    @discardableResult
    func recordReport(_ tsv: String, day: String, _ db: TestDatabase) async throws -> AppleSalesStore.Recorded {
        let file = Data(tsv.utf8)
        let report = try AppleSalesReport(file: file)
        let rows = report.rows.map {
            AppleSalesStore.Row(sku: $0.sku, parentIdentifier: $0.parentIdentifier, productType: $0.productType, units: $0.units, countryCode: $0.countryCode, values: $0.values)
        }
        return try await AppleSalesStore(database: db.database).record(vendor: "85000000", day: day, version: "1_0", file: file, header: report.header, rows: rows)
    }

    /// `date`'s day in Pacific time, as Apple's reports count.
    func pacificDay(_ date: Date) -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "America/Los_Angeles")!
        let parts = calendar.dateComponents([.year, .month, .day], from: date)
        return String(format: "%04d-%02d-%02d", parts.year!, parts.month!, parts.day!)
    }
}
