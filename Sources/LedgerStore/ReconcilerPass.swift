import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// One pass of the reconciler, set-based: reads the pool once, then takes its users in batches,
/// each batch in one database transaction that claims the batch's users (another reconciler's
/// claims are skipped, not waited for), reads their open orders, aligns them with
/// `Reconciler.pair`, locks and reads every stream the pairings touch in one call, checks each
/// pairing again there (a live receipt may have been first), and writes them all in one call
/// of the writer's routine. Safe to run on several servers at once: they divide the users.
public struct ReconcilerPass: Sendable {
    public let receipts: ReceiptLedger
    public var settings: Reconciler.Settings
    /// Orphans per batch (a batch holds whole users): with the three events of each pairing,
    /// within the 4,096 events one database transaction can position, and its locks (a claim
    /// per user, two per pairing) well within PostgreSQL's default lock table.
    public var orphansPerBatch = 500
    /// Batches in flight at once, each on a connection of its own.
    public var batchesAtOnce = 2
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
        /// Orphans with a known (or resolved) user that the pass aligned.
        public var considered = 0
        /// Orphans left for a later pass: they, or an orphan of the same user and product, are
        /// younger than the settle window.
        public var settling = 0
        public var paired = 0
        /// Pairings that had more than one candidate.
        public var ambiguous = 0
        /// Paired by rule.
        public var byRule: [String: Int] = [:]
        /// Orphans whose user came from an earlier transaction of the same Apple account or subscription, or from the account's link.
        public var usersResolved = 0
        /// Orphans with no user at all: left for support.
        public var unknownUser = 0
        /// Users another reconciler was pairing at the time: left to it.
        public var usersBusy = 0
        /// Pairings dropped because another writer (a live receipt, support) got there first.
        public var lostRaces = 0
        /// Orders created for orphans with no candidate (the recovery policy).
        public var recoveryOrders = 0
        /// Orphans with no candidate left in the pool because their product is retired or not in the catalog.
        public var notRecovered = 0
        public var seconds = 0.0
        public init() {}
    }

    /// One orphan of the pool as the pass read it.
    struct PoolEntry: Sendable {
        let orphan: Reconciler.Orphan
        /// It, or an orphan of the same user and product, is younger than the settle window.
        let settling: Bool
    }

    /// Runs one pass; `progress` gets (users done, users in the pool).
    public func run(metadata: Data = Data(#"{"appendedBy":"reconciler"}"#.utf8), progress: (@Sendable (Int, Int) -> Void)? = nil) async throws -> Summary {
        let started = ContinuousClock.now
        var summary = Summary()
        let (users, entries) = try await readPool(into: &summary)
        // Whole users per batch, up to `orphansPerBatch` orphans.
        var batches: [[UserID]] = []
        var batchOrphans = 0
        for user in users {
            let count = entries[user]?.count ?? 0
            if batches.isEmpty || (batchOrphans > 0 && batchOrphans + count > orphansPerBatch) {
                batches.append([])
                batchOrphans = 0
            }
            batches[batches.count - 1].append(user)
            batchOrphans += count
        }
        let totalUsers = users.count
        // Batches hold disjoint users, so they touch disjoint streams: while one batch's writes
        // run in PostgreSQL, the next is read and aligned.
        try await withThrowingTaskGroup(of: (Summary, Int).self) { group in
            var next = 0
            var usersDone = 0
            func start() {
                guard next < batches.count else { return }
                let batch = batches[next]
                next += 1
                group.addTask { (try await reconcile(batch, entries, metadata: metadata), batch.count) }
            }
            for _ in 0..<max(1, batchesAtOnce) { start() }
            while let (counts, users) = try await group.next() {
                summary.add(counts)
                usersDone += users
                progress?(usersDone, totalUsers)
                start()
            }
        }
        let elapsed = ContinuousClock.now - started
        summary.seconds = elapsed.inSeconds
        return summary
    }

    /// The pool with users, in user order, and the counts of orphans without one or with a resolved one.
    private func readPool(into summary: inout Summary) async throws -> (users: [UserID], entries: [UserID: [PoolEntry]]) {
        let rows = try await database.query(
            """
            SELECT transaction_id, resolved_user_id, product_id, purchase_date, user_id IS NULL,
                   coalesce(bool_or(received_at > now() - make_interval(secs => \(settings.settle)))
                       OVER (PARTITION BY resolved_user_id, product_id), false),
                   CASE WHEN jsonb_typeof(undone_order_ids) = 'array'
                        THEN ARRAY(SELECT jsonb_array_elements_text(undone_order_ids)) ELSE '{}' END
            FROM pool_with_users
            ORDER BY resolved_user_id
            """)
        var users: [UserID] = []
        var entries: [UserID: [PoolEntry]] = [:]
        for try await (id, user, product, purchase, withoutOwnUser, settling, undone)
            in rows.decode((String, String?, String, Date, Bool, Bool, [String]).self) {
            guard let user else {
                summary.unknownUser += 1
                continue
            }
            if withoutOwnUser { summary.usersResolved += 1 }
            let userID = UserID(unchecked: user)
            if users.last != userID { users.append(userID) }
            entries[userID, default: []].append(PoolEntry(
                orphan: .init(
                    transactionId: TransactionID(unchecked: id), userId: userID, productId: ProductID(unchecked: product),
                    purchaseDate: purchase, undoneOrders: undone.map(OrderID.init(unchecked:))),
                settling: settling))
        }
        return (users, entries)
    }

    /// One batch of users in one database transaction; pairings a batch cannot position in one
    /// (a user with very many orphans) in transactions of their own after it.
    private func reconcile(_ batch: [UserID], _ entries: [UserID: [PoolEntry]], metadata: Data) async throws -> Summary {
        var summary = Summary()
        let perTransaction = LedgerWriter.maximumEventsPerGroup / 3
        var later: [Reconciler.Pairing] = []
        var orphansLeft: [Reconciler.Orphan] = []
        let counted = try await database.transactionAgainAfterLostRace { connection -> Summary in
            var counts = Summary()
            let claimed = try await claim(batch, on: connection)
            counts.usersBusy = batch.count - claimed.count
            var orphans: [Reconciler.Orphan] = []
            for user in claimed {
                for entry in entries[user] ?? [] {
                    if entry.settling { counts.settling += 1 } else { orphans.append(entry.orphan) }
                }
            }
            counts.considered = orphans.count
            guard !orphans.isEmpty else { return counts }
            let orders = try await openOrders(of: Array(Set(orphans.map(\.userId))), on: connection)
            let pairings = Reconciler.pair(orphans, with: orders, settings: settings)
            try await apply(Array(pairings.prefix(perTransaction)), metadata: metadata, on: connection, into: &counts)
            later = Array(pairings.dropFirst(perTransaction))
            if recoveryOrders {
                let paired = Set(pairings.map(\.transactionId))
                orphansLeft = orphans.filter { !paired.contains($0.transactionId) }
            }
            return counts
        }
        summary.add(counted)
        for start in stride(from: 0, to: later.count, by: perTransaction) {
            let chunk = Array(later[start..<min(start + perTransaction, later.count)])
            summary.add(try await database.transactionAgainAfterLostRace { connection in
                var counts = Summary()
                try await apply(chunk, metadata: metadata, on: connection, into: &counts)
                return counts
            })
        }
        guard recoveryOrders, !orphansLeft.isEmpty else { return summary }
        let catalog = try await activeProducts()
        for orphan in orphansLeft {
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
        return summary
    }

    /// The users of `batch` this reconciler now holds until its transaction ends; a user another
    /// reconciler holds is skipped, not waited for.
    private func claim(_ batch: [UserID], on connection: PostgresConnection) async throws -> [UserID] {
        let rows = try await connection.query(
            """
            SELECT u FROM unnest(\(batch.map(\.rawValue))::text[]) AS u
            WHERE pg_try_advisory_xact_lock(\(Self.claimSpace), hashtext(u))
            """,
            logger: logger)
        var claimed: [UserID] = []
        for try await user in rows.decode(String.self) { claimed.append(UserID(unchecked: user)) }
        return claimed
    }

    /// The first key of a reconciler's claim on a user (advisory locks of two keys never meet the
    /// one-key locks of the streams).
    public static let claimSpace: Int32 = 0x52_43_4C_52

    /// Writes `pairings` in the caller's transaction: locks and reads both sides of every pairing
    /// in one call, keeps those still as the pass saw them, and writes those in one call.
    func apply(_ pairings: [Reconciler.Pairing], metadata: Data, on connection: PostgresConnection, into counts: inout Summary) async throws {
        guard !pairings.isEmpty else { return }
        let writer = receipts.writer
        let snapshot = try await writer.read(
            locking: pairings.flatMap { [$0.transactionId.streamID, $0.orderId.streamID] },
            orders: pairings.map(\.orderId), transactions: pairings.map(\.transactionId), on: connection)
        var writes: [LedgerWriter.Write] = []
        var kept: [Reconciler.Pairing] = []
        for pairing in pairings {
            guard let pooled = snapshot.transaction(pairing.transactionId), pooled.isPooled,
                  let transaction = try pooled.verifiedTransaction(), let order = snapshot.order(pairing.orderId),
                  order.isOpen, order.productId == transaction.productId
            else {
                counts.lostRaces += 1
                continue
            }
            writes.append(try receipts.matchWrite(
                transaction, to: order.orderId, by: .reconciler,
                pairing: .init(candidates: pairing.candidates, rule: pairing.rule.rawValue, otherCandidates: pairing.otherCandidates),
                metadata: metadata))
            kept.append(pairing)
        }
        for (pairing, result) in zip(kept, try await writer.append(writes, on: connection, knowing: snapshot)) {
            switch result {
            case .success:
                counts.paired += 1
                counts.byRule[pairing.rule.rawValue, default: 0] += 1
                if pairing.candidates > 1 { counts.ambiguous += 1 }
            case .failure(let error):
                logger.debug("pairing not written", metadata: ["transaction": "\(pairing.transactionId)", "error": "\(error)"])
                counts.lostRaces += 1
            }
        }
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

    private func openOrders(of users: [UserID], on connection: PostgresConnection) async throws -> [Reconciler.OpenOrder] {
        let rows = try await connection.query(
            """
            SELECT order_id, user_id, product_id, created_at, queued_at FROM orders
            WHERE user_id = ANY(\(users.map(\.rawValue))::text[]) AND state IN ('created', 'payment-added') AND transaction_id IS NULL
            """,
            logger: logger)
        var orders: [Reconciler.OpenOrder] = []
        for try await (id, user, product, created, queued) in rows.decode((String, String, String, Date, Date?).self) {
            orders.append(.init(orderId: OrderID(unchecked: id), userId: UserID(unchecked: user), productId: ProductID(unchecked: product), createdAt: created, queuedAt: queued))
        }
        return orders
    }
}

extension ReconcilerPass.Summary {
    mutating func add(_ other: Self) {
        considered += other.considered
        settling += other.settling
        paired += other.paired
        ambiguous += other.ambiguous
        byRule.merge(other.byRule, uniquingKeysWith: +)
        usersResolved += other.usersResolved
        unknownUser += other.unknownUser
        usersBusy += other.usersBusy
        lostRaces += other.lostRaces
        recoveryOrders += other.recoveryOrders
        notRecovered += other.notRecovered
    }
}
