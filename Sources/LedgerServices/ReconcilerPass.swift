import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import Logging

/// One pass of the reconciler, set-based: reads the pool once, then takes its users in batches,
/// each batch in one database transaction that claims the batch's users (another reconciler's
/// claims are skipped, not waited for), reads their open orders, aligns them with
/// `Reconciler.pair`, locks and reads every stream the pairings touch in one call, checks each
/// pairing again there (a live receipt may have been first), and writes them all in one call
/// of the writer's routine. Safe to run on several servers at once: they divide the users.
public struct ReconcilerPass: Sendable {
    let database: Database
    let writer: LedgerWriter
    let pool: TransactionPool
    let catalog: ProductCatalog
    /// Where a subscription's start the pass pairs records its user, when it started without one.
    let subscriptions: SubscriptionLedger
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
    /// Where pooled transactions that turned out to be of another user's Apple account or token
    /// are held for support before each pass (`ReceiptLedger.holdConflicts`); nil: not looked for.
    public var receipts: ReceiptLedger?
    var logger: Logger { database.logger }

    public init(
        database: Database, writer: LedgerWriter, pool: TransactionPool, catalog: ProductCatalog, subscriptions: SubscriptionLedger,
        settings: Reconciler.Settings = .init()
    ) {
        self.database = database
        self.writer = writer
        self.pool = pool
        self.catalog = catalog
        self.subscriptions = subscriptions
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
        /// Orphans with no candidate left in the pool because their product is retired or not in
        /// the catalog, or because they were purchased before the order they named.
        public var notRecovered = 0
        /// Pooled transactions held for support before the pass: their own user is not the one
        /// the ledger came to know for their Apple account or token (a link, a tie made since).
        public var heldForSupport = 0
        public var seconds = 0.0
        public init() {}
    }

