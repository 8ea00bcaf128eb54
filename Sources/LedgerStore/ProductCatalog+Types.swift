import Foundation
import LedgerCore
import Logging
import PostgresNIO
import Synchronization

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

    /// `typing(of:bundleId:in:)` outside any transaction: from the copy when it holds one young
    /// enough.
    public func typing(of product: ProductID, bundleId: String) async throws -> Typing? {
        // The bundle id as given: the query compares it as given.
        let key = bundleId + " " + product.rawValue
        if let kept = typings?.typing(key) { return kept }
        let typing = try await Self.decodeTyping(database.query(Self.typingQuery(product, bundleId)))
        typings?.keep(typing, for: key)
        return typing
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

/// Products' types as read a moment ago, so that a receipt costs no statement for its product's
/// type: one statement on a pooled connection was 40% of `bench receipts`' time. The types change
/// seldom, and a product set through the same catalog is read again at once; a change made
/// elsewhere (another server, `ledger products set`) is seen within `maximumAge`.
final class TypingCopy: Sendable {
    let maximumAge: Duration
    private let held = Mutex<[String: (typing: ProductCatalog.Typing?, readAt: ContinuousClock.Instant)]>([:])

    init(maximumAge: Duration) {
        self.maximumAge = maximumAge
    }

    /// The typing kept for `key`, when it is young enough (`.some(nil)`: the catalog lists it not).
    func typing(_ key: String) -> ProductCatalog.Typing?? {
        let now = ContinuousClock.now
        return held.withLock { held in
            guard let kept = held[key], now - kept.readAt < maximumAge else { return nil }
            return .some(kept.typing)
        }
    }

    func keep(_ typing: ProductCatalog.Typing?, for key: String) {
        let now = ContinuousClock.now
        held.withLock { held in
            // A catalog of many products stays small: what is older than its age is dropped.
            if held.count >= 4_096 { held = held.filter { now - $0.value.readAt < self.maximumAge } }
            held[key] = (typing, now)
        }
    }

    func forget() {
        held.withLock { $0.removeAll() }
    }
}
