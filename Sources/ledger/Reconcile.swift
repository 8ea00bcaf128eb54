import ArgumentParser
import Foundation
import LedgerServer
import LedgerServices
import LedgerStore

/// `ledger reconcile`: one reconciler pass, with progress on a terminal and a summary.
struct Reconcile: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Pair orphan Apple transactions with open orders of the same user and product.")
    @OptionGroup var options: ConfigurationOptions

    func run() async throws {
        // (withLedgerDatabase sets logging up; the settings alone are read here.)
        let configuration = try options.configuration()
        let progress = terminalProgress("users")
        let summary = try await withLedgerDatabase(options) { client, logger in
            let services = ServiceAssembly(database: Database(client: client, logger: logger))
            return try await configuration.reconcilerPass(services).run(progress: progress)
        }
        let rules = summary.byRule.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        let recovered = summary.recoveryOrders > 0 ? ", \(summary.recoveryOrders) more with recovery orders" : ""
        print("paired \(summary.paired) of \(summary.considered) orphans with a known user with their open orders\(recovered) (\(rules.isEmpty ? "none" : rules); \(summary.ambiguous) ambiguous)")
        if summary.settling > 0 || summary.usersBusy > 0 {
            print("\(summary.settling) orphans left to settle (LEDGER_RECONCILE_SETTLE); \(summary.usersBusy) users left to another reconciler")
        }
        if configuration.recoveryOrders {
            print("\(summary.recoveryOrders) recovery orders created; \(summary.notRecovered) orphans left for support (retired or unknown products, purchased before their order, recovery undone)")
        }
        if summary.heldForSupport > 0 {
            print("\(summary.heldForSupport) pooled transactions of an Apple account or token known for another user held for support (dashboards.apple_account_conflicts)")
        }
        print("\(summary.usersResolved) users found through earlier transactions; \(summary.unknownUser) orphans without a user left for support; \(summary.lostRaces) pairings taken by another writer first; \(String(format: "%.2f", summary.seconds)) s")
    }
}
