import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import Logging

/// Applies verified Apple transactions to orders: each proof in one database transaction that
/// locks the transaction (and the order it names), ties the transaction to its order by the
/// strongest evidence, and appends `receipt-received` + `verified` (or `failed`), or puts the
/// transaction in the pool. Re-sending a proof finds it applied and appends nothing.
public struct ReceiptLedger: Sendable {
    let database: Database
    let writer: LedgerWriter
    let orders: OrderLedger
    /// The catalog's product types, which decide a transaction's role before any order is looked at.
    let catalog: ProductCatalog
    /// Where subscription starts, renewals and family members' shared subscriptions are recorded.
    let subscriptions: SubscriptionLedger
    /// How much earlier than an order's creation a purchase that pays it may be: the clocks'
    /// disagreement the reconciler allows (`Reconciler.Settings.clockSkew`). An earlier purchase
    /// never pays the order by itself (`purchased-before-order`, issue 41).
    public let purchaseAllowance: TimeInterval
    /// The pool's reason for a purchase that named an order created after it.
    public static let purchasedBeforeOrder = "purchased-before-order"

    public init(
        database: Database, writer: LedgerWriter, orders: OrderLedger, catalog: ProductCatalog, subscriptions: SubscriptionLedger,
        purchaseAllowance: TimeInterval = Reconciler.Settings().clockSkew
    ) {
        self.database = database
        self.writer = writer
        self.orders = orders
        self.catalog = catalog
        self.subscriptions = subscriptions
        self.purchaseAllowance = purchaseAllowance
    }

    /// Whether `transaction` was bought before `order` was created, beyond the allowance
    /// (`Reconciler.purchasedBeforeOrder`).
    public func purchased(_ transaction: AppleTransaction, before order: Order) -> Bool {
        Reconciler.purchasedBeforeOrder(transaction.purchaseDate, created: order.createdAt, allowance: purchaseAllowance)
    }

    /// Who sent the proof and which order it names.
    public struct Claim: Sendable {
        public var userId: UserID?
        public var orderId: OrderID?
        /// The user a transaction no order takes is pooled for when `userId` is nil: the user
        /// whose Apple account it came from (a sweep, support's lookup). Unlike `userId`, it
        /// never keeps the order the transaction's `appAccountToken` names from taking it.
        public var poolUserId: UserID?
        /// The apps the caller reaches (a key limited to apps; nil: every app). An order of
        /// another app is answered as one that does not exist, as everywhere else it is.
        public var apps: [BundleID]?
        /// The ledger chose the transaction for `orderId` (a legacy receipt sent without a
        /// transaction id), the client did not claim it: another order holding it by then (a
        /// concurrent upload of the same receipt) answers `duplicate` without failing this order.
        public var chosenByLedger = false

        public init(userId: UserID?, orderId: OrderID?, poolUserId: UserID? = nil, apps: [BundleID]? = nil, chosenByLedger: Bool = false) {
            self.userId = userId
            self.orderId = orderId
            self.poolUserId = poolUserId
            self.apps = apps
            self.chosenByLedger = chosenByLedger
        }

        /// Whether the caller may learn of `order` at all.
        public func reaches(_ order: Order) -> Bool {
            guard let apps else { return true }
            return order.bundleId.map(apps.contains) ?? false
        }
    }

    /// What happened to one transaction.
    public struct Answer: Sendable, Equatable {
        public var outcome: ReceiptOutcome
        public var transactionId: TransactionID
        /// The order the answer is about: the one that holds the transaction, or the claimed one.
        public var orderId: OrderID?
        public var state: OrderState?
        public var finishTransaction: Bool
        /// Why it is not `matched`, as a stable code.
        public var reason: String?
    }

