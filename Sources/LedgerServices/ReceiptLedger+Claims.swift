import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore

/// What Apple signed against what a backend claimed: a backend may append its own
/// `receipt-received` for a transaction the ledger has not seen signed. When Apple's signed
/// transaction arrives and contradicts that claim, Apple's word decides (issue 41).
extension ReceiptLedger {
    /// The answer's reason when the proof names an order Apple's signature points to, but another
    /// order holds the transaction.
    static let heldByAnotherOrder = "held-by-another-order"

    /// Why a backend's claim of `transaction` for `order` (held, not yet verified) cannot stand
    /// as Apple signed it: Apple signed it for another app, it is a family member's share or a
    /// subscription's later period, the Apple account or token is another user's, Apple's product
    /// or quantity is not the order's, or it was bought before the order. Nil when it stands.
    struct Contradiction {
        let reason: String
        let detail: String
        /// The order fails (Apple's product or quantity), as when a client's proof names it.
        let failsOrder: Bool
        /// The user the ledger knows for the transaction, when it is another than the order's.
        let knownUser: UserID?
        /// Whom the transaction waits in the pool for (nil: the order's user).
        var poolUser: UserID? = nil
    }

    func contradiction(of transaction: AppleTransaction, heldBy order: Order, in tx: DatabaseTransaction) async throws -> Contradiction? {
        let id = transaction.transactionId
        if transaction.isFamilyShared {
            // A family member's access to another's purchase never pays an order (issue 40),
            // whichever app's: kept as that.
            return Contradiction(
                reason: AppleTransactionRecord.familySharedReason, detail: "Apple transaction \(id) is a family member's shared access, never an order's",
                failsOrder: false, knownUser: nil)
        }
        // A subscription's later period, whichever app's.
        if let period = try await laterPeriod(transaction, in: tx) { return period }
        if case .restore(let original) = try await role(of: transaction, in: tx).0 {
            return Contradiction(
                reason: AppleTransactionRecord.restoreReason, detail: "Apple transaction \(id) restores \(original): it pays no order",
                failsOrder: false, knownUser: nil)
        }
        if !Self.sameApp(order, transaction) {
            // Apple signed it for another app: the order's claim cannot be right.
            return Contradiction(
                reason: OrderLedgerError.appMismatch(id).code, detail: "Apple transaction \(id) is of app \(transaction.bundleId), not of order \(order.orderId)'s",
                failsOrder: false, knownUser: nil)
        }
        if let token = transaction.appAccountToken, token != order.appAccountToken,
           let named = try await orders.orderID(appAccountToken: token, bundleId: transaction.bundleId, in: tx),
           let owner = try await writer.read(orders: [named], transactions: [], in: tx).order(named), owner.userId != order.userId {
            // Apple signed the token of another user's order: bought for that order, with no
            // doubt for a person to settle (as a shared Apple account leaves). It waits for that user.
            return Contradiction(
                reason: "user-mismatch", detail: "Apple transaction \(id) carries the appAccountToken of order \(named), another user's",
                failsOrder: false, knownUser: nil, poolUser: owner.userId)
        }
        if let known = try await TransactionPool(database: database).knownUser(of: transaction, in: tx), known != order.userId {
            return Contradiction(
                reason: AppleTransactionRecord.accountConflictReason, detail: "Apple transaction \(id) is of an Apple account or token of another user",
                failsOrder: false, knownUser: known)
        }
        if let (reason, detail) = Self.mismatch(transaction, order) {
            return Contradiction(reason: reason, detail: detail, failsOrder: true, knownUser: nil)
        }
        if purchased(transaction, before: order) {
            return Contradiction(
                reason: Self.purchasedBeforeOrder, detail: "Apple transaction \(id) was bought before order \(order.orderId) was created",
                failsOrder: false, knownUser: nil)
        }
        return nil
    }

    /// The order holding Apple transaction `id` on its backend's own claim, not yet verified
    /// (state `receipt-received`; never an imported grant or support's pairing), with its lock
    /// taken: what `takeBack` needs. The caller holds the transaction's lock, and `holder` is
    /// the transaction's record it read under it.
    func unverifiedClaim(of id: TransactionID, holder: AppleTransactionRecord?, in tx: DatabaseTransaction) async throws -> (order: Order, snapshot: LedgerWriter.Snapshot)? {
        guard let holder, let orderId = holder.orderId, holder.matchedBy != .imported, holder.matchedBy != .support else { return nil }
        let snapshot = try await writer.read(locking: [orderId.streamID], orders: [orderId], transactions: [id], in: tx)
        guard snapshot.transaction(id)?.orderId == orderId, let order = snapshot.order(orderId), order.state == .receiptReceived else { return nil }
        return (order, snapshot)
    }

