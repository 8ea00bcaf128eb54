import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// The product catalog (`products`): which product ids are sold, which are retired, at what price.
public struct ProductCatalog: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    public enum Status: String, Codable, Sendable, CaseIterable {
        case active, retired
    }

    public struct Product: Sendable, Equatable {
        public var productId: ProductID
        public var status: Status
        public var price: String?
        public var currency: String?
        /// Consumption answers: whether the app offers a free sample or trial of it (absent: not sent).
        public var sampleContentProvided: Bool?
        /// Consumption answers: the refund the operator would like Apple to grant (absent: not sent).
        public var refundPreference: RefundPreference?
        public var updatedAt: Date
    }

    /// Creates or replaces a product's entry.
    @discardableResult
    public func set(
        _ id: ProductID, status: Status, price: String?, currency: String?, sampleContentProvided: Bool? = nil,
        refundPreference: RefundPreference? = nil
    ) async throws -> Product {
        if let price, !OrderEvent.isValidPrice(price) {
            throw LedgerInputError(field: "price", problem: "must be a decimal string such as \"0.99\"")
        }
        if let currency, !OrderEvent.isValidCurrency(currency) {
            throw LedgerInputError(field: "currency", problem: "must be an ISO 4217 code such as \"USD\"")
        }
        let rows = try await database.query(
            """
            INSERT INTO products (product_id, status, price, currency, sample_content_provided, refund_preference, updated_at)
            VALUES (\(id.rawValue), \(status.rawValue), \(price)::numeric, \(currency), \(sampleContentProvided), \(refundPreference?.rawValue), now())
            ON CONFLICT (product_id) DO UPDATE SET status = EXCLUDED.status, price = EXCLUDED.price,
                currency = EXCLUDED.currency, sample_content_provided = EXCLUDED.sample_content_provided,
                refund_preference = EXCLUDED.refund_preference, updated_at = EXCLUDED.updated_at
            RETURNING \(unescaped: Self.columns)
            """)
        guard let product = try await Self.decode(rows).first else { throw OrderDecisionError.noSuchOrder }
        return product
    }

    public func list() async throws -> [Product] {
        let rows = try await database.query(
            "SELECT \(unescaped: Self.columns) FROM products ORDER BY product_id")
        return try await Self.decode(rows)
    }

    /// The active products and their prices (price, currency): what the reconciler may create a
    /// recovery order for.
    public func activePrices() async throws -> [ProductID: (price: String?, currency: String?)] {
        let rows = try await database.query(
            "SELECT product_id, price::text, currency FROM products WHERE status = 'active'")
        var products: [ProductID: (price: String?, currency: String?)] = [:]
        for try await (id, price, currency) in rows.decode((String, String?, String?).self) {
            products[ProductID(unchecked: id)] = (price, currency)
        }
        return products
    }

    static let columns = "product_id, status, price::text, currency, sample_content_provided, refund_preference, updated_at"

    static func decode(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [Product] {
        var products: [Product] = []
        for try await (id, status, price, currency, sample, preference, updated) in rows.decode((String, String, String?, String?, Bool?, String?, Date).self) {
            products.append(Product(productId: ProductID(unchecked: id), status: Status(rawValue: status) ?? .active,
                                    price: price, currency: currency, sampleContentProvided: sample,
                                    refundPreference: preference.flatMap(RefundPreference.init), updatedAt: updated))
        }
        return products
    }
}