    /// Applies `transaction`, proven by the client or by Apple, for `claim`. Its role
    /// (`TransactionRole`) is decided first: a subscription transaction without what a
    /// subscription needs, or a renewal outside its subscription's group, is refused with
    /// `LedgerInputError` and nothing is recorded.
    public func apply(_ transaction: AppleTransaction, claim: Claim, metadata: Data) async throws -> Answer {
        let (role, typing) = try await role(of: transaction)
        // Only a plain purchase takes the group commit: the others record more than an order's events.
        if role == .purchase, let answer = try await applyCommonCase(transaction, claim: claim, metadata: metadata) { return answer }
        // Another writer (a backend's own receipt-received naming this transaction, a reconciler's
        // pairing, a notification about it) was first, or PostgreSQL broke a deadlock here: again,
        // from the start, where the holder is now visible.
        return try await database.transactionAgainAfterLostRace(lost: Self.lostRace) { tx in
            try await apply(transaction, as: role, typing: typing, claim: claim, metadata: metadata, in: tx)
        }
    }

    /// Decides the role of each of a receipt's `transactions` (`TransactionRole`), before any is
    /// applied: one the ledger cannot take (a product the catalog types as an auto-renewable
    /// subscription whose transaction carries no `expiresDate`, say) refuses the whole receipt
    /// with `LedgerInputError`, rather than after the ones before it were applied.
    public func checkRoles(of transactions: [AppleTransaction]) async throws {
        for transaction in transactions { _ = try await role(of: transaction) }
    }

    /// `role(of:in:)` from the catalog's copy of the types, outside any transaction.
    func role(of transaction: AppleTransaction) async throws -> (TransactionRole, ProductCatalog.Typing?) {
        let typing = try await catalog.typing(of: transaction.productId, bundleId: transaction.bundleId)
        return (try TransactionRole.of(transaction, catalogType: typing?.type), typing)
    }

    /// The common case, through the writer's group commit rather than a transaction of its own:
    /// the order its order id (else its appAccountToken) names, open, of the same product, quantity,
    /// app and claiming user, and created before the purchase (`purchased(_:before:)`), takes the
    /// transaction. The writer checks that on the order as its group reads it, and the append
    /// routine stores the pairing only if, under the locks, the
    /// order is still as read and the transaction unclaimed (taken out of the pool if it waited
    /// there). Nil when the case does not hold, or no longer held when written: the locked path
    /// (`apply(_:claim:metadata:in:)`) then decides.
    func applyCommonCase(_ transaction: AppleTransaction, claim: Claim, metadata: Data) async throws -> Answer? {
        let named: (OrderID, MatchedBy)
        if let orderID = claim.orderId {
            named = (orderID, .applicationUsername)
        } else if let token = transaction.appAccountToken, let owner = try await orders.orderID(appAccountToken: token, bundleId: transaction.bundleId) {
            named = (owner, .appAccountToken)
        } else {
            return nil
        }
        let user = claim.userId
        var write = try Self.matchWrite(transaction, to: named.0, by: named.1, pairing: nil, metadata: metadata)
        write.condition = { [self] order in
            order.isOpen && Self.mismatch(transaction, order) == nil && (user == nil || user == order.userId) && Self.sameApp(order, transaction)
                && !purchased(transaction, before: order)
        }
        do {
            let written = try await writer.append(write)
            // A replay (the same proof raced itself): the locked path answers from what is stored.
            guard let after = written.appends.first?.order else { return nil }
            return Answer(outcome: .matched, transactionId: transaction.transactionId, orderId: named.0, state: after.state,
                          finishTransaction: after.state.clientMayFinish, reason: nil)
        } catch let error where Self.lostRace(error) || error is OrderDecisionError || error is LedgerWriter.WriteConditionFailed
                    || error as? OrderLedgerError == .accountConflict(transaction.transactionId)
                    || error as? OrderLedgerError == .appMismatch(transaction.transactionId)
                    || error as? OrderLedgerError == .refundedInPool(transaction.transactionId)
                    || (error as? OrderLedgerError)?.code == "later-transaction"
                    || (error as? OrderLedgerError)?.code == "user-mismatch" {
            return nil
        }
    }

