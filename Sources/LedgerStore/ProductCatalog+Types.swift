import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// What the catalog says of a product's kind (`products.type`, `products.subscription_group`):
/// the intake reads it before any order is looked at (issue 40; `TransactionRole`).
extension ProductCatalog {
    /// A product's type and subscription group as the catalog holds them (either may be unset).
    public struct Typing: Sendable, Equatable {
        public var type: ProductType?
        public var subscriptionGroup: String?

        public init(type: ProductType?, subscriptionGroup: String?) {
            self.type = type
            self.subscriptionGroup = subscriptionGroup
        }
    }

    /// The catalog's type and group of `product` in app `bundleId` (an entry of no app, in a ledger
    /// that held none when it was set, counts for every app); nil when the catalog lists it not.
    public func typing(of product: ProductID, bundleId: String, in transaction: DatabaseTransaction) async throws -> Typing? {
        try await Self.decodeTyping(transaction.connection.guardedQuery(Self.typingQuery(product, bundleId), logger: database.logger))
    }

    /// `typing(of:bundleId:in:)` outside any transaction.
    public func typing(of product: ProductID, bundleId: String) async throws -> Typing? {
        try await Self.decodeTyping(database.query(Self.typingQuery(product, bundleId)))
    }

    private static func typingQuery(_ product: ProductID, _ bundleId: String) -> PostgresQuery {
        """
        SELECT type, subscription_group FROM products
         WHERE product_id = \(product.rawValue) AND coalesce(bundle_id, '') IN (\(bundleId), '')
         ORDER BY bundle_id NULLS LAST LIMIT 1
        """
    }

    private static func decodeTyping(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> Typing? {
        for try await (type, group) in rows.decode((String?, String?).self) {
            return Typing(type: type.flatMap(ProductType.init(rawValue:)), subscriptionGroup: group)
        }
        return nil
    }
}
