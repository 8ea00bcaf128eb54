import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// The Apple transactions the ledger knows, and the pool of those no order took: the reads the
/// intake, support, the reconciler and the refund catch-up make of them (`apple_transactions`,
/// the views `unmatched_transactions` and `pool_with_users`).
public struct TransactionPool: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// The order holding each of `ids` (nil: in the pool); ids the ledger does not know are absent.
    public func holders(of ids: [TransactionID]) async throws -> [TransactionID: OrderID?] {
        let rows = try await database.query(
            "SELECT transaction_id, order_id FROM apple_transactions WHERE transaction_id = ANY(\(ids.map(\.rawValue)))")
        var holders: [TransactionID: OrderID?] = [:]
        for try await (id, order) in rows.decode((String, String?).self) {
            // (Assigning nil through the subscript would drop a pooled transaction's key.)
            holders.updateValue(order.map(OrderID.init(unchecked:)), forKey: TransactionID(unchecked: id))
        }
        return holders
    }

    /// Which of `ids` an order holds on its backend's own claim, not yet verified: the order in
    /// `receipt-received`, the transaction neither an imported grant nor support's pairing.
    public func unverifiedClaims(of ids: [TransactionID]) async throws -> Set<TransactionID> {
        let rows = try await database.query("""
            SELECT t.transaction_id FROM apple_transactions t JOIN orders o ON o.order_id = t.order_id
            WHERE t.transaction_id = ANY(\(ids.map(\.rawValue))) AND o.state = 'receipt-received'
              AND t.matched_by IS DISTINCT FROM 'imported' AND t.matched_by IS DISTINCT FROM 'support'
            """)
        var claims = Set<TransactionID>()
        for try await id in rows.decode(String.self) { claims.insert(TransactionID(unchecked: id)) }
        return claims
    }

    /// The app of each of `ids` the ledger has (nil: a transaction of no app), for a key limited
    /// to apps.
    public func apps(of ids: [TransactionID]) async throws -> [TransactionID: BundleID?] {
        let rows = try await database.query(
            "SELECT transaction_id, bundle_id FROM apple_transactions WHERE transaction_id = ANY(\(ids.map(\.rawValue)))")
        var apps: [TransactionID: BundleID?] = [:]
        for try await (id, app) in rows.decode((String, String?).self) {
            apps.updateValue(app.map(BundleID.init(unchecked:)), forKey: TransactionID(unchecked: id))
        }
        return apps
    }

    /// Which of `transactions` the ledger already has refunded: by their order's state, or their
    /// pool row's, or, for a family member's transaction, its stream's `family-share-revoked`
    /// (which leaves the order that holds it as it was), or, for a subscription's billed period
    /// (a renewal pays no order and its row stays `renewal`), the period's refund on its
    /// subscription's stream, even reversed since: a period is refunded at most once.
    public func refundsRecorded(_ transactions: [TransactionID]) async throws -> Set<TransactionID> {
        guard !transactions.isEmpty else { return [] }
        let ids = transactions.map(\.rawValue)
        let rows = try await database.query(
            """
            SELECT t.transaction_id
              FROM apple_transactions t LEFT JOIN orders o ON o.order_id = t.order_id
             WHERE t.transaction_id = ANY(\(ids))
               AND (o.state = 'refunded' OR t.status = 'refunded'
                    OR EXISTS (SELECT 1 FROM events e WHERE e.stream_id = 'transaction-' || t.transaction_id AND e.type = 'family-share-revoked'))
            UNION
            SELECT p.transaction_id
              FROM subscription_periods p
             WHERE p.transaction_id = ANY(\(ids))
               AND (p.refunded_at IS NOT NULL
                    OR EXISTS (SELECT 1 FROM events e
                                WHERE e.stream_id = 'subscription-' || p.original_transaction_id
                                  AND e.type = 'subscription-period-refunded' AND e.data->>'periodKey' = p.period_key))
            """)
        var recorded: Set<TransactionID> = []
        for try await id in rows.decode(String.self) { recorded.insert(TransactionID(unchecked: id)) }
        return recorded
    }

    /// A transaction waiting in the pool, as the API shows it.
    public struct PooledTransaction: Sendable {
        public let transactionId: TransactionID
        public let userId: UserID?
        public let productId: ProductID
        public let purchaseDate: Date
        public let environment: String?
        public let appAccountToken: UUID?
        public let receivedAt: Date
        /// The `transaction-unmatched` body: the verified transaction and why no order took it.
        public let verification: Data?
        /// The app Apple signed it for.
        public var bundleId: BundleID? = nil
        /// `unmatched`, or `conflict`: held for support, as its Apple account or token is known
        /// for another user than the one claimed (no automatic path pairs it).
        public var status: String = "unmatched"
    }

    /// The pool filtered by user, product, purchase time (`from` inclusive, `to` exclusive) and
    /// transaction id, in transaction id order, after the transaction id `after` (for paging).
    /// `bundleId`: only that app's (user and product ids are per app); `apps` (an API key's): those
    /// of these apps alone.
    public func unmatched(
        userId: UserID?, productId: ProductID?, from: Date?, to: Date?, transactionId: TransactionID?, after: TransactionID?, limit: Int,
        bundleId: BundleID? = nil, apps: [BundleID]? = nil
    ) async throws -> [PooledTransaction] {
        let apps = apps?.map(\.rawValue)
        let rows = try await database.query(
            """
            SELECT transaction_id, user_id, product_id, purchase_date, environment, app_account_token, received_at, verification::text,
                   bundle_id, status
            FROM unmatched_transactions
            WHERE (\(bundleId?.rawValue)::text IS NULL OR lower(bundle_id) = lower(\(bundleId?.rawValue)))
              AND (\(userId?.rawValue)::text IS NULL OR user_id = \(userId?.rawValue))
              AND (\(productId?.rawValue)::text IS NULL OR product_id = \(productId?.rawValue))
              AND (\(from)::timestamptz IS NULL OR purchase_date >= \(from))
              AND (\(to)::timestamptz IS NULL OR purchase_date < \(to))
              AND (\(transactionId?.rawValue)::text IS NULL OR transaction_id = \(transactionId?.rawValue))
              AND (\(after?.rawValue)::text IS NULL OR transaction_id > \(after?.rawValue))
              AND (\(apps)::text[] IS NULL OR bundle_id = ANY(\(apps)::text[]))
            ORDER BY transaction_id LIMIT \(min(max(limit, 1), 1000))
            """)
        var found: [PooledTransaction] = []
        for try await (id, user, product, purchase, environment, token, received, verification, bundle, status)
            in rows.decode((String, String?, String, Date, String?, UUID?, Date, String?, String?, String).self) {
            found.append(PooledTransaction(
                transactionId: TransactionID(unchecked: id), userId: user.map(UserID.init(unchecked:)), productId: ProductID(unchecked: product),
                purchaseDate: purchase, environment: environment, appAccountToken: token, receivedAt: received,
                verification: verification.map { Data($0.utf8) }, bundleId: bundle.map(BundleID.init(unchecked:)), status: status))
        }
        return found
    }
}