    /// The refusals a lost race ends in: the claim or an event id taken, or a deadlock broken.
    static func lostRace(_ error: any Error) -> Bool {
        switch error {
        case OrderLedgerError.duplicateTransaction, AppendError.eventIDConflict, AppendError.wrongExpectedVersion: true
        default: isLostRace(error)
        }
    }

    /// `apply(_:claim:metadata:)` in the caller's transaction (a notification's), its role decided here.
    func apply(_ transaction: AppleTransaction, claim: Claim, metadata: Data, in tx: DatabaseTransaction) async throws -> Answer {
        let (role, typing) = try await role(of: transaction, in: tx)
        return try await apply(transaction, as: role, typing: typing, claim: claim, metadata: metadata, in: tx)
    }

    /// What `transaction` is to the ledger (the catalog's type first, else Apple's signed one), in
    /// the caller's transaction: the one rule every way in (uploads, notifications) decides by.
    func role(of transaction: AppleTransaction, in tx: DatabaseTransaction) async throws -> (TransactionRole, ProductCatalog.Typing?) {
        let typing = try await catalog.typing(of: transaction.productId, bundleId: transaction.bundleId, in: tx)
        return (try TransactionRole.of(transaction, catalogType: typing?.type), typing)
    }

    /// A purchase that pays an order (`TransactionRole.paysOrder`), in the caller's transaction.
    func applyPurchase(_ transaction: AppleTransaction, claim: Claim, metadata: Data, in tx: DatabaseTransaction) async throws -> Answer {
        let id = transaction.transactionId
        var (snapshot, candidate, matchedBy, noOrderReason) = try await lookUp(transaction, claim: claim, in: tx)
        let holder = snapshot.transaction(id)
        if let holder, let never = Self.neverAnOrders(holder) {
            // Recorded before as a renewal or a family member's share (the catalog said so then).
            return Answer(outcome: .recorded, transactionId: id, orderId: candidate?.orderId, state: candidate?.state, finishTransaction: true, reason: never)
        }
        if let order = candidate, !Self.sameApp(order, transaction) {
            // An order of another app never takes it (issue 39, app-mismatch): the order is left as
            // it is, and the transaction waits in its own app's pool for an order of that app.
            (candidate, matchedBy, noOrderReason) = (nil, nil, "app-mismatch")
        }

        if let holder, let holderOrder = holder.orderId {
            // Already granted: to this order (a re-sent proof), or to another one.
            if let candidate, candidate.orderId == holderOrder {
                var state = candidate.state
                if state == .receiptReceived, let contradiction = try await contradiction(of: transaction, heldBy: candidate, in: tx) {
                    // Held unverified, and what Apple signed says the backend's claim is wrong.
                    return try await takeBack(transaction, from: candidate, contradiction, metadata: metadata, in: tx, knowing: snapshot)
                }
                if state == .receiptReceived {
                    // Held unverified (its backend's own receipt-received): this proof verifies it,
                    // with the environment Apple signed, which reports count the order under.
                    let verified = OrderEvent.verified(Verified(transactionId: id, environment: transaction.environment))
                    let again = try await undonePairings(of: id, on: holderOrder, in: tx)
                    let named = EventID.named(["verified", holderOrder.rawValue, id.rawValue] + (again == 0 ? [] : ["again-\(again)"]))
                    state = try await append([(verified, named)], to: candidate,
                                             metadata: metadata, in: tx, knowing: snapshot).state
                } else if (holder.environment ?? "Production") != transaction.environment {
                    // The backend verified it itself, naming another environment than Apple signed:
                    // its word stands (docs/apple.md), and finance is told where to look.
                    database.logger.warning(
                        "Apple signed a transaction its backend verified in another environment: the order counts under the backend's",
                        metadata: ["apple.transaction": "\(id)", "order.id": "\(holderOrder)",
                                   "environment.recorded": "\(holder.environment ?? "none")", "environment.signed": "\(transaction.environment)"])
                }
                // An imported grant was granted by the team's earlier backend, whatever state its
                // order was left in (docs/import.md): the client finishes the transaction.
                return Answer(outcome: .matched, transactionId: id, orderId: holderOrder, state: state,
                              finishTransaction: holder.matchedBy == .imported || state.clientMayFinish, reason: nil)
            }
            let owner = try await writer.read(orders: [holderOrder], transactions: [], in: tx).order(holderOrder)
            if owner?.state == .receiptReceived, try await takeBackClaim(of: transaction, holder: holder, metadata: metadata, in: tx) {
                // Held on its backend's own claim, unverified, which Apple's signature contradicts:
                // taken back, then this proof is taken as if that claim had never been.
                return try await applyPurchase(transaction, claim: claim, metadata: metadata, in: tx)
            }
            // An imported grant was granted by the team's earlier backend, whatever state its
            // order was left in (docs/import.md): the client finishes the transaction.
            let ownerMayFinish = holder.matchedBy == .imported || (owner?.state.clientMayFinish ?? false)
            guard let loser = candidate else {
                // The holder's order, told only to a caller that reaches its app.
                let sameUser = (claim.userId == nil || owner?.userId == claim.userId) && (owner.map(claim.reaches) ?? false)
                return sameUser
                    ? Answer(outcome: .matched, transactionId: id, orderId: holderOrder, state: owner?.state, finishTransaction: ownerMayFinish, reason: nil)
                    : Answer(outcome: .duplicate, transactionId: id, orderId: nil, state: nil, finishTransaction: ownerMayFinish, reason: "duplicate-transaction")
            }
            if let ownerApp = owner?.bundleId, ownerApp.rawValue.lowercased() != transaction.bundleId.lowercased() {
                // Apple signed it for another app than the order holding it, whose claim (its
                // backend's own receipt-received) cannot be right: the order this proof names is
                // not failed for it, and the client keeps the transaction until a person decides.
                return Answer(outcome: .unmatched, transactionId: id, orderId: loser.orderId, state: loser.state,
                              finishTransaction: false, reason: OrderLedgerError.appMismatch(id).code)
            }
            if loser.isOpen, try await appleNames(loser, over: owner, for: transaction, in: tx) {
                // Apple signed the token or the Apple account of the order this proof names, not
                // of the order holding it (a backend's own claim, or support's): the named order is
                // not failed for it, and the client keeps the transaction until a person decides.
                database.logger.warning("a proof names an order Apple's signature points to, but another order holds its transaction", metadata: [
                    "apple.transaction": "\(id)", "order.id": "\(loser.orderId)", "order.holder": "\(holderOrder)"])
                return Answer(outcome: .unmatched, transactionId: id, orderId: loser.orderId, state: loser.state,
                              finishTransaction: false, reason: Self.heldByAnotherOrder)
            }
            var state = loser.state
            if loser.isOpen, !claim.chosenByLedger {
                let failed = OrderEvent.failed(Failed(reason: "duplicate-transaction", detail: "Apple transaction \(id) belongs to another order"))
                state = try await append([(failed, EventID.named("duplicate", loser.orderId.rawValue, id.rawValue))], to: loser, metadata: metadata, in: tx, knowing: snapshot).state
            }
            return Answer(outcome: .duplicate, transactionId: id, orderId: loser.orderId, state: state,
                          finishTransaction: ownerMayFinish, reason: "duplicate-transaction")
        }

        if let holder, holder.isHeldForSupport {
            // Held for support already: only support pairs it.
            return Answer(outcome: .unmatched, transactionId: id, orderId: candidate?.orderId, state: candidate?.state,
                          finishTransaction: false, reason: AppleTransactionRecord.accountConflictReason)
        }
        if let holder, holder.status != .unmatched {
            // Left the pool without an order: Apple refunded or revoked it. Never granted.
            return Answer(outcome: .rejected, transactionId: id, orderId: candidate?.orderId, state: candidate?.state,
                          finishTransaction: true, reason: "transaction-\(holder.status.rawValue)")
        }
        // The user a client claims: the one it sent, else the one of the order it named. (An order
        // found by the token is Apple's word, not a claim: the token decides, as for a sweep.)
        let claimant = claim.userId ?? (matchedBy == .applicationUsername ? candidate?.userId : nil)
        // One no order takes, pooled for the user whose Apple account it came from (a sweep,
        // support's lookup), is held as that user's claim would be: the next pass would hold it.
        // The user it waits in the pool for counts as known too when the claim names an open order
        // of another user: it pays no order that support would need `force` and a reason for. (A
        // claim naming no order, or a closed one, changes nothing: the first one stands, below.)
        if holder == nil || holder?.isPooled == true, let claimant = claimant ?? (candidate == nil ? claim.poolUserId : nil),
           let known = try await TransactionPool(database: database).knownUser(of: transaction, in: tx) ?? (candidate?.isOpen == true ? holder?.userId : nil),
           known != claimant {
            // Another user's Apple account or token (issue 41), or another user's pool entry: no
            // automatic path pairs it with the claimant's order. It waits in the pool with both
            // users, for support to decide (one that waited there already, pooled by a
            // notification or a sweep, is held from now on).
            let append = try Self.poolAppend(
                holder.flatMap { try? $0.verifiedTransaction() } ?? transaction, userId: claimant, claimedOrder: claim.orderId,
                reason: AppleTransactionRecord.accountConflictReason, knownUserId: known,
                // The orders support undid its pairing with stay barred to the reconciler.
                undoneOrderIds: (try? holder?.pooled())??.undoneOrderIds,
                id: holder == nil ? nil : EventID.named("account-conflict", id.rawValue, claimant.rawValue), metadata: metadata)
            _ = try await writer.append(LedgerWriter.Write(append), in: tx, knowing: snapshot)
            return Answer(outcome: .unmatched, transactionId: id, orderId: candidate?.orderId, state: candidate?.state,
                          finishTransaction: false, reason: AppleTransactionRecord.accountConflictReason)
        }
        if let order = candidate, matchedBy != nil, order.isOpen, purchased(transaction, before: order) {
            // Bought before the order existed (issue 41): it did not pay for it. The order is left
            // as it is, and the transaction waits in the pool, where the reconciler pairs it only
            // with an order created before it, or support ties it with an explicit override.
            if holder == nil {
                let append = try Self.poolAppend(
                    transaction, userId: claim.userId ?? order.userId, claimedOrder: claim.orderId, reason: Self.purchasedBeforeOrder, metadata: metadata)
                _ = try await writer.append(LedgerWriter.Write(append), in: tx, knowing: snapshot)
            }
            return Answer(outcome: .unmatched, transactionId: id, orderId: order.orderId, state: order.state, finishTransaction: false,
                          reason: Self.purchasedBeforeOrder)
        }
        if let order = candidate, let matchedBy, order.isOpen {
            if let (reason, detail) = Self.mismatch(transaction, order) {
                // Apple's product or quantity is not the order's: the order fails and the paid
                // transaction waits in the pool for an order of its own (promises 7 and 8). An order
                // of more units than Apple sold would grant what was never paid for.
                let failed = OrderEvent.failed(Failed(reason: reason, detail: detail))
                var appends = [try Self.orderAppend([(failed, EventID.named(reason, order.orderId.rawValue, id.rawValue))], to: order.orderId, metadata: metadata)]
                if holder == nil {
                    appends.append(try Self.poolAppend(transaction, userId: claim.userId ?? order.userId, claimedOrder: order.orderId, reason: reason, metadata: metadata))
                }
                let written = try await writer.append(LedgerWriter.Write(appends), in: tx, knowing: snapshot)
                let state = written.appends[0].order?.state ?? order.state
                return Answer(outcome: .unmatched, transactionId: id, orderId: order.orderId, state: state, finishTransaction: false, reason: reason)
            }
            let matched = try await match(transaction, to: order, by: matchedBy, metadata: metadata, in: tx, knowing: snapshot)
            return Answer(outcome: .matched, transactionId: id, orderId: matched.orderId, state: matched.state,
                          finishTransaction: matched.state.clientMayFinish, reason: nil)
        }
        let reason = candidate == nil ? noOrderReason : "order-closed"
        if holder == nil {
            // Named by no one, it waits under the user its per-user token names (its owner, as
            // Apple signed it), where support's search by user finds it.
            var user = claim.userId ?? candidate?.userId ?? claim.poolUserId
            if user == nil, let token = transaction.appAccountToken {
                user = try await orders.user(ofAccountToken: token, bundleId: transaction.bundleId, in: tx)
            }
            let append = try Self.poolAppend(transaction, userId: user, claimedOrder: claim.orderId, reason: reason, metadata: metadata)
            _ = try await writer.append(LedgerWriter.Write(append), in: tx, knowing: snapshot)
        } else if let holder, holder.isPooled, holder.userId == nil, let claimant {
            // Pooled before any client claimed it (Apple's notification names no user): the user
            // the first client names is the one the reconciler pairs it for, as if that client
            // had come first. Once: a later claim changes nothing.
            let entry = try? holder.pooled()
            let append = try Self.poolAppend(
                entry?.transaction ?? transaction, userId: claimant, claimedOrder: claim.orderId,
                reason: entry?.reason ?? reason, undoneOrderIds: entry?.undoneOrderIds, id: EventID.named("pool-user", id.rawValue), metadata: metadata)
            _ = try await writer.append(LedgerWriter.Write(append), in: tx, knowing: snapshot)
        }
        return Answer(outcome: .unmatched, transactionId: id, orderId: candidate?.orderId, state: candidate?.state, finishTransaction: false, reason: reason)
    }

