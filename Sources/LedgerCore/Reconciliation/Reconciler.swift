import Foundation

/// The reconciler's rules (docs/reconciliation.md), as a pure function: which open order
/// each orphan transaction goes to. The store reads the pool and the candidates in batches and
/// applies the pairings this answers, each under locks that re-check it.
public enum Reconciler {
    /// The windows an order's creation must fall in, around the transaction's purchase date.
    public struct Settings: Sendable, Equatable {
        /// An order created up to this long after the purchase still counts (device and server clocks differ).
        public var clockSkew: TimeInterval
        /// An order created longer than this before the purchase does not.
        public var maximumAge: TimeInterval

        public init(clockSkew: TimeInterval = 300, maximumAge: TimeInterval = 30 * 86_400) {
            self.clockSkew = clockSkew
            self.maximumAge = maximumAge
        }
    }

    /// A transaction waiting in the pool, with the user it belongs to (known or resolved).
    public struct Orphan: Sendable, Equatable {
        public var transactionId: TransactionID
        public var userId: UserID
        public var productId: ProductID
        public var purchaseDate: Date

        public init(transactionId: TransactionID, userId: UserID, productId: ProductID, purchaseDate: Date) {
            self.transactionId = transactionId
            self.userId = userId
            self.productId = productId
            self.purchaseDate = purchaseDate
        }
    }

    /// An open order (created or payment-added, no transaction).
    public struct OpenOrder: Sendable, Equatable {
        public var orderId: OrderID
        public var userId: UserID
        public var productId: ProductID
        public var createdAt: Date
        /// When the client put the payment into the StoreKit queue (`payment-added`).
        public var queuedAt: Date?

        public init(orderId: OrderID, userId: UserID, productId: ProductID, createdAt: Date, queuedAt: Date?) {
            self.orderId = orderId
            self.userId = userId
            self.productId = productId
            self.createdAt = createdAt
            self.queuedAt = queuedAt
        }
    }

    /// How a pairing chose its order among the candidates.
    public enum Rule: String, Codable, Sendable, CaseIterable {
        /// The order whose payment entered the StoreKit queue last at or before the purchase
        /// (the queue is first-in first-out).
        case nearestQueued = "nearest-queued"
        /// No candidate was queued before the purchase: the oldest created.
        case oldestCreated = "oldest-created"
    }

    public struct Pairing: Sendable, Equatable {
        public var transactionId: TransactionID
        public var orderId: OrderID
        public var rule: Rule
        /// How many open orders could have taken the transaction (more than 1: ambiguous).
        public var candidates: Int

        public init(transactionId: TransactionID, orderId: OrderID, rule: Rule, candidates: Int) {
            self.transactionId = transactionId
            self.orderId = orderId
            self.rule = rule
            self.candidates = candidates
        }
    }

    /// Pairs `orphans` with `orders`: never across users or products, never one order twice;
    /// each user's and product's orphans in purchase-date order. Orphans with no candidate are
    /// left out of the answer.
    public static func pair(_ orphans: [Orphan], with orders: [OpenOrder], settings: Settings = Settings()) -> [Pairing] {
        struct Key: Hashable { let user: UserID; let product: ProductID }
        var available = Dictionary(grouping: orders) { Key(user: $0.userId, product: $0.productId) }
        var pairings: [Pairing] = []
        let ordered = orphans.sorted { ($0.userId.rawValue, $0.productId.rawValue, $0.purchaseDate, $0.transactionId.rawValue)
            < ($1.userId.rawValue, $1.productId.rawValue, $1.purchaseDate, $1.transactionId.rawValue) }
        for orphan in ordered {
            let key = Key(user: orphan.userId, product: orphan.productId)
            guard let open = available[key], !open.isEmpty else { continue }
            let latest = orphan.purchaseDate.addingTimeInterval(settings.clockSkew)
            let earliest = orphan.purchaseDate.addingTimeInterval(-settings.maximumAge)
            let candidates = open.filter { $0.createdAt <= latest && $0.createdAt >= earliest }
            guard !candidates.isEmpty else { continue }
            let chosen: OpenOrder
            let rule: Rule
            let queuedBefore = candidates.filter { ($0.queuedAt.map { $0 <= orphan.purchaseDate }) ?? false }
            if let nearest = queuedBefore.max(by: { ($0.queuedAt!, $1.createdAt, $1.orderId.rawValue) < ($1.queuedAt!, $0.createdAt, $0.orderId.rawValue) }) {
                (chosen, rule) = (nearest, .nearestQueued)
            } else {
                (chosen, rule) = (candidates.min { ($0.createdAt, $0.orderId.rawValue) < ($1.createdAt, $1.orderId.rawValue) }!, .oldestCreated)
            }
            available[key] = open.filter { $0.orderId != chosen.orderId }
            pairings.append(Pairing(transactionId: orphan.transactionId, orderId: chosen.orderId, rule: rule, candidates: candidates.count))
        }
        return pairings
    }
}
