import ArgumentParser
import Foundation
import LedgerCore
import LedgerServer
import LedgerStore

/// `ledger products set|list`: the product catalog.
struct Products: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Manage the product catalog (active or retired products, prices).", subcommands: [Set.self, List.self])

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create or change a product's entry.")
        @OptionGroup var options: ConfigurationOptions
        @Option(help: "The Apple product id") var product: String
        @Option(help: "active or retired") var status = "active"
        @Option(help: "Price as a decimal string, such as 0.99") var price: String?
        @Option(help: "ISO 4217 currency, such as USD") var currency: String?
        @Option(help: "Consumption answers: true when the app offers a free sample or trial of it") var sampleContentProvided: Bool?
        @Option(help: "Consumption answers: DECLINE, GRANT_FULL or GRANT_PRORATED") var refundPreference: String?
        @Option(help: "The app the product belongs to (product ids are per app; default: the ledger's first app)") var bundleId: String?

        func run() async throws {
            guard let status = ProductCatalog.Status(rawValue: status) else { throw CommandFailure("--status must be active or retired") }
            let preference = try refundPreference.map { text in
                guard let preference = RefundPreference(rawValue: text) else {
                    throw CommandFailure("--refund-preference must be DECLINE, GRANT_FULL or GRANT_PRORATED")
                }
                return preference
            }
            let id = try ProductID(product)
            let app = try bundleId.map { try BundleID($0) }
            let saved = try await withLedgerDatabase(options) { client, logger in
                try await ProductCatalog(database: Database(client: client, logger: logger)).set(
                    id, status: status, price: price, currency: currency, sampleContentProvided: sampleContentProvided,
                    refundPreference: preference, bundleId: app)
            }
            print("\(saved.productId)\t\(saved.status.rawValue)\t\(saved.price ?? "-")\t\(saved.currency ?? "-")")
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the catalog.")
        @OptionGroup var options: ConfigurationOptions

        func run() async throws {
            let products = try await withLedgerDatabase(options) { client, logger in
                try await ProductCatalog(database: Database(client: client, logger: logger)).list()
            }
            for product in products {
                print("\(product.productId)\t\(product.status.rawValue)\t\(product.price ?? "-")\t\(product.currency ?? "-")")
            }
        }
    }
}