    /// When `transaction` is a later period of a subscription (its role, by the intake's rule),
    /// which is recorded on it and never pays an order (issue 40): a backend's claim of it is kept
    /// as the renewal it is (`subscription-renewal`), the order open again. Else nil.
    func laterPeriod(_ transaction: AppleTransaction, in tx: DatabaseTransaction) async throws -> Contradiction? {
        guard case .subscriptionPeriod(let subscription) = try await role(of: transaction, in: tx).0 else { return nil }
        return Contradiction(
            reason: AppleTransactionRecord.subscriptionRenewalReason,
            detail: "Apple transaction \(transaction.transactionId) is a later period of subscription \(subscription), never an order's",
            failsOrder: false, knownUser: nil)
    }

    /// Apple refunded or revoked (`notificationType`) a transaction a backend claimed before its
    /// order was verified: the order fails, and the transaction leaves the pool with the refund.
    static func refundedBeforeVerified(_ id: TransactionID, _ order: Order, notificationType: String) -> Contradiction {
        let reason = notificationType == "REVOKE" ? "transaction-revoked" : "transaction-refunded"
        return Contradiction(
            reason: reason, detail: "Apple \(notificationType == "REVOKE" ? "revoked" : "refunded") transaction \(id) before order \(order.orderId) was verified",
            failsOrder: true, knownUser: nil)
    }

    /// What Apple said of a refund of the transaction, for `takeBackClaim`.
    enum RefundSaid {
        /// Apple's `REFUND` or `REVOKE` (`type`): it takes the claim back when nothing else does.
        case notification(String)
        /// The signed transaction itself is refunded or revoked: that alone decides.
        case signed
    }

    /// Takes back a backend's unverified claim of `transaction` (`holder`: its record, read under
    /// its lock), when what Apple signed contradicts it or Apple took the purchase back (`refund`):
    /// the one rule every way in applies. False, and nothing written, when no such claim holds it
    /// or it stands.
    func takeBackClaim(
        of transaction: AppleTransaction, holder: AppleTransactionRecord?, refund: RefundSaid? = nil, metadata: Data, in tx: DatabaseTransaction
    ) async throws -> Bool {
        let id = transaction.transactionId
        guard let (order, snapshot) = try await unverifiedClaim(of: id, holder: holder, in: tx) else { return false }
        let contradiction: Contradiction? = switch refund {
        case .signed?:
            try await laterPeriod(transaction, in: tx) ?? Self.refundedBeforeVerified(id, order, notificationType: transaction.isFamilyShared ? "REVOKE" : "REFUND")
        case .notification(let type)?: try await contradiction(of: transaction, heldBy: order, in: tx) ?? Self.refundedBeforeVerified(id, order, notificationType: type)
        case nil: try await contradiction(of: transaction, heldBy: order, in: tx)
        }
        guard let contradiction else { return false }
        _ = try await takeBack(transaction, from: order, contradiction, metadata: metadata, in: tx, knowing: snapshot)
        return true
    }

    /// `takeBackClaim` in a transaction of its own; then the transaction is taken in for `claim`
    /// as if that claim had never been (nothing more for a signed refund, which is never granted).
    /// For Apple's word that arrives without a notification: a history sweep's, a client's refunded
    /// proof. Nil, and nothing written, when no such claim was taken back.
    public func takeBackClaim(of transaction: AppleTransaction, claim: Claim, refunded: Bool = false, metadata: Data) async throws -> Answer? {
        try await database.transactionAgainAfterLostRace(lost: Self.lostRace) { tx in
            let id = transaction.transactionId
            try await lockTransaction(id, in: tx)
            let holder = try await writer.read(orders: [], transactions: [id], in: tx).transaction(id)
            guard try await takeBackClaim(of: transaction, holder: holder, refund: refunded ? .signed : nil, metadata: metadata, in: tx) else { return nil }
            return refunded ? nil : try await apply(transaction, claim: claim, metadata: metadata, in: tx)
        }
    }

