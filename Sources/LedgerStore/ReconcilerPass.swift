import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// One pass of the reconciler: reads the pool and the open orders of its users in batches,
/// leaves each user's and product's orphans until all have settled, pairs them with `Reconciler.pair`, and applies each pairing in a transaction of its own that
/// takes the Apple transaction's lock and the order's row lock and checks both again (another
/// reconciler or a live receipt may have been first). Safe to run on several servers at once.
public struct ReconcilerPass: Sendable {
    public let receipts: ReceiptLedger
    public var settings: Reconciler.Settings
    /// Users per batch: their orphans and open orders are read in two queries.
    public var usersPerBatch = 1_000
    /// Pairings applied per database transaction.
    public var pairingsPerTransaction = 200
    /// The recovery policy (off by default): an orphan of a known user with no candidate gets an
    /// order of its own (`recovery-<transactionId>`, priced from the catalog), but only for a
    /// product the catalog lists as active: never a retired or unknown one.
    public var recoveryOrders = false
    var database: Database { receipts.orders.database }
    var logger: Logger { database.logger }

    public init(receipts: ReceiptLedger, settings: Reconciler.Settings = .init()) {
        self.receipts = receipts
        self.settings = settings
    }

    /// What a pass did.
    public struct Summary: Sendable, Equatable, Codable {
        /// Orphans with a known (or resolved) user that the pass looked at.
        public var considered = 0
        /// Orphans left for a later pass: they, or an orphan of the same user and product, are
        /// younger than the settle window.
        public var settling = 0
        public var paired = 0
        /// Pairings that had more than one candidate.
        public var ambiguous = 0
        /// Paired by rule.
        public var byRule: [String: Int] = [:]
        /// Orphans whose user came from an earlier transaction of the same Apple account or subscription.
        public var usersResolved = 0
        /// Orphans with no user at all: left for support.
        public var unknownUser = 0
        /// Pairings dropped because another writer got there first.
        public var lostRaces = 0
        /// Orders created for orphans with no candidate (the recovery policy).
        public var recoveryOrders = 0
        /// Orphans with no candidate left in the pool because their product is retired or not in the catalog.
        public var notRecovered = 0
        public var seconds = 0.0
        public init() {}
    }

