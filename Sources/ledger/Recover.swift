import ArgumentParser
import Foundation
import LedgerCore
import LedgerServer
import LedgerStore

/// `ledger recover`: one history sweep, as `POST /v1/recover` runs it, with progress on a
/// terminal and a summary.
struct Recover: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Sweep the Apple transaction history of users with old open orders and take in the purchases no client sent (App Store Server API).")
    @OptionGroup var options: ConfigurationOptions
    @Option(help: "Sweep only this user's Apple accounts") var user: String?
    @Option(help: "Sweep only this app's users (required with --user once the ledger holds several apps)") var bundleId: String?

    func run() async throws {
        let userID = try userOption(user)
        let metadata = try operatorMetadata("recover")
        let progress = terminalProgress("Apple accounts")
        let summary = try await withAppleWork(options) { work in
            // User ids are per app: one user's sweep is of one app.
            let app = try await namedApp(bundleId, required: userID != nil, why: " and user ids are per app", on: work.services.database)
            let scope = app.map { [$0] }
            return try await work.configuration.historySweep(work.services, api: work.api, verifier: work.verifier)
                .run(user: userID, apps: scope, metadata: metadata, progress: progress)
        }
        let ingested = summary.ingested.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        print("swept \(summary.accounts) Apple accounts, \(summary.pages) pages, \(summary.transactions) transactions in \(String(format: "%.2f", summary.seconds)) s")
        print("new to the ledger: \(ingested.isEmpty ? "none" : ingested); \(summary.known) known already; \(summary.refused) refused by verification")
        if summary.busy > 0 { print("\(summary.busy) accounts left to another server sweeping them") }
        if let stop = summary.stoppedBy { throw CommandFailure("the sweep stopped early: \(stop)") }
        if summary.failed > 0 {
            // As `ledger backfill refunds`: a scheduler sees that work was left.
            let why = summary.failures.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
            throw CommandFailure("\(summary.failed) accounts could not be read (\(why)); the next sweep starts them where this one stopped")
        }
    }
}