    /// Ties `transaction` to `order`: `receipt-received` and `verified` on the order (and, when
    /// it leaves the pool, `transaction-matched` on its stream, which the writer appends with
    /// `pairing`). The caller holds the locks of both; answers the order as the events leave it.
    func match(
        _ transaction: AppleTransaction, to order: Order, by matchedBy: MatchedBy, pairing: LedgerWriter.Pairing? = nil,
        metadata: Data, in tx: DatabaseTransaction, knowing snapshot: LedgerWriter.Snapshot? = nil
    ) async throws -> Order {
        let again = try await undonePairings(of: transaction.transactionId, on: order.orderId, in: tx)
        return try await append(Self.matchEvents(transaction, order: order.orderId, by: matchedBy, again: again), to: order, pairing: pairing,
                                metadata: metadata, in: tx, knowing: snapshot)
    }

    /// The write `match` makes, for a caller that writes several at once.
    static func matchWrite(
        _ transaction: AppleTransaction, to order: OrderID, by matchedBy: MatchedBy, pairing: LedgerWriter.Pairing?, metadata: Data
    ) throws -> LedgerWriter.Write {
        LedgerWriter.Write(try orderAppend(Self.matchEvents(transaction, order: order, by: matchedBy), to: order, metadata: metadata), pairing: pairing)
    }

