import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// What a user may use besides the subscriptions projection (issue 40, entitlements): the
/// non-consumables they bought or a family member shares with them, and the order that bought
/// each subscription.
public struct EntitlementStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// A non-consumable the user holds.
    public struct NonConsumable: Sendable, Equatable {
        /// How the user holds it.
        public enum Source: String, Sendable {
            /// Bought: their order of it was delivered (or finished).
            case purchase
            /// A family member's purchase shared with them (`FAMILY_SHARED`): nobody's order.
            case familyShared = "family-shared"
        }

        public var productId: ProductID
        public var bundleId: BundleID?
        public var source: Source
        public var orderId: OrderID?
        public var transactionId: TransactionID
        public var purchaseDate: Date?
        public var environment: String?
    }

    /// The orders that bought subscriptions `ids`: the order holding each start transaction (whose
    /// `transactionId` is the subscription's `originalTransactionId`). A subscription no order
    /// bought (a family member's, or a start still in the pool) is absent.
    public func purchaseOrders(of ids: [String]) async throws -> [String: OrderID] {
        guard !ids.isEmpty else { return [:] }
        let rows = try await database.query(
            "SELECT transaction_id, order_id FROM apple_transactions WHERE transaction_id = ANY(\(ids)) AND order_id IS NOT NULL")
        var orders: [String: OrderID] = [:]
        for try await (transaction, order) in rows.decode((String, String).self) { orders[transaction] = OrderID(unchecked: order) }
        return orders
    }

    /// The non-consumables `user` holds, in `apps` (nil: every app): each delivered or finished
    /// order of theirs, and each family member's purchase shared with them that Apple has not
    /// revoked (`apple_transactions` status `shared`; a revoked share leaves it). A product is a
    /// non-consumable by the catalog's type, else by the type Apple signed as the ledger stored it
    /// (the `transaction-unmatched` body of a transaction that passed through the pool). A shared
    /// auto-renewable subscription is the member's subscription, not listed here.
    public func nonConsumables(of user: UserID, apps: [BundleID]? = nil) async throws -> [NonConsumable] {
        let apps = apps?.map(\.rawValue)
        let rows = try await database.query(
            """
            SELECT o.product_id, o.bundle_id, 'purchase', o.order_id, o.transaction_id, t.purchase_date, t.environment
              FROM orders o
              LEFT JOIN apple_transactions t ON t.transaction_id = o.transaction_id
              LEFT JOIN products p ON p.product_id = o.product_id AND p.bundle_id IS NOT DISTINCT FROM o.bundle_id
             WHERE o.user_id = \(user.rawValue) AND o.state IN ('delivered', 'finished') AND o.transaction_id IS NOT NULL
               AND (\(apps)::text[] IS NULL OR o.bundle_id = ANY(\(apps)::text[]))
               AND coalesce(p.type, \(unescaped: Self.signedType)) = 'non-consumable'
            UNION ALL
            SELECT t.product_id, t.bundle_id, 'family-shared', NULL, t.transaction_id, t.purchase_date, t.environment
              FROM apple_transactions t
              LEFT JOIN products p ON p.product_id = t.product_id AND p.bundle_id IS NOT DISTINCT FROM t.bundle_id
             WHERE t.user_id = \(user.rawValue) AND t.status = 'shared' AND t.order_id IS NULL
               AND (\(apps)::text[] IS NULL OR t.bundle_id = ANY(\(apps)::text[]))
               AND coalesce(p.type, \(unescaped: Self.signedType)) IS DISTINCT FROM 'auto-renewable'
             ORDER BY 6, 5
            """)
        var held: [NonConsumable] = []
        for try await (product, bundle, source, order, transaction, purchased, environment)
            in rows.decode((String, String?, String, String?, String, Date?, String?).self) {
            held.append(NonConsumable(
                productId: ProductID(unchecked: product), bundleId: bundle.map(BundleID.init(unchecked:)),
                source: NonConsumable.Source(rawValue: source) ?? .purchase, orderId: order.map(OrderID.init(unchecked:)),
                transactionId: TransactionID(unchecked: transaction), purchaseDate: purchased, environment: environment))
        }
        return held
    }

    /// The app and environment of subscription `id` as the transactions the ledger holds of it say
    /// (its start, else a later period waiting for it), for asking Apple about a subscription
    /// whose start the ledger has not seen; nil when it holds none.
    public func origin(of id: String) async throws -> (bundleId: BundleID?, environment: String?)? {
        let rows = try await database.query(
            """
            SELECT bundle_id, environment FROM apple_transactions
             WHERE transaction_id = \(id) OR original_transaction_id = \(id)
             ORDER BY transaction_id = \(id) DESC, purchase_date LIMIT 1
            """)
        for try await (bundle, environment) in rows.decode((String?, String?).self) {
            return (bundle.map(BundleID.init(unchecked:)), environment)
        }
        return nil
    }

    /// Apple's signed `type` of the row `t`, as the catalog names types (LedgerCore
    /// `ProductType(appleType:)`); NULL where the ledger did not store it.
    static let signedType = """
        CASE t.verification -> 'transaction' ->> 'type' WHEN 'Consumable' THEN 'consumable' WHEN 'Non-Consumable' THEN 'non-consumable' \
        WHEN 'Auto-Renewable Subscription' THEN 'auto-renewable' WHEN 'Non-Renewing Subscription' THEN 'non-renewing' END
        """
}
