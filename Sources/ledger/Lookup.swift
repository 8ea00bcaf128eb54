import AppleReceipts
import ArgumentParser
import Foundation
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore

/// `ledger lookup`: support's lookup of an Apple order id, as
/// `POST /v1/apple-orders/{appleOrderId}/lookup` does it.
struct Lookup: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Look up the order id of a customer's Apple receipt e-mail and take its purchases in (App Store Server API).")
    @OptionGroup var options: ConfigurationOptions
    @Argument(help: "The order id on Apple's receipt e-mail, such as MQ1N2CD3EF") var appleOrderId: String
    @Option(help: "The user whose purchases they are (for those no order's token claims)") var user: String?
    @Option(help: "The app whose order it is (required once the ledger holds several apps)") var bundleId: String?

    func validate() throws {
        do { try AppleOrderLookup.check(appleOrderId) } catch { throw ValidationError(error.description) }
    }

    func run() async throws {
        let userID = try userOption(user)
        let metadata = try operatorMetadata("lookup")
        let found = try await withAppleWork(options) { work in
            let app = try await namedApp(bundleId, required: true, on: work.services.database)
            do {
                return try await work.services.orderLookup(api: work.api, verifier: work.verifier)
                    .look(up: appleOrderId, user: userID, app: app, metadata: metadata)
            } catch let error as AppStoreServerAPIError {
                throw CommandFailure("\(error.code): \(error.description)")
            }
        }
        print("Apple order \(found.appleOrderId): \(found.transactions.count) purchase\(found.transactions.count == 1 ? "" : "s")")
        for entry in found.transactions {
            let parts = [entry.transactionId.map { "transaction \($0)" } ?? "a transaction that failed verification",
                         entry.outcome, entry.orderId.map { "order \($0)" }, entry.state, entry.reason].compactMap { $0 }
            print("  " + parts.joined(separator: ", "))
        }
    }
}