    /// `receipt-received` and `verified` for `transaction` on order `order`, with their named ids
    /// (`again`: how many pairings of the two support undid before this one).
    static func matchEvents(_ transaction: AppleTransaction, order: OrderID, by matchedBy: MatchedBy, again: Int = 0) -> [(OrderEvent, EventID)] {
        let id = transaction.transactionId
        let received = OrderEvent.receiptReceived(ReceiptReceived(
            transactionId: id, productId: transaction.productId, purchaseDate: transaction.purchaseDate,
            receiptSha256: transaction.receiptSha256, format: transaction.format, matchedBy: matchedBy,
            originalTransactionId: transaction.originalTransactionId, appTransactionId: transaction.appTransactionId,
            appAccountToken: transaction.appAccountToken, environment: transaction.environment,
            bundleId: BundleID(unchecked: transaction.bundleId), storefront: transaction.storefront))
        let verified = OrderEvent.verified(Verified(transactionId: id, environment: transaction.environment))
        let pairing = again == 0 ? [order.rawValue, id.rawValue] : [order.rawValue, id.rawValue, "again-\(again)"]
        return [(received, EventID.named(["receipt-received"] + pairing)), (verified, EventID.named(["verified"] + pairing))]
    }

    /// Appends events the ledger decided to an order in the caller's transaction: the order they leave.
    func append(
        _ events: [(OrderEvent, EventID)], to order: Order, pairing: LedgerWriter.Pairing? = nil, metadata: Data,
        in tx: DatabaseTransaction, knowing snapshot: LedgerWriter.Snapshot? = nil
    ) async throws -> Order {
        let write = LedgerWriter.Write(try Self.orderAppend(events, to: order.orderId, metadata: metadata), pairing: pairing)
        let written = try await writer.append(write, in: tx, knowing: snapshot)
        if let order = written.appends[0].order { return order }
        return try await orders.orderAsOf(order.orderId, version: written.appends[0].result.streamVersion)
    }

