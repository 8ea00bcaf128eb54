import ArgumentParser
import Foundation
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore

/// `ledger unmatch`: support's undo of a pairing made from the pool, as
/// `POST /v1/transactions/{transactionId}/unmatch` does it.
struct Unmatch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Undo the pairing of an Apple transaction with its order before delivery: the order reopens, the transaction returns to the pool.")
    @OptionGroup var options: ConfigurationOptions
    @Argument(help: "The Apple transaction id") var transactionId: String
    @Option(help: "Why (recorded with the undo)") var reason: String

    func run() async throws {
        let id = try TransactionID(transactionId)
        let metadata = try operatorMetadata("unmatch")
        let order = try await withLedgerDatabase(options) { client, logger in
            try await ServiceAssembly(database: Database(client: client, logger: logger)).support.unmatch(id, reason: reason, metadata: metadata)
        }
        print("order \(order.orderId) is \(order.state.rawValue) again; Apple transaction \(id) is back in the pool")
    }
}