    /// Runs one pass; `progress` gets (users done, users in the pool).
    public func run(metadata: Data = Data(#"{"appendedBy":"reconciler"}"#.utf8), progress: (@Sendable (Int, Int) -> Void)? = nil) async throws -> Summary {
        let started = ContinuousClock.now
        var summary = Summary()
        if let receipts { summary.heldForSupport = try await receipts.holdConflicts(metadata: metadata) }
        let view = try await pool.reconcilerView(settle: settings.settle)
        summary.unknownUser = view.unknownUser
        summary.usersResolved = view.usersResolved
        let (users, entries) = (view.users, view.entries)
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

    /// One batch of users in one database transaction; pairings a batch cannot position in one
    /// (a user with very many orphans) in transactions of their own after it.
    private func reconcile(_ batch: [UserID], _ entries: [UserID: [TransactionPool.PoolEntry]], metadata: Data) async throws -> Summary {
        var summary = Summary()
        let perTransaction = LedgerWriter.maximumEventsPerGroup / 3
        var later: [Reconciler.Pairing] = []
        var orphansLeft: [Reconciler.Orphan] = []
        // Orphans whose pairing the append routine refused (`refusedPairing`), which aborted the
        // batch's transaction: the batch runs again without them.
        var refused: Set<TransactionID> = []
        let counted = try await againWithoutRefused(&refused) { refused in try await database.transactionAgainAfterLostRace { tx -> Summary in
            var counts = Summary()
            let claimed = try await pool.claimUsers(batch, in: tx)
            counts.usersBusy = batch.count - claimed.count
            var orphans: [Reconciler.Orphan] = []
            for user in claimed {
                for entry in entries[user] ?? [] where !refused.contains(entry.orphan.transactionId) {
                    if entry.settling { counts.settling += 1 } else { orphans.append(entry.orphan) }
                }
            }
            counts.considered = orphans.count
            guard !orphans.isEmpty else { return counts }
            let users = Array(Set(orphans.map(\.userId)))
            let orders = try await pool.openOrders(of: users, in: tx)
            // What earlier passes paired stays where it is: this pass aligns around it.
            let since = (orphans.map(\.purchaseDate).min() ?? Date()).addingTimeInterval(-settings.maximumAge)
            let earlier = try await pool.reconcilerPairings(of: users, since: since, in: tx)
            let pairings = Reconciler.pair(orphans, with: orders, settings: settings, earlier: earlier)
            try await apply(Array(pairings.prefix(perTransaction)), metadata: metadata, in: tx, into: &counts)
            later = Array(pairings.dropFirst(perTransaction))
            if recoveryOrders {
                let paired = Set(pairings.map(\.transactionId))
                orphansLeft = orphans.filter { !paired.contains($0.transactionId) }
            }
            return counts
        } }
        summary.add(counted)
        for start in stride(from: 0, to: later.count, by: perTransaction) {
            let chunk = Array(later[start..<min(start + perTransaction, later.count)])
            summary.add(try await againWithoutRefused(&refused) { refused in try await database.transactionAgainAfterLostRace { tx in
                var counts = Summary()
                try await apply(chunk.filter { !refused.contains($0.transactionId) }, metadata: metadata, in: tx, into: &counts)
                return counts
            } })
        }
        summary.lostRaces += refused.count
        guard recoveryOrders, !orphansLeft.isEmpty else { return summary }
        let active = try await catalog.activePrices()
        for orphan in orphansLeft {
            guard let product = active[ProductCatalog.AppProduct(orphan.bundleId, orphan.productId)] else {
                summary.notRecovered += 1
                continue
            }
            let recovered: Recovery
            do {
                recovered = try await recover(orphan, price: product, metadata: metadata)
            } catch {
                // The routine refused the order or its pairing (its app retired meanwhile, the
                // account another user's): that orphan waits, the others go on.
                guard let refusal = error as? OrderLedgerError else { throw error }
                logger.notice("recovery order refused", metadata: ["transaction": "\(orphan.transactionId)", "reason": "\(refusal.code)"])
                summary.notRecovered += 1
                continue
            }
            switch recovered {
            case .created:
                summary.recoveryOrders += 1
                summary.byRule["recovery", default: 0] += 1
            case .gone:
                summary.lostRaces += 1
            case .purchasedBeforeOrder, .undone:
                summary.notRecovered += 1
            }
        }
        return summary
    }

    /// `body` with the orphans `refused` leaves out, again without each one whose pairing the
    /// append routine refuses (`refusedPairing`): its checks raise, which ends the whole
    /// transaction, so one pairing's refusal would otherwise stop every pass at that batch.
    private func againWithoutRefused(
        _ refused: inout Set<TransactionID>, _ body: (Set<TransactionID>) async throws -> Summary
    ) async throws -> Summary {
        while true {
            do {
                return try await body(refused)
            } catch {
                guard let id = Self.refusedPairing(error), refused.insert(id).inserted else { throw error }
                logger.notice("pairing refused; the batch again without it", metadata: ["transaction": "\(id)", "error": "\(error)"])
            }
        }
    }

    /// The transaction whose pairing the append routine refused by raising: one of an Apple
    /// account or token the ledger knows for another user than the order's (the pass's own
    /// earlier pairing of that account may have made it known), or of another app; nil for any
    /// other error.
    static func refusedPairing(_ error: any Error) -> TransactionID? {
        switch error as? OrderLedgerError {
        case .accountConflict(let id), .appMismatch(let id): id
        default: nil
        }
    }

    /// Writes `pairings` in the caller's transaction: locks and reads both sides of every pairing
    /// in one call, keeps those still as the pass saw them, and writes those in one call.
    func apply(_ pairings: [Reconciler.Pairing], metadata: Data, in tx: DatabaseTransaction, into counts: inout Summary) async throws {
        guard !pairings.isEmpty else { return }
        let snapshot = try await writer.read(
            locking: pairings.flatMap { [$0.transactionId.streamID, $0.orderId.streamID] },
            orders: pairings.map(\.orderId), transactions: pairings.map(\.transactionId), in: tx)
        var writes: [LedgerWriter.Write] = []
        var kept: [(pairing: Reconciler.Pairing, transaction: AppleTransaction, order: Order)] = []
        for pairing in pairings {
            // As the pass read it, under the locks: still pooled, its order open and fitting, and no
            // client's claim named another user meanwhile (`pool-user`).
            guard let pooled = snapshot.transaction(pairing.transactionId), pooled.isPooled,
                  let transaction = try pooled.verifiedTransaction(), let order = snapshot.order(pairing.orderId),
                  order.isOpen, ReceiptLedger.mismatch(transaction, order) == nil, pooled.userId.map({ $0 == order.userId }) ?? true
            else {
                counts.lostRaces += 1
                continue
            }
            writes.append(try ReceiptLedger.matchWrite(
                transaction, to: order.orderId, by: .reconciler,
                pairing: .init(candidates: pairing.candidates, rule: pairing.rule.rawValue, otherCandidates: pairing.otherCandidates),
                metadata: metadata))
            kept.append((pairing, transaction, order))
        }
        for ((pairing, transaction, order), result) in zip(kept, try await writer.append(writes, in: tx, knowing: snapshot)) {
            switch result {
            case .success:
                counts.paired += 1
                counts.byRule[pairing.rule.rawValue, default: 0] += 1
                if pairing.candidates > 1 { counts.ambiguous += 1 }
                try await recordSubscriptionUser(of: transaction, user: order.userId, order: order.orderId, metadata: metadata, in: tx)
            case .failure(let error):
                logger.debug("pairing not written", metadata: ["transaction": "\(pairing.transactionId)", "error": "\(error)"])
                counts.lostRaces += 1
            }
        }
    }

    /// What `recover` did with an orphan.
    enum Recovery {
        case created
        /// No longer in the pool (paired or held meanwhile).
        case gone
        /// Its recovery order exists: support undid their pairing, and the orphan waits for
        /// support (no pass makes another order for it).
        case undone
        /// It waits as `purchased-before-order`: it named an order created after Apple signed
        /// it, so it may be a purchase granted before (issue 41). An order made now would pay it
        /// all the same; support decides, with an explicit override.
        case purchasedBeforeOrder
    }

    /// Creates `recovery-<transactionId>` for the orphan and pairs them, if it is still in the pool.
    func recover(_ orphan: Reconciler.Orphan, price: (String?, String?), metadata: Data) async throws -> Recovery {
        try await database.transaction { tx in
            let id = try OrderID("recovery-" + orphan.transactionId.rawValue)
            try await writer.lock([orphan.transactionId.streamID, id.streamID], in: tx)
            let snapshot = try await writer.read(orders: [id], transactions: [orphan.transactionId], in: tx)
            guard let pooled = snapshot.transaction(orphan.transactionId), pooled.isPooled, let entry = try pooled.pooled() else { return .gone }
            guard snapshot.order(id) == nil else { return .undone }
            guard entry.reason != ReceiptLedger.purchasedBeforeOrder else { return .purchasedBeforeOrder }
            let transaction = entry.transaction
            let created = OrderEvent.created(OrderCreated(
                userId: orphan.userId, productId: orphan.productId, quantity: max(1, min(transaction.quantity, 100)),
                price: price.0, currency: price.1, bundleId: pooled.bundleId))
            let events = [(created, EventID.named("recovery-order", orphan.transactionId.rawValue))]
                + ReceiptLedger.matchEvents(transaction, order: id, by: .reconciler)
            let write = LedgerWriter.Write(
                LedgerWriter.Append(try events.map { try EventCoding.newEvent($0.0, id: $0.1, metadata: metadata) }, to: id.streamID),
                pairing: .init(candidates: 0, rule: "recovery"))
            _ = try await writer.append(write, in: tx, knowing: snapshot)
            try await recordSubscriptionUser(of: transaction, user: orphan.userId, order: id, metadata: metadata, in: tx)
            return .created
        }
    }

    /// A subscription's start the pass paired with `order` of `user`, in the pairing's transaction:
    /// its subscription, started without a user (Apple's `SUBSCRIBED` came before any upload, and
    /// the start waited with no user) or for another one, is now that user's
    /// (`subscription-user-recorded`), as the intake and support record it. Nothing for any other
    /// transaction, nor for a subscription that is not known.
    private func recordSubscriptionUser(
        of transaction: AppleTransaction, user: UserID, order: OrderID, metadata: Data, in tx: DatabaseTransaction
    ) async throws {
        // Only a start is its own original; the rest are purchases, told apart without a read.
        guard transaction.originalTransactionId == transaction.transactionId.rawValue else { return }
        // The intake's rule, the catalog's type first: its copy, as the renewal groups read it.
        let typing = try await catalog.typing(of: transaction.productId, bundleId: transaction.bundleId)
        guard case .subscriptionStart(let id)? = try? TransactionRole.of(transaction, catalogType: typing?.type) else { return }
        // The user of the order its start pays, whoever it was started for.
        try await subscriptions.moveUser(to: user, from: transaction.transactionId, order: order, on: id, metadata: metadata, in: tx)
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