extension TransactionPool {
    /// One orphan of the pool as the reconciler reads it.
    public struct PoolEntry: Sendable {
        public let orphan: Reconciler.Orphan
        /// It, or an orphan of the same user and product, is younger than the settle window.
        public let settling: Bool
    }

    /// The pool as the reconciler sees it: the orphans with a user (their own, or one resolved
    /// through an earlier transaction of the same Apple account or subscription, or the account's
    /// link), by user in user order.
    public struct ReconcilerView: Sendable {
        public var users: [UserID] = []
        public var entries: [UserID: [PoolEntry]] = [:]
        /// Orphans with no user at all: left for support.
        public var unknownUser = 0
        /// Orphans whose user was resolved rather than their own.
        public var usersResolved = 0
    }

    /// The pool with users (`pool_with_users`); an orphan is settling while it, or another of its
    /// user's orphans of the same product, was recorded less than `settle` seconds ago.
    public func reconcilerView(settle: TimeInterval) async throws -> ReconcilerView {
        let rows = try await database.query(
            """
            SELECT transaction_id, resolved_user_id, product_id, purchase_date, user_id IS NULL,
                   coalesce(bool_or(received_at > now() - make_interval(secs => \(settle)))
                       OVER (PARTITION BY bundle_id, resolved_user_id, product_id), false),
                   CASE WHEN jsonb_typeof(undone_order_ids) = 'array'
                        THEN ARRAY(SELECT jsonb_array_elements_text(undone_order_ids)) ELSE '{}' END,
                   bundle_id,
                   coalesce((SELECT (t.verification -> 'transaction' ->> 'quantity')::int FROM apple_transactions t
                              WHERE t.transaction_id = pool_with_users.transaction_id), 1)
            FROM pool_with_users
            ORDER BY resolved_user_id
            """)
        var view = ReconcilerView()
        for try await (id, user, product, purchase, withoutOwnUser, settling, undone, bundle, quantity)
            in rows.decode((String, String?, String, Date, Bool, Bool, [String], String?, Int).self) {
            guard let user else {
                view.unknownUser += 1
                continue
            }
            if withoutOwnUser { view.usersResolved += 1 }
            let userID = UserID(unchecked: user)
            if view.users.last != userID { view.users.append(userID) }
            view.entries[userID, default: []].append(PoolEntry(
                orphan: .init(
                    transactionId: TransactionID(unchecked: id), userId: userID, productId: ProductID(unchecked: product),
                    purchaseDate: purchase, undoneOrders: undone.map(OrderID.init(unchecked:)), bundleId: bundle.map(BundleID.init(unchecked:)),
                    quantity: quantity),
                settling: settling))
        }
        return view
    }

