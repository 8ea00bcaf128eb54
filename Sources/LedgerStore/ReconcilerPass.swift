import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// One pass of the reconciler: reads the pool and the open orders of its users in batches,
/// pairs them with `Reconciler.pair`, and applies each pairing in a transaction of its own that
/// takes the Apple transaction's lock and the order's row lock and checks both again (another
/// reconciler or a live receipt may have been first). Safe to run on several servers at once.
public struct ReconcilerPass: Sendable {
    public let receipts: ReceiptLedger
    public var settings: Reconciler.Settings
    /// Users per batch: their orphans and open orders are read in two queries.
    public var usersPerBatch = 1_000
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
        public var seconds = 0.0
        public init() {}
    }

    /// Runs one pass; `progress` gets (users done, users in the pool).
    public func run(metadata: Data = Data(#"{"appendedBy":"reconciler"}"#.utf8), progress: (@Sendable (Int, Int) -> Void)? = nil) async throws -> Summary {
        let started = ContinuousClock.now
        var summary = Summary()
        summary.unknownUser = try await count("SELECT count(*)::int FROM pool_with_users WHERE resolved_user_id IS NULL")
        summary.usersResolved = try await count("SELECT count(*)::int FROM pool_with_users WHERE user_id IS NULL AND resolved_user_id IS NOT NULL")
        let totalUsers = try await count("SELECT count(DISTINCT resolved_user_id)::int FROM pool_with_users WHERE resolved_user_id IS NOT NULL")
        var afterUser = ""
        var usersDone = 0
        while true {
            let users = try await nextUsers(after: afterUser)
            guard let last = users.last else { break }
            afterUser = last
            let orphans = try await orphans(of: users)
            let orders = try await openOrders(of: users)
            summary.considered += orphans.count
            for pairing in Reconciler.pair(orphans, with: orders, settings: settings) {
                if try await apply(pairing, metadata: metadata) {
                    summary.paired += 1
                    summary.byRule[pairing.rule.rawValue, default: 0] += 1
                    if pairing.candidates > 1 { summary.ambiguous += 1 }
                } else {
                    summary.lostRaces += 1
                }
            }
            usersDone += users.count
            progress?(usersDone, totalUsers)
        }
        let elapsed = ContinuousClock.now - started
        summary.seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return summary
    }

    /// Applies one pairing if both sides are still as the pass saw them.
    func apply(_ pairing: Reconciler.Pairing, metadata: Data) async throws -> Bool {
        try await database.transaction { connection in
            let now = try await receipts.lockTransaction(pairing.transactionId, on: connection)
            let rows = try await connection.query(
                """
                SELECT verification::text FROM apple_transactions
                WHERE transaction_id = \(pairing.transactionId.rawValue) AND order_id IS NULL AND status = 'unmatched'
                """,
                logger: logger)
            var verification: String?
            for try await text in rows.decode(String?.self) { verification = text }
            guard let verification, let pooled = try? LedgerJSON.decoder.decode(TransactionUnmatched.self, from: Data(verification.utf8)),
                  let order = try await receipts.orders.projection.order(pairing.orderId, on: connection, forUpdate: true),
                  order.isOpen, order.productId == pooled.transaction.productId
            else { return false }
            _ = try await receipts.match(
                pooled.transaction, to: order, by: .reconciler, candidates: pairing.candidates, rule: pairing.rule.rawValue,
                fromPool: true, at: now, metadata: metadata, on: connection)
            return true
        }
    }

    private func nextUsers(after user: String) async throws -> [String] {
        let rows = try await database.client.query(
            """
            SELECT DISTINCT resolved_user_id FROM pool_with_users
            WHERE resolved_user_id > \(user) ORDER BY resolved_user_id LIMIT \(usersPerBatch)
            """,
            logger: logger)
        var users: [String] = []
        for try await user in rows.decode(String.self) { users.append(user) }
        return users
    }

    private func orphans(of users: [String]) async throws -> [Reconciler.Orphan] {
        let rows = try await database.client.query(
            """
            SELECT transaction_id, resolved_user_id, product_id, purchase_date FROM pool_with_users
            WHERE resolved_user_id = ANY(\(users))
            """,
            logger: logger)
        var orphans: [Reconciler.Orphan] = []
        for try await (id, user, product, purchase) in rows.decode((String, String, String, Date).self) {
            orphans.append(.init(transactionId: TransactionID(unchecked: id), userId: UserID(unchecked: user), productId: ProductID(unchecked: product), purchaseDate: purchase))
        }
        return orphans
    }

    private func openOrders(of users: [String]) async throws -> [Reconciler.OpenOrder] {
        let rows = try await database.client.query(
            """
            SELECT order_id, user_id, product_id, created_at, queued_at FROM orders
            WHERE user_id = ANY(\(users)) AND state IN ('created', 'payment-added') AND transaction_id IS NULL
            """,
            logger: logger)
        var orders: [Reconciler.OpenOrder] = []
        for try await (id, user, product, created, queued) in rows.decode((String, String, String, Date, Date?).self) {
            orders.append(.init(orderId: OrderID(unchecked: id), userId: UserID(unchecked: user), productId: ProductID(unchecked: product), createdAt: created, queuedAt: queued))
        }
        return orders
    }

    private func count(_ query: PostgresQuery) async throws -> Int {
        for try await value in try await database.client.query(query, logger: logger).decode(Int.self) { return value }
        return 0
    }
}
