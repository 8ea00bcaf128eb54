import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging

/// Where Apple's sales reports counted more purchases of a product on a day than the ledger saw
/// (docs/finance.md, "Differences act"): the history sweep of the app's users with open orders of
/// that product from that day (the sweep `ledger recover` runs), once per user however many
/// shortfalls name them, and what it found recorded beside the comparison (`apple_sales_sweeps`).
public struct SalesShortfallSweep: Sendable {
    let sweep: HistorySweep
    let store: AppleSalesStore
    let logger: Logger

    public init(sweep: HistorySweep, store: AppleSalesStore, logger: Logger) {
        self.sweep = sweep
        self.store = store
        self.logger = logger
    }

    /// What one shortfall's sweep did.
    public struct Swept: Sendable, Codable, Equatable {
        public var day: String
        public var bundleId: String?
        public var productId: String
        /// Apple's purchases less the ledger's before the sweep.
        public var missing: Int
        public var users: Int
        public var accounts: Int
        /// Transactions new to the ledger the sweep ingested (tied to orders or pooled).
        public var found: Int
        /// Accounts whose history could not be read.
        public var failed: Int
        /// Not swept: the app has no App Store Server API key (nothing recorded beside the comparison).
        public var noKey = false

        public init(day: String, bundleId: String?, productId: String, missing: Int, users: Int, accounts: Int, found: Int, failed: Int) {
            (self.day, self.bundleId, self.productId, self.missing) = (day, bundleId, productId, missing)
            (self.users, self.accounts, self.found, self.failed) = (users, accounts, found, failed)
        }
    }

    /// Sweeps for every shortfall of the days `from` to `to` (`YYYY-MM-DD`).
    public func run(from: String, to: String) async throws -> [Swept] {
        try await sweep(try await store.shortfalls(from: from, to: to))
    }

    /// Sweeps for every shortfall of `days` (`YYYY-MM-DD`; those a fetch stored), and of no day
    /// between them.
    public func run(days: [String]) async throws -> [Swept] {
        guard let from = days.min(), let to = days.max() else { return [] }
        let asked = Set(days)
        return try await sweep(try await store.shortfalls(from: from, to: to).filter { asked.contains($0.day) })
    }

    func sweep(_ shortfalls: [AppleSalesStore.Shortfall]) async throws -> [Swept] {
        var done: [String: HistorySweep.Summary] = [:]
        var results: [Swept] = []
        for shortfall in shortfalls {
            do {
                _ = try await sweep.api.client(for: shortfall.bundleId)
            } catch let error as AppStoreServerAPIError where error.code == "apple-api-no-key" {
                // Its app cannot ask Apple: no sweep, and none said to have run.
                var skipped = Swept(
                    day: shortfall.day, bundleId: shortfall.bundleId?.rawValue, productId: shortfall.productId.rawValue, missing: shortfall.missing,
                    users: 0, accounts: 0, found: 0, failed: 0)
                skipped.noKey = true
                results.append(skipped)
                continue
            }
            let users = try await store.openOrderUsers(shortfall)
            var summary = HistorySweep.Summary()
            for user in users {
                let key = (shortfall.bundleId?.rawValue ?? "") + "\u{1F}" + user.rawValue
                if done[key] == nil {
                    // User ids are per app: the shortfall's app's user alone.
                    done[key] = try await sweep.run(
                        user: user, apps: shortfall.bundleId.map { [$0] }, metadata: Data(#"{"appendedBy":"sales-shortfall-sweep"}"#.utf8))
                }
                summary.add(done[key]!)
            }
            let found = summary.ingested["matched", default: 0] + summary.ingested["unmatched", default: 0]
            try await store.recordSweep(shortfall, users: users.count, accounts: summary.accounts, found: found, failed: summary.failed)
            results.append(Swept(
                day: shortfall.day, bundleId: shortfall.bundleId?.rawValue, productId: shortfall.productId.rawValue, missing: shortfall.missing,
                users: users.count, accounts: summary.accounts, found: found, failed: summary.failed))
            logger.info("sales shortfall swept", metadata: [
                "sales.day": "\(shortfall.day)", "app.bundle_id": "\(shortfall.bundleId?.rawValue ?? "")",
                "sales.product_id": "\(shortfall.productId.rawValue)", "sales.missing": "\(shortfall.missing)",
                "sweep.users": "\(users.count)", "sweep.accounts": "\(summary.accounts)", "sweep.found": "\(found)"])
        }
        return results
    }
}
