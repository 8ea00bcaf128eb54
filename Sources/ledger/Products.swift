import ArgumentParser
import Foundation
import LedgerCore
import LedgerServer
import LedgerStore

/// `ledger products set|list`: the product catalog.
struct Products: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Manage the product catalog (active or retired products, prices, types).", subcommands: [Set.self, List.self])

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
        @Option(help: "consumable, non-consumable, auto-renewable or non-renewing (default: none; Apple's signed type decides)") var type: String?
        @Option(help: "An auto-renewable product's subscription group (Apple's subscriptionGroupIdentifier)") var subscriptionGroup: String?

        func run() async throws {
            guard let status = ProductCatalog.Status(rawValue: status) else { throw ValidationError("--status must be active or retired") }
            let preference = try refundPreference.map { text in
                guard let preference = RefundPreference(rawValue: text) else {
                    throw ValidationError("--refund-preference must be DECLINE, GRANT_FULL or GRANT_PRORATED")
                }
                return preference
            }
            let productType = try type.map { text in
                guard let productType = ProductType(rawValue: text) else {
                    throw ValidationError("--type must be \(ProductType.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                return productType
            }
            let id = try optionValue {
                // As `PUT /v1/products` refuses it: no order can name a padded product.
                do { return try ProductID(given: product) } catch let error as LedgerInputError { throw LedgerInputError(field: "--product", problem: error.problem) }
            }
            let app = try optionValue { try bundleId.map(BundleID.option) }
            try optionValue {
                try ProductCatalog.check(
                    price: price, currency: currency, type: productType, subscriptionGroup: subscriptionGroup,
                    fields: ["price": "--price", "currency": "--currency", "subscriptionGroup": "--subscription-group"])
            }
            let saved = try await withLedgerDatabase(options) { client, logger in
                let database = Database(client: client, logger: logger)
                // The app as the ledger spells it, as PUT /v1/products reads it; one it does not hold is named.
                let held = try await namedApp(app?.rawValue, required: false, on: database)
                return try await ProductCatalog(database: database).set(
                    id, status: status, price: price, currency: currency, sampleContentProvided: sampleContentProvided,
                    refundPreference: preference, bundleId: held, type: productType, subscriptionGroup: subscriptionGroup)
            }
            print(Self.line(saved))
        }

        /// A product as the commands print it, tab-separated, "-" for what the catalog does not
        /// say: id, status, price, currency, type, subscription group, app (product ids are per
        /// app), sample content provided, refund preference.
        static func line(_ product: ProductCatalog.Product) -> String {
            [
                product.productId.rawValue, product.status.rawValue, product.price ?? "-", product.currency ?? "-",
                product.type?.rawValue ?? "-", product.subscriptionGroup ?? "-", product.bundleId?.rawValue ?? "-",
                product.sampleContentProvided.map { "sample-content \($0)" } ?? "-", product.refundPreference?.rawValue ?? "-",
            ].joined(separator: "\t")
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the catalog.")
        @OptionGroup var options: ConfigurationOptions

        func run() async throws {
            let products = try await withLedgerDatabase(options) { client, logger in
                try await ProductCatalog(database: Database(client: client, logger: logger)).list()
            }
            for product in products { print(Set.line(product)) }
        }
    }
}
