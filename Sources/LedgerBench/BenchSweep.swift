import AppleReceipts
import AppStoreStandIn
import ArgumentParser
import Foundation
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore
import Logging
import PostgresNIO

/// `ledger-bench sweep`: history sweeps against the stand-in App Store Server API (in this
/// process, as Apple is unreachable here): accounts linked by users with two open orders each,
/// each account's history one page of signed transactions, one of them the order's (tied by its
/// token), the others new to the ledger (pooled). Measured: a first sweep (everything ingested)
/// and a second (nothing new), against a baseline in the same run: the same pages fetched and
/// verified by the same client with nothing ingested.
struct BenchSweep: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "sweep", abstract: "History sweeps against a stand-in App Store Server API.")

    @OptionGroup var options: BenchOptions
    @Option(help: "Apple accounts, each linked by a user with an open order")
    var accounts = 2_000
    @Option(help: "Signed transactions in each account's history")
    var transactions = 3
    @Option(help: "App Store Server API requests per second (LEDGER_APPLE_API_RATE; Apple's default pace is 10)")
    var rate = 1_000.0

    static let bundleId = BenchReceipts.bundleId

    func run() async throws {
        let logger = benchLogger
        try await options.withBenchDatabase { benchConfiguration in
            let work = try BenchServerChild.workDirectory("sweep")
            defer { try? FileManager.default.removeItem(at: work) }
            let (chain, rootFile) = try BenchReceipts.signingChain(in: work)
            var settings = LedgerConfiguration()
            settings.apple.rootCertificateFiles = [rootFile]
            settings.apple.bundleID = Self.bundleId
            settings.apple.environments = [.sandbox]
            settings.recoveryAfter = 0
            let verifier = try settings.apple.verifier(logger: logger)
            let ledgerSettings = settings
            let standIn = AppStoreServerStandIn(bundleID: Self.bundleId)
            let (accounts, transactions, rate) = (accounts, transactions, rate)

            let rows = try await withPostgresClient(benchConfiguration, logger: logger) { client in
                let database = Database(client: client, logger: logger)
                let services = ServiceAssembly(database: database)
                try await Self.prepare(accounts: accounts, transactions: transactions, chain: chain, standIn: standIn, services: services)
                return try await standIn.run { base in
                    let api = LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base, requestsPerSecond: rate, timeout: .seconds(30)), logger: logger)
                    let sweep = ledgerSettings.historySweep(services, api: api, verifier: verifier)
                    let ids = (0..<accounts).map { "bench-account-\($0)" }
                    let fetched = try await Self.fetchOnly(ids, api: api, verifier: verifier, atOnce: sweep.accountsAtOnce)
                    let first = try await sweep.run()
                    let second = try await sweep.run()
                    return [("fetch and verify only (baseline)", accounts, accounts * transactions, 0, fetched),
                            ("first sweep (all new)", first.accounts, first.transactions, first.ingested.values.reduce(0, +), first.seconds),
                            ("second sweep (nothing new)", second.accounts, second.transactions, second.ingested.values.reduce(0, +), second.seconds)]
                }
            }
            print("History sweeps against the stand-in App Store Server API (\(accounts) accounts, \(transactions) transactions each, \(format(rate)) requests/s allowed)")
            printTableHeader(["run", "accounts", "transactions", "ingested", "seconds", "accounts/s", "of baseline"], leftAligned: [0])
            let baseline = Double(rows[0].1) / rows[0].4
            for (name, swept, seen, ingested, seconds) in rows {
                let perSecond = Double(swept) / seconds
                printTableRow([name, "\(swept)", "\(seen)", "\(ingested)", format(seconds, decimals: 2), format(perSecond), format(perSecond / baseline, decimals: 2)])
            }
        }
    }

    /// One user, open order and linked account per account; its history at the stand-in.
    static func prepare(
        accounts: Int, transactions: Int, chain: ThrowawaySigningChain, standIn: AppStoreServerStandIn, services: ServiceAssembly
    ) async throws {
        let links = services.accounts
        let metadata = Data(#"{"appendedBy":"bench"}"#.utf8)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<16 {
                group.addTask {
                    for index in stride(from: worker, to: accounts, by: 16) {
                        let user = try UserID("sweep-user-\(index)")
                        let account = "bench-account-\(index)"
                        let created = try await services.orders.create(
                            try OrderID("sweep-order-\(index)"), OrderCreated(userId: user, productId: try ProductID("gems.100")),
                            tokenGiven: false, metadata: metadata)
                        // Still open after the sweep: the account stays due for the second.
                        _ = try await services.orders.create(
                            try OrderID("sweep-open-\(index)"), OrderCreated(userId: user, productId: try ProductID("gems.500")),
                            tokenGiven: false, metadata: metadata)
                        _ = try await links.link(
                            AppleAccount(appTransactionId: try AppTransactionID(account), environment: "Sandbox", bundleId: bundleId), to: user, metadata: metadata)
                        let now = Date().addingTimeInterval(-60).millisecondsSince1970
                        var signed: [String] = []
                        for number in 0..<transactions {
                            let id = "\(index)0\(number)"
                            signed.append(try chain.sign(SignedTransactionPayload(
                                transactionId: id, originalTransactionId: id, bundleId: bundleId, productId: number == 0 ? "gems.100" : "coins.\(number)",
                                purchaseDate: now, signedDate: now, environment: "Sandbox",
                                appAccountToken: number == 0 ? created.order.appAccountToken.uuidString.lowercased() : nil, appTransactionId: account)))
                        }
                        await standIn.setHistory(account, [.init(revision: "\(account)-1", hasMore: false, signedTransactions: signed)])
                    }
                }
            }
            try await group.waitForAll()
        }
    }

    /// The baseline: every account's page fetched and its transactions verified, nothing stored,
    /// `atOnce` accounts at a time as the sweep goes; answers the seconds it took.
    static func fetchOnly(_ ids: [String], api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, atOnce: Int) async throws -> Double {
        let client = try await api.client()
        let started = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<atOnce {
                group.addTask {
                    for index in stride(from: worker, to: ids.count, by: atOnce) {
                        let page = try await client.transactionHistory(ids[index])
                        for jws in page.signedTransactions { _ = try await verifier.transaction(signed: jws) }
                    }
                }
            }
            try await group.waitForAll()
        }
        return (ContinuousClock.now - started).inSeconds
    }
}