    /// The user the ledger knows for `transaction`: the user of the order its appAccountToken
    /// names, else its Apple account's owner (the link), else the user of the account's earliest
    /// transaction tied to an order. Nil when it knows none. One rule, `ledger_known_user`
    /// (migration 023), which the append routine (LE395) and the reconciler's pool ask too.
    public func knownUser(of transaction: AppleTransaction, in tx: DatabaseTransaction) async throws -> UserID? {
        // Neither a token nor an account: the rule knows no one, without asking.
        guard transaction.appAccountToken != nil || transaction.appTransactionId != nil else { return nil }
        let rows = try await tx.connection.guardedQuery(
            """
            SELECT ledger_known_user(\(transaction.appAccountToken), \(transaction.appTransactionId), \(transaction.bundleId),
                                     \(transaction.transactionId.rawValue))
            """,
            logger: database.logger)
        for try await user in rows.decode(String?.self) { return user.map { UserID(unchecked: $0) } }
        return nil
    }

    /// The user of the Apple account's earliest transaction (of `bundleId`'s app) tied to an
    /// order: whom the ledger knows for an account no link names (`ledger_known_user`'s rule).
    public func earliestTiedUser(of account: String, bundleId: String, in tx: DatabaseTransaction) async throws -> UserID? {
        let rows = try await tx.connection.guardedQuery(
            """
            SELECT k.user_id FROM apple_transactions k
             WHERE k.app_transaction_id = \(account) AND k.order_id IS NOT NULL AND k.bundle_id IS NOT DISTINCT FROM \(bundleId)
             ORDER BY k.purchase_date LIMIT 1
            """,
            logger: database.logger)
        for try await user in rows.decode(String?.self) { return user.map { UserID(unchecked: $0) } }
        return nil
    }