    private static func orderAppend(_ events: [(OrderEvent, EventID)], to order: OrderID, metadata: Data) throws -> LedgerWriter.Append {
        LedgerWriter.Append(try events.map { try EventCoding.newEvent($0.0, id: $0.1, metadata: metadata) }, to: order.streamID)
    }

    /// A verified transaction no order can take, into the pool (`transaction-unmatched`), as its
    /// first event (`id` nil) or a later one named `id`; `knownUserId` with `account-conflict`.
    static func poolAppend(
        _ transaction: AppleTransaction, userId: UserID?, claimedOrder: OrderID?, reason: String, knownUserId: UserID? = nil,
        undoneOrderIds: [OrderID]? = nil, id: EventID? = nil, metadata: Data
    ) throws -> LedgerWriter.Append {
        let body = TransactionUnmatched(
            transaction: transaction, userId: userId, claimedOrderId: claimedOrder, reason: reason, undoneOrderIds: undoneOrderIds,
            knownUserId: knownUserId)
        let event = try EventCoding.newEvent(
            .unmatched(body), id: id ?? EventID.named("unmatched", transaction.transactionId.rawValue), metadata: metadata)
        return LedgerWriter.Append([event], to: transaction.transactionId.streamID)
    }

    /// Why `order` cannot take `transaction` as Apple signed it (`product-mismatch`,
    /// `quantity-mismatch`) with the detail its `failed` says, else nil.
    static func mismatch(_ transaction: AppleTransaction, _ order: Order) -> (reason: String, detail: String)? {
        let id = transaction.transactionId
        switch order.mismatch(product: transaction.productId, quantity: transaction.quantity) {
        case nil: return nil
        case .product?:
            return (PurchaseMismatch.product.rawValue, "Apple transaction \(id) is for \(transaction.productId), the order for \(order.productId)")
        case .quantity?:
            return (PurchaseMismatch.quantity.rawValue,
                    "Apple transaction \(id) is for \(transaction.quantity) of \(transaction.productId), the order for \(order.quantity)")
        }
    }

