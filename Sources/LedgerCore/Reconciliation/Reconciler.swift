import Foundation

/// The reconciler's rules (docs/reconciliation.md), as a pure function: which open order
/// each orphan transaction goes to. The store reads the pool and the candidates in batches and
/// applies the pairings this answers through the writer, which checks them again.
public enum Reconciler {
    /// The windows an order's creation must fall in, around the transaction's purchase date.
    public struct Settings: Sendable, Equatable {
        /// An order created up to this long after the purchase still counts (device and server clocks differ).
        public var clockSkew: TimeInterval
        /// An order created longer than this before the purchase does not.
        public var maximumAge: TimeInterval

        /// A pass pairs an orphan only once the ledger has held it this long, and none of its
        /// user's orphans of the same product less long: purchases made together are aligned together.
        public var settle: TimeInterval

        public init(clockSkew: TimeInterval = 300, maximumAge: TimeInterval = 30 * 86_400, settle: TimeInterval = 120) {
            self.clockSkew = clockSkew
            self.maximumAge = maximumAge
            self.settle = settle
        }
    }

    /// A transaction waiting in the pool, with the user it belongs to (known or resolved).
    public struct Orphan: Sendable, Equatable {
        public var transactionId: TransactionID
        public var userId: UserID
        public var productId: ProductID
        public var purchaseDate: Date
        /// Orders support undid a pairing of it with: never its candidates.
        public var undoneOrders: [OrderID]
        /// Its app: user and product ids are per app, so only that app's orders are candidates.
        public var bundleId: BundleID?
        /// The units Apple sold: only an order of as many is a candidate.
        public var quantity: Int

        public init(
            transactionId: TransactionID, userId: UserID, productId: ProductID, purchaseDate: Date, undoneOrders: [OrderID] = [],
            bundleId: BundleID? = nil, quantity: Int = 1
        ) {
            self.transactionId = transactionId
            self.userId = userId
            self.productId = productId
            self.purchaseDate = purchaseDate
            self.undoneOrders = undoneOrders
            self.bundleId = bundleId
            self.quantity = quantity
        }
    }

    /// A pairing an earlier pass made (its order holds the transaction still): later passes
    /// align around it and never cross it, so an orphan a pass left over for crossing it is not
    /// paired across it by the next pass.
    public struct EarlierPairing: Sendable, Equatable {
        public var userId: UserID
        public var productId: ProductID
        public var bundleId: BundleID?
        public var quantity: Int
        /// The transaction's purchase date and its order's place in the queue (`OpenOrder.queueEntry`).
        public var purchaseDate: Date
        public var queueEntry: Date

        public init(userId: UserID, productId: ProductID, bundleId: BundleID?, quantity: Int, purchaseDate: Date, queueEntry: Date) {
            self.userId = userId
            self.productId = productId
            self.bundleId = bundleId
            self.quantity = quantity
            self.purchaseDate = purchaseDate
            self.queueEntry = queueEntry
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
        public var bundleId: BundleID?
        public var quantity: Int

        public init(
            orderId: OrderID, userId: UserID, productId: ProductID, createdAt: Date, queuedAt: Date?, bundleId: BundleID? = nil, quantity: Int = 1
        ) {
            self.orderId = orderId
            self.userId = userId
            self.productId = productId
            self.createdAt = createdAt
            self.queuedAt = queuedAt
            self.bundleId = bundleId
            self.quantity = quantity
        }
    }

    /// What placed the order in the queue alignment.
    public enum Rule: String, Codable, Sendable, CaseIterable {
        /// Aligned by the time its payment entered the StoreKit queue (`payment-added`).
        case queueOrder = "queue-order"
        /// Never queued: aligned by the time it was created.
        case creationOrder = "creation-order"
    }

    public struct Pairing: Sendable, Equatable {
        public var transactionId: TransactionID
        public var orderId: OrderID
        public var rule: Rule
        /// How many open orders could have taken the transaction (more than 1: ambiguous).
        public var candidates: Int
        /// The candidates not chosen, in queue order.
        public var otherCandidates: [OrderID]