    /// Takes a backend's contradicted claim back, in one write: `pairing-undone` on the order
    /// (back to the state before the receipt; then `failed` when Apple's product or quantity is
    /// not the order's) and `transaction-unmatched` with what Apple signed on the transaction,
    /// which waits in the pool (held for support in an account conflict), never paired with
    /// that order again. The client keeps the transaction.
    func takeBack(
        _ transaction: AppleTransaction, from order: Order, _ contradiction: Contradiction, metadata: Data,
        in tx: DatabaseTransaction, knowing snapshot: LedgerWriter.Snapshot
    ) async throws -> Answer {
        let id = transaction.transactionId
        let version = "\(order.version + 1)"
        var events: [(OrderEvent, EventID)] = [(
            .pairingUndone(PairingUndone(transactionId: id, reason: "Apple signed otherwise: \(contradiction.detail)", fromState: order.state)),
            EventID.named("pairing-undone", order.orderId.rawValue, id.rawValue, version))]
        if contradiction.failsOrder {
            events.append((.failed(Failed(reason: contradiction.reason, detail: contradiction.detail)),
                           EventID.named(contradiction.reason, order.orderId.rawValue, id.rawValue)))
        }
        let write = LedgerWriter.Write([
            LedgerWriter.Append(try events.map { try EventCoding.newEvent($0.0, id: $0.1, metadata: metadata) }, to: order.orderId.streamID),
            try Self.poolAppend(
                transaction, userId: contradiction.poolUser ?? order.userId, claimedOrder: order.orderId, reason: contradiction.reason, knownUserId: contradiction.knownUser,
                undoneOrderIds: Self.barred(order.orderId, after: snapshot.transaction(id)), id: EventID.named("undone", id.rawValue, order.orderId.rawValue, version), metadata: metadata),
        ])
        let written = try await writer.append(write, in: tx, knowing: snapshot)
        return Answer(outcome: .unmatched, transactionId: id, orderId: order.orderId, state: written.appends[0].order?.state ?? order.state,
                      finishTransaction: false, reason: contradiction.reason)
    }

    /// The orders a transaction taken back from `order` is barred from: `order`, and those it was
    /// undone from while it waited in the pool before (`record`'s pool entry).
    static func barred(_ order: OrderID, after record: AppleTransactionRecord?) -> [OrderID] {
        let before = (try? record?.pooled())??.undoneOrderIds ?? []
        return before.contains(order) ? before : before + [order]
    }

    /// Whether Apple's signature points to `named` rather than to `holder`, the order holding the
    /// transaction: Apple signed `named`'s per-order token (not the holder's), or the Apple account
    /// or token the ledger knows is `named`'s user's and not the holder's. A per-user token names
    /// the user, not one of the user's orders: it tells two orders of that user apart no more than
    /// the user's Apple account does (an imported order keeps a token of its own).
    func appleNames(_ named: Order, over holder: Order?, for transaction: AppleTransaction, in tx: DatabaseTransaction) async throws -> Bool {
        if let token = transaction.appAccountToken, token == named.appAccountToken, token != holder?.appAccountToken,
           try await orders.user(ofAccountToken: token, bundleId: transaction.bundleId, in: tx) == nil {
            return true
        }
        guard let known = try await TransactionPool(database: database).knownUser(of: transaction, in: tx) else { return false }
        return known == named.userId && known != holder?.userId
    }
}

extension ReceiptLedger {
    /// Holds for support (status `conflict`, issue 41) every pooled transaction whose user is
    /// not the one the ledger now knows for its token or Apple account: an account linked to
    /// another user, or tied to another user's order, after it was pooled. The reconciler's pool
    /// leaves such a transaction out, so it would wait where no one looks. Each is applied as its
    /// own user's proof again, by the one rule the intake holds conflicts by. Answers how many
    /// were held.
    public func holdConflicts(metadata: Data) async throws -> Int {
        var held = 0
        for id in try await TransactionPool(database: database).unheldConflicts() {
            // One row that cannot be applied (its product retyped since, say) is logged and left:
            // it never stops the others, nor the reconciler's pass.
            do {
                let pooled = try await database.transaction { tx in
                    try await writer.read(orders: [], transactions: [id], in: tx).transaction(id)
                }
                guard let pooled, pooled.isPooled, let user = pooled.userId, let transaction = try pooled.verifiedTransaction() else { continue }
                let answer = try await apply(transaction, claim: Claim(userId: user, orderId: nil), metadata: metadata)
                // Counted by this pass; one another server held meanwhile may be counted by both.
                if answer.reason == AppleTransactionRecord.accountConflictReason { held += 1 }
            } catch {
                database.logger.warning(
                    "a pooled transaction of an Apple account or token known for another user could not be held for support",
                    metadata: ["apple.transaction": "\(id)", "error": "\(String(reflecting: error))"])
            }
        }
        if held > 0 { database.logger.warning("pooled transactions of an Apple account or token known for another user held for support", metadata: ["held": "\(held)"]) }
        return held
    }
}