    /// Whether `order` may take `transaction`: the same app (an order of a ledger that held no app
    /// when it was created belongs to none, and takes what it is proven).
    static func sameApp(_ order: Order, _ transaction: AppleTransaction) -> Bool {
        order.bundleId.map { $0.rawValue == transaction.bundleId } ?? true
    }

    /// Locks the transaction (every writer of it queues here: receipts, notifications, the
    /// reconciler, support) and answers what the ledger knows of it with the order the proof names
    /// by the strongest evidence: the order id it carries, then its appAccountToken; never an
    /// order of another user than the proof's. The order found is locked too.
    func lookUp(
        _ transaction: AppleTransaction, claim: Claim, in tx: DatabaseTransaction
    ) async throws -> (LedgerWriter.Snapshot, Order?, MatchedBy?, String) {
        let id = transaction.transactionId
        let named = claim.orderId.map { [$0] } ?? []
        // Its Apple account too, as its links' writer locks it: what this write reads of the
        // account's owner stays so until it commits (issue 41).
        let account = transaction.appTransactionId.map { [AppTransactionID(unchecked: $0).streamID] } ?? []
        var snapshot = try await writer.read(
            locking: [id.streamID] + named.map(\.streamID) + account, orders: named, transactions: [id], in: tx)
        var reason = "no-order"
        if let orderId = claim.orderId {
            if let order = snapshot.order(orderId), claim.reaches(order) {
                if claim.userId == nil || claim.userId == order.userId { return (snapshot, order, .applicationUsername, "") }
                reason = "user-mismatch"
            } else {
                reason = "unknown-order"
            }
        }
        if let token = transaction.appAccountToken, let found = try await orders.orderID(appAccountToken: token, bundleId: transaction.bundleId, in: tx) {
            snapshot = try await writer.read(locking: [found.streamID], orders: [found], transactions: [id], in: tx)
            if let order = snapshot.order(found), claim.reaches(order), claim.userId == nil || claim.userId == order.userId {
                return (snapshot, order, .appAccountToken, "")
            }
        }
        return (snapshot, nil, nil, reason)
    }