        public init(transactionId: TransactionID, orderId: OrderID, rule: Rule, candidates: Int, otherCandidates: [OrderID] = []) {
            self.transactionId = transactionId
            self.orderId = orderId
            self.rule = rule
            self.candidates = candidates
            self.otherCandidates = otherCandidates
        }
    }

    /// Pairs `orphans` with `orders`: never across apps, users or products, never one order twice, and
    /// never crossed: for one user and product, a later purchase never takes an order queued
    /// before the order of an earlier purchase (StoreKit's queue is first in, first out). An
    /// order never queued stands in the queue at its creation time.
    ///
    /// Among the pairings that keep that order, the answer has the most pairings, and among
    /// those the least total distance: for each pairing, the time from the order's queue entry
    /// to the purchase, or ten times that time when the entry follows the purchase (only clocks
    /// that disagree explain it), and an hour more for an order never queued. So a payment queued
    /// and abandoned is skipped for the later one that fits, and a purchase made without an order
    /// of ours leaves an order to the purchase that fits it better. Found by dynamic programming over each user's and product's
    /// purchases and queue entries (docs/reconciliation.md). Orphans with no candidate, or left
    /// over, are not in the answer; so are orders support undid a pairing of the orphan with.
    /// `earlier`: the pairings earlier passes made, which no pairing of this one crosses.
    public static func pair(
        _ orphans: [Orphan], with orders: [OpenOrder], settings: Settings = Settings(), earlier: [EarlierPairing] = []
    ) -> [Pairing] {
        struct Key: Hashable { let app: BundleID?; let user: UserID; let product: ProductID; let quantity: Int }
        let orderGroups = Dictionary(grouping: orders) { Key(app: $0.bundleId, user: $0.userId, product: $0.productId, quantity: $0.quantity) }
        let orphanGroups = Dictionary(grouping: orphans) { Key(app: $0.bundleId, user: $0.userId, product: $0.productId, quantity: $0.quantity) }
        let earlierGroups = Dictionary(grouping: earlier) { Key(app: $0.bundleId, user: $0.userId, product: $0.productId, quantity: $0.quantity) }
        var pairings: [Pairing] = []
        func order(_ key: Key) -> (String, String, String, Int) { (key.app?.rawValue ?? "", key.user.rawValue, key.product.rawValue, key.quantity) }
        for key in orphanGroups.keys.sorted(by: { order($0) < order($1) }) {
            guard let open = orderGroups[key] else { continue }
            pairings += align(orphanGroups[key]!, open, settings: settings, earlier: earlierGroups[key] ?? [])
        }
        return pairings
    }

    /// The purchase-date guard (issue 41), the one statement of it: a purchase Apple dated
    /// `purchased` was made before an order created at `created`, beyond `allowance` (the clocks'
    /// disagreement, `Settings.clockSkew`), so it cannot be what paid that order (an old purchase
    /// replayed, or granted before by another backend); only support's explicit override ties them.
    /// Compared in whole milliseconds, as Apple dates a purchase and the API shows an order's
    /// `createdAt` (the database keeps microseconds): a purchase dated exactly `allowance` before
    /// the `createdAt` a client read is not before it.
    public static func purchasedBeforeOrder(_ purchased: Date, created: Date, allowance: TimeInterval) -> Bool {
        let purchasedAt = (purchased.timeIntervalSince1970 * 1000).rounded()
        // As the API shows it: cut to the millisecond (half a microsecond spares a binary
        // fraction held just below its millisecond).
        let shown = ((created.timeIntervalSince1970 + 0.000_000_5) * 1000).rounded(.down)
        return purchasedAt < shown - (allowance * 1000).rounded()
    }

