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
        public var updatedAt: Date
    }

    /// Creates or replaces a product's entry.
    @discardableResult
    public func set(_ id: ProductID, status: Status, price: String?, currency: String?) async throws -> Product {
        if let price, !OrderEvent.isValidPrice(price) {
            throw LedgerInputError(field: "price", problem: "must be a decimal string such as \"0.99\"")
        }
        if let currency, !OrderEvent.isValidCurrency(currency) {
            throw LedgerInputError(field: "currency", problem: "must be an ISO 4217 code such as \"USD\"")
        }
        let rows = try await database.query(
            """
            INSERT INTO products (product_id, status, price, currency, updated_at)
            VALUES (\(id.rawValue), \(status.rawValue), \(price)::numeric, \(currency), now())
            ON CONFLICT (product_id) DO UPDATE SET status = EXCLUDED.status, price = EXCLUDED.price,
                currency = EXCLUDED.currency, updated_at = EXCLUDED.updated_at
            RETURNING product_id, status, price::text, currency, updated_at
            """)
        guard let product = try await Self.decode(rows).first else { throw OrderDecisionError.noSuchOrder }
        return product
    }

    public func list() async throws -> [Product] {
        let rows = try await database.query(
            "SELECT product_id, status, price::text, currency, updated_at FROM products ORDER BY product_id")
        return try await Self.decode(rows)
    }

    static func decode(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [Product] {
        var products: [Product] = []
        for try await (id, status, price, currency, updated) in rows.decode((String, String, String?, String?, Date).self) {
            products.append(Product(productId: ProductID(unchecked: id), status: Status(rawValue: status) ?? .active,
                                    price: price, currency: currency, updatedAt: updated))
        }
        return products
    }
}