    /// Locks Apple transaction `id` in the caller's transaction, as every writer of it does.
    /// How many pairings of `transaction` with `order` support undid: a pairing made again (by
    /// support, or the order's own proof) has events of its own, not the undone pairing's ids.
    func undonePairings(of transaction: TransactionID, on order: OrderID, in tx: DatabaseTransaction) async throws -> Int {
        try await EventStore(database: database).undonePairings(of: transaction.rawValue, on: order.streamID, in: tx)
    }

    func lockTransaction(_ id: TransactionID, in tx: DatabaseTransaction) async throws {
        try await writer.lock([id.streamID], in: tx)
    }
}

/// The answer to one proof, as `POST /v1/receipts` says it.
public enum ReceiptOutcome: String, Codable, Sendable {
    case matched, unmatched, duplicate, rejected
    /// A transaction that never pays an order (a subscription's renewal, a family member's
    /// share), recorded where it belongs; `reason` says which.
    case recorded
    case retryLater = "retry-later"
}

extension ReceiptLedger {
    /// A proof that failed verification, as the audit trail keeps it (`proof-rejected` on the
    /// stream `proof-<receiptSha256>`): never the proof itself, only its hash and what it claimed.
    public struct Rejection: Codable, Sendable, Equatable {
        public var reason: String
        public var message: String
        public var format: ReceiptFormat
        public var receiptSha256: String
        public var orderId: OrderID?
        public var userId: UserID?
        public var transactionId: TransactionID?

        public init(reason: String, message: String, format: ReceiptFormat, receiptSha256: String, orderId: OrderID?, userId: UserID?, transactionId: TransactionID?) {
            self.reason = reason
            self.message = message
            self.format = format
            self.receiptSha256 = receiptSha256
            self.orderId = orderId
            self.userId = userId
            self.transactionId = transactionId
        }
    }

    /// Records a rejected proof once per proof and reason; the same proof sent again appends nothing.
    public func recordRejection(_ rejection: Rejection, metadata: Data) async throws {
        let event = try NewEvent(
            id: EventID.named("proof-rejected", rejection.receiptSha256, rejection.reason, rejection.orderId?.rawValue ?? ""),
            type: "proof-rejected", data: try EventCoding.encoder.encode(rejection), metadata: metadata)
        do {
            _ = try await writer.append([event], to: StreamID(unchecked: "proof-" + rejection.receiptSha256))
        } catch AppendError.eventIDConflict {
            // The same proof was refused for the same reason and order before, sent then with other
            // fields (a user id, a transaction id): the first record stands; this is a retry.
        }
    }
}
