import AppleReceipts
import AppStoreStandIn
import Foundation
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore
import Logging

extension Demo {
    /// Finance against Apple (docs/finance.md): yesterday, in Pacific time, two users each paid
    /// for a starter pack; one client never sent its purchase. App Store Connect's sales report
    /// of the day (from a stand-in) counts two, the ledger one. The fetch stores the report, the
    /// comparison names the shortfall, the sweep of the users with open orders of the product
    /// finds the lost purchase in Apple's history, and the comparison then agrees.
    static func playSales(
        _ story: inout DemoStory, configuration: LedgerConfiguration, services: ServiceAssembly, logger: Logger
    ) async throws {
        let day = SalesReportFetch.lastPublishedDay()
        var pacific = Calendar(identifier: .gregorian)
        pacific.timeZone = TimeZone(identifier: "America/Los_Angeles") ?? .gmt
        let parts = day.split(separator: "-").compactMap { Int($0) }
        let morning = pacific.date(from: DateComponents(year: parts[0], month: parts[1], day: parts[2], hour: 10)) ?? Date()
        _ = try await story.requestJSON("PATCH", "/v1/apps/\(Demo.bundleId)", body: #"{"sku":"DEMOGAME"}"#)
        for (index, lost) in [false, true].enumerated() {
            let user = "demo-sales-user-\(index)"
            let account = try await story.logIn(user, account: "demo-sales-account-\(index)")
            // Yesterday's orders are the ledger's own, made then (recorded here with their time).
            let orderId = "\(user)-starter"
            let created = try await story.history(OrderID(unchecked: orderId), OrderCreated(
                userId: UserID(unchecked: user), productId: ProductID(unchecked: "gems.500"), price: "4.99", currency: "USD",
                bundleId: BundleID(unchecked: Demo.bundleId), createdAt: morning.addingTimeInterval(Double(index) * 600)))
            let transactionId = "95000000\(index)"
            let payload = SignedTransactionPayload(
                transactionId: transactionId, originalTransactionId: transactionId, bundleId: Demo.bundleId, productId: "gems.500",
                purchaseDate: morning.addingTimeInterval(Double(index) * 600 + 60).millisecondsSince1970, signedDate: Date().millisecondsSince1970,
                environment: "Production", appAccountToken: created.appAccountToken.uuidString.lowercased(), appTransactionId: account,
                price: 4990, currency: "USD", storefront: "USA")
            let jws = try story.chain.sign(payload)
            if lost {
                // The client crashed before it sent the purchase: only Apple's history has it.
                await story.standIn.setHistory(account, [.init(revision: "\(account)-1", hasMore: false, signedTransactions: [jws])])
            } else {
                let answer = try await story.upload(DemoStory.Pending(transactionId: transactionId, orderId: orderId, user: user, jws: jws, lost: false, payload: payload))
                _ = try await story.deliverIfMatched(answer)
            }
        }

        let connect = AppStoreConnectStandIn()
        await connect.setReport(day, tsv: AppStoreConnectStandIn.tsv([("gems.500", "DEMOGAME", "IA1", 2, "US"), ("DEMOGAME", "", "1", 9, "US")], day: day))
        let keyFile = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-demo-connect-\(getpid()).p8").path
        try connect.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: keyFile) }
        let fetched = try await connect.run { baseURL in
            var configuration = configuration
            var settings = LedgerConfiguration.AppStoreConnect(
                issuerID: AppStoreConnectStandIn.issuerID, keyID: AppStoreConnectStandIn.keyID, privateKeyFile: keyFile, vendorNumber: connect.vendorNumber)
            settings.url = baseURL
            configuration.appStoreConnect = settings
            return try await configuration.salesReportFetch(services, logger: logger)?.run(from: day, to: day)
        }
        let database = services.database
        let apps = AppDirectory(catalog: AppCatalog(database: database), maximumAge: .seconds(configuration.appsMaximumAge), logger: logger)
        let api = LazyAppStoreServerAPI(catalog: AppCatalog(database: database), hosts: configuration.apple.appStoreServerAPIHosts(), logger: logger)
        let verifier = try configuration.apple.verifier(logger: logger).choosingApps(from: apps)
        let before = try await Self.salesRows(story, day)
        let swept = try await configuration.salesShortfallSweep(services, api: api, verifier: verifier, logger: logger).run(from: day, to: day)
        let after = try await Self.salesRows(story, day)
        story.salesSummary = ["Apple's sales report of \(day) (App Store Connect, as `ledger sales fetch` gets it): \(fetched?.new.count ?? 0) day stored; the comparison (GET /v1/reports/apple):"]
        story.salesSummary += before.map { "  before: \($0)" }
        story.salesSummary += swept.map {
            "  sweep of \($0.productId) on \($0.day): Apple counted \($0.missing) more; \($0.users) user(s) with open orders, \($0.accounts) Apple account(s): \($0.found) purchase(s) new to the ledger"
        }
        story.salesSummary += after.map { "  after: \($0)" }
    }

    /// The comparison's rows of `day`, one line each.
    static func salesRows(_ story: DemoStory, _ day: String) async throws -> [String] {
        let answer = try await story.requestJSON("GET", "/v1/reports/apple?from=\(day)&to=\(day)")
        return (answer["rows"] as? [[String: Any]] ?? []).map { row in
            let next = row["nextStep"] as? String ?? ""
            return "\(row["productId"] as? String ?? "?") \(row["country"] as? String ?? "-"): Apple \(row["applePurchases"] as? Int ?? 0), ledger \(row["ledgerPurchases"] as? Int ?? 0) — \(row["cause"] as? String ?? "?")\(next.isEmpty ? "" : " → \(next)")"
        }
    }
}