    /// The alignment of one user's and product's purchases with their open orders.
    static func align(_ orphans: [Orphan], _ orders: [OpenOrder], settings: Settings, earlier: [EarlierPairing] = []) -> [Pairing] {
        let purchases = orphans.sorted { ($0.purchaseDate, $0.transactionId.rawValue) < ($1.purchaseDate, $1.transactionId.rawValue) }
        func isCandidate(_ order: OpenOrder, for purchase: Orphan) -> Bool {
            !purchasedBeforeOrder(purchase.purchaseDate, created: order.createdAt, allowance: settings.clockSkew)
                && order.createdAt >= purchase.purchaseDate.addingTimeInterval(-settings.maximumAge)
                && !purchase.undoneOrders.contains(order.orderId)
                && !earlier.contains { crosses(purchase.purchaseDate, order.queueEntry, $0) }
        }
        // Queue order; only orders some purchase could take.
        let queue = orders.filter { order in purchases.contains { isCandidate(order, for: $0) } }
            .sorted { ($0.queueEntry, $0.createdAt, $0.orderId.rawValue) < ($1.queueEntry, $1.createdAt, $1.orderId.rawValue) }
        guard !queue.isEmpty else { return [] }

        // best[i][j]: the best alignment of the first i purchases with the first j queue entries,
        // as (pairings, distance); more pairings first, then less distance.
        struct Score: Comparable {
            var pairings = 0
            var distance = 0.0
            static func < (a: Score, b: Score) -> Bool {
                a.pairings != b.pairings ? a.pairings < b.pairings : a.distance > b.distance
            }
        }
        enum Step { case start, skipPurchase, skipOrder, pair }
        let (p, q) = (purchases.count, queue.count)
        var best = [[Score]](repeating: [Score](repeating: Score(), count: q + 1), count: p + 1)
        var step = [[Step]](repeating: [Step](repeating: .start, count: q + 1), count: p + 1)
        for i in 0...p {
            for j in 0...q where i > 0 || j > 0 {
                var score = Score(pairings: -1)
                if i > 0, best[i - 1][j] > score { (score, step[i][j]) = (best[i - 1][j], .skipPurchase) }
                if j > 0, best[i][j - 1] > score { (score, step[i][j]) = (best[i][j - 1], .skipOrder) }
                if i > 0, j > 0, isCandidate(queue[j - 1], for: purchases[i - 1]) {
                    let previous = best[i - 1][j - 1]
                    let paired = Score(pairings: previous.pairings + 1,
                                       distance: previous.distance + distance(queue[j - 1], purchases[i - 1]))
                    if paired > score { (score, step[i][j]) = (paired, .pair) }
                }
                best[i][j] = score
            }
        }
        var pairings: [Pairing] = []
        var (i, j) = (p, q)
        while i > 0 || j > 0 {
            switch step[i][j] {
            case .skipPurchase: i -= 1
            case .skipOrder: j -= 1
            case .pair:
                let (purchase, order) = (purchases[i - 1], queue[j - 1])
                let others = queue.filter { $0.orderId != order.orderId && isCandidate($0, for: purchase) }.map(\.orderId)
                pairings.append(Pairing(
                    transactionId: purchase.transactionId, orderId: order.orderId,
                    rule: order.queuedAt == nil ? .creationOrder : .queueOrder, candidates: others.count + 1, otherCandidates: others))
                (i, j) = (i - 1, j - 1)
            case .start: (i, j) = (0, 0)
            }
        }
        return pairings.reversed()
    }

    /// Whether pairing a purchase made at `purchased` with an order queued at `queued` crosses
    /// `pairing`: the earlier purchase of the two would take the later-queued order.
    static func crosses(_ purchased: Date, _ queued: Date, _ pairing: EarlierPairing) -> Bool {
        (purchased < pairing.purchaseDate && queued > pairing.queueEntry) || (purchased > pairing.purchaseDate && queued < pairing.queueEntry)
    }

    /// Seconds from the order's queue entry to the purchase; ten times as many when the entry
    /// follows the purchase; an hour more for an order never queued, whose client queued no
    /// payment for it while it did for others (most often an order abandoned before paying).
    static func distance(_ order: OpenOrder, _ purchase: Orphan) -> Double {
        let seconds = purchase.purchaseDate.timeIntervalSince(order.queueEntry)
        return (seconds >= 0 ? seconds : -10 * seconds) + (order.queuedAt == nil ? neverQueued : 0)
    }

    /// What an order never queued adds to a pairing's distance, in seconds.
    static let neverQueued = 3_600.0
}

extension Reconciler.OpenOrder {
    /// Its place in the StoreKit queue: when its payment was queued, else when it was created.
    public var queueEntry: Date { queuedAt ?? createdAt }
}