    /// Runs one pass; `progress` gets (users done, users in the pool).
    public func run(metadata: Data = Data(#"{"appendedBy":"reconciler"}"#.utf8), progress: (@Sendable (Int, Int) -> Void)? = nil) async throws -> Summary {
        let started = ContinuousClock.now
        var summary = Summary()
        var totalUsers = 0
        let counts = try await database.query(
            """
            SELECT count(*) FILTER (WHERE resolved_user_id IS NULL)::int,
                   count(*) FILTER (WHERE user_id IS NULL AND resolved_user_id IS NOT NULL)::int,
                   count(DISTINCT resolved_user_id)::int
            FROM pool_with_users
            """)
        for try await (unknown, resolved, users) in counts.decode((Int, Int, Int).self) {
            (summary.unknownUser, summary.usersResolved, totalUsers) = (unknown, resolved, users)
        }
        var afterUser = ""
        var usersDone = 0
        while true {
            let users = try await nextUsers(after: afterUser)
            guard let last = users.last else { break }
            afterUser = last
            let (orphans, settling) = try await settledOrphans(of: users)
            let orders = try await openOrders(of: users)
            summary.considered += orphans.count
            summary.settling += settling
            let pairings = Reconciler.pair(orphans, with: orders, settings: settings)
            for chunk in stride(from: 0, to: pairings.count, by: pairingsPerTransaction).map({ Array(pairings[$0..<min($0 + pairingsPerTransaction, pairings.count)]) }) {
                for (pairing, applied) in try await apply(chunk, metadata: metadata) {
                    if applied {
                        summary.paired += 1
                        summary.byRule[pairing.rule.rawValue, default: 0] += 1
                        if pairing.candidates > 1 { summary.ambiguous += 1 }
                    } else {
                        summary.lostRaces += 1
                    }
                }
            }
            if recoveryOrders {
                let paired = Set(pairings.map(\.transactionId))
                let catalog = try await activeProducts()
                for orphan in orphans where !paired.contains(orphan.transactionId) {
                    guard let product = catalog[orphan.productId] else {
                        summary.notRecovered += 1
                        continue
                    }
                    if try await recover(orphan, price: product, metadata: metadata) {
                        summary.recoveryOrders += 1
                        summary.byRule["recovery", default: 0] += 1
                    } else {
                        summary.lostRaces += 1
                    }
                }
            }
            usersDone += users.count
            progress?(usersDone, totalUsers)
        }
        let elapsed = ContinuousClock.now - started
        summary.seconds = elapsed.inSeconds
        return summary
    }

    /// Applies pairings a chunk per database transaction (one durable commit for many); when
    /// the chunk fails as a whole (a deadlock with a live receipt, say), each pairing again in a
    /// transaction of its own.
    func apply(_ chunk: [Reconciler.Pairing], metadata: Data) async throws -> [(Reconciler.Pairing, Bool)] {
        do {
            return try await database.transaction { connection in
                var results: [(Reconciler.Pairing, Bool)] = []
                for pairing in chunk { results.append((pairing, try await apply(pairing, metadata: metadata, on: connection))) }
                return results
            }
        } catch where chunk.count > 1 {
            var results: [(Reconciler.Pairing, Bool)] = []
            for pairing in chunk {
                results.append((pairing, try await database.transaction { try await apply(pairing, metadata: metadata, on: $0) }))
            }
            return results
        }
    }

    /// Applies one pairing, in the caller's transaction, if both sides are still as the pass saw them.
    func apply(_ pairing: Reconciler.Pairing, metadata: Data, on connection: PostgresConnection) async throws -> Bool {
        let writer = receipts.writer
        try await writer.lock([pairing.transactionId.streamID, pairing.orderId.streamID], on: connection)
        let snapshot = try await writer.read(orders: [pairing.orderId], transactions: [pairing.transactionId], on: connection)
        guard let pooled = snapshot.transaction(pairing.transactionId), pooled.isPooled,
              let transaction = try pooled.verifiedTransaction(), let order = snapshot.order(pairing.orderId),
              order.isOpen, order.productId == transaction.productId
        else { return false }
        _ = try await receipts.match(
            transaction, to: order, by: .reconciler,
            pairing: .init(candidates: pairing.candidates, rule: pairing.rule.rawValue, otherCandidates: pairing.otherCandidates),
            metadata: metadata,
            on: connection, knowing: snapshot)
        return true
    }

    /// Creates `recovery-<transactionId>` for the orphan and pairs them, if it is still in the pool.
    func recover(_ orphan: Reconciler.Orphan, price: (String?, String?), metadata: Data) async throws -> Bool {
        try await database.transaction { connection in
            let writer = receipts.writer
            let id = try OrderID("recovery-" + orphan.transactionId.rawValue)
            try await writer.lock([orphan.transactionId.streamID, id.streamID], on: connection)
            let snapshot = try await writer.read(orders: [id], transactions: [orphan.transactionId], on: connection)
            guard let pooled = snapshot.transaction(orphan.transactionId), pooled.isPooled,
                  let transaction = try pooled.verifiedTransaction(), snapshot.order(id) == nil else { return false }
            let created = OrderEvent.created(OrderCreated(
                userId: orphan.userId, productId: orphan.productId, quantity: max(1, min(transaction.quantity, 100)),
                price: price.0, currency: price.1))
            let events = [(created, EventID.named("recovery-order", orphan.transactionId.rawValue))]
                + ReceiptLedger.matchEvents(transaction, order: id, by: .reconciler)
            let write = LedgerWriter.Write(
                LedgerWriter.Append(try events.map { try EventCoding.newEvent($0.0, id: $0.1, metadata: metadata) }, to: id.streamID),
                pairing: .init(candidates: 0, rule: "recovery"))
            _ = try await writer.append(write, on: connection, knowing: snapshot)
            return true
        }
    }

    /// The catalog's active products and their prices.
    private func activeProducts() async throws -> [ProductID: (String?, String?)] {
        let rows = try await database.query(
            "SELECT product_id, price::text, currency FROM products WHERE status = 'active'")
        var products: [ProductID: (String?, String?)] = [:]
        for try await (id, price, currency) in rows.decode((String, String?, String?).self) {
            products[ProductID(unchecked: id)] = (price, currency)
        }
        return products
    }

    private func nextUsers(after user: String) async throws -> [String] {
        let rows = try await database.query(
            """
            SELECT DISTINCT resolved_user_id FROM pool_with_users
            WHERE resolved_user_id > \(user) ORDER BY resolved_user_id LIMIT \(usersPerBatch)
            """)
        var users: [String] = []
        for try await user in rows.decode(String.self) { users.append(user) }
        return users
    }

    /// The users' orphans whose user and product have no orphan younger than the settle window,
    /// and how many orphans wait for it.
    private func settledOrphans(of users: [String]) async throws -> (orphans: [Reconciler.Orphan], settling: Int) {
        let rows = try await database.query(
            """
            SELECT transaction_id, resolved_user_id, product_id, purchase_date,
                   bool_or(received_at > now() - make_interval(secs => \(settings.settle)))
                       OVER (PARTITION BY resolved_user_id, product_id)
            FROM pool_with_users
            WHERE resolved_user_id = ANY(\(users))
            """)
        var orphans: [Reconciler.Orphan] = []
        var settling = 0
        for try await (id, user, product, purchase, waits) in rows.decode((String, String, String, Date, Bool).self) {
            guard !waits else {
                settling += 1
                continue
            }
            orphans.append(.init(transactionId: TransactionID(unchecked: id), userId: UserID(unchecked: user), productId: ProductID(unchecked: product), purchaseDate: purchase))
        }
        return (orphans, settling)
    }

    private func openOrders(of users: [String]) async throws -> [Reconciler.OpenOrder] {
        let rows = try await database.query(
            """
            SELECT order_id, user_id, product_id, created_at, queued_at FROM orders
            WHERE user_id = ANY(\(users)) AND state IN ('created', 'payment-added') AND transaction_id IS NULL
            """)
        var orders: [Reconciler.OpenOrder] = []
        for try await (id, user, product, created, queued) in rows.decode((String, String, String, Date, Date?).self) {
            orders.append(.init(orderId: OrderID(unchecked: id), userId: UserID(unchecked: user), productId: ProductID(unchecked: product), createdAt: created, queuedAt: queued))
        }
        return orders
    }
}