    /// Pooled transactions whose own user is not the one the ledger now knows for them
    /// (`ledger_known_user`: their token's order, their Apple account's link, an earlier tie, any
    /// of which may come after they were pooled), oldest first. The reconciler's pool leaves them
    /// out; the intake's rule holds them for support. A family member's share and a
    /// subscription's later period are never an order's and are not listed.
    public func unheldConflicts(limit: Int = 500) async throws -> [TransactionID] {
        let rows = try await database.query(
            """
            SELECT t.transaction_id FROM apple_transactions t
             WHERE t.order_id IS NULL AND t.status = 'unmatched' AND t.user_id IS NOT NULL
               AND (t.app_account_token IS NOT NULL OR t.app_transaction_id IS NOT NULL)
               AND coalesce(t.verification -> 'transaction' ->> 'inAppOwnershipType', '') <> 'FAMILY_SHARED'
               AND t.transaction_id = coalesce(t.original_transaction_id, t.transaction_id)
               AND ledger_known_user(t.app_account_token, t.app_transaction_id, t.bundle_id, t.transaction_id) <> t.user_id
             ORDER BY t.received_at, t.transaction_id LIMIT \(limit)
            """)
        var found: [TransactionID] = []
        for try await id in rows.decode(String.self) { found.append(TransactionID(unchecked: id)) }
        return found
    }

    /// The users of `users` the caller's transaction now holds until it ends, as the one
    /// reconciler pairing them; a user another reconciler holds is skipped, not waited for.
    public func claimUsers(_ users: [UserID], in transaction: DatabaseTransaction) async throws -> [UserID] {
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT u FROM unnest(\(users.map(\.rawValue))::text[]) AS u
            WHERE pg_try_advisory_xact_lock(\(Self.reconcilerClaimSpace), hashtext(u))
            """,
            logger: database.logger)
        var claimed: [UserID] = []
        for try await user in rows.decode(String.self) { claimed.append(UserID(unchecked: user)) }
        return claimed
    }

    /// The first key of a reconciler's claim on a user (advisory locks of two keys never meet the
    /// one-key locks of the streams).
    public static let reconcilerClaimSpace: Int32 = 0x52_43_4C_52

    /// The pairings the reconciler made for `users`' orders created since `since` (the earliest
    /// an orphan of this pass could take, `Reconciler.Settings.maximumAge` before its purchase),
    /// whose orders hold their transactions still: later passes never cross them.
    public func reconcilerPairings(of users: [UserID], since: Date, in transaction: DatabaseTransaction) async throws -> [Reconciler.EarlierPairing] {
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT o.user_id, o.product_id, o.bundle_id, o.quantity, t.purchase_date, coalesce(o.queued_at, o.created_at)
              FROM orders o JOIN apple_transactions t ON t.transaction_id = o.transaction_id AND t.order_id = o.order_id
             WHERE o.user_id = ANY(\(users.map(\.rawValue))::text[]) AND o.created_at >= \(since) AND t.matched_by = 'reconciler'
            """,
            logger: database.logger)
        var pairings: [Reconciler.EarlierPairing] = []
        for try await (user, product, bundle, quantity, purchased, queued) in rows.decode((String, String, String?, Int, Date, Date).self) {
            pairings.append(.init(
                userId: UserID(unchecked: user), productId: ProductID(unchecked: product), bundleId: bundle.map(BundleID.init(unchecked:)),
                quantity: quantity, purchaseDate: purchased, queueEntry: queued))
        }
        return pairings
    }

    /// The open orders (created or payment-added, no transaction) of `users`: the reconciler's candidates.
    public func openOrders(of users: [UserID], in transaction: DatabaseTransaction) async throws -> [Reconciler.OpenOrder] {
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT order_id, user_id, product_id, created_at, queued_at, bundle_id, quantity FROM orders
            WHERE user_id = ANY(\(users.map(\.rawValue))::text[]) AND state IN ('created', 'payment-added') AND transaction_id IS NULL
            """,
            logger: database.logger)
        var orders: [Reconciler.OpenOrder] = []
        for try await (id, user, product, created, queued, bundle, quantity) in rows.decode((String, String, String, Date, Date?, String?, Int).self) {
            orders.append(.init(
                orderId: OrderID(unchecked: id), userId: UserID(unchecked: user), productId: ProductID(unchecked: product),
                createdAt: created, queuedAt: queued, bundleId: bundle.map(BundleID.init(unchecked:)), quantity: quantity))
        }
        return orders
    }
}
