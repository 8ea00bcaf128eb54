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
    /// as Apple signed it: the Apple account or token is another user's, Apple's product or
    /// quantity is not the order's, or it was bought before the order. Nil when it stands.
    struct Contradiction {
        let reason: String
        let detail: String
        /// The order fails (Apple's product or quantity), as when a client's proof names it.
        let failsOrder: Bool
        /// The user the ledger knows for the transaction, when it is another than the order's.
        let knownUser: UserID?
    }

    func contradiction(of transaction: AppleTransaction, heldBy order: Order, in tx: DatabaseTransaction) async throws -> Contradiction? {
        let id = transaction.transactionId
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
                transaction, userId: order.userId, claimedOrder: order.orderId, reason: contradiction.reason, knownUserId: contradiction.knownUser,
                undoneOrderIds: [order.orderId], id: EventID.named("undone", id.rawValue, order.orderId.rawValue, version), metadata: metadata),
        ])
        let written = try await writer.append(write, in: tx, knowing: snapshot)
        return Answer(outcome: .unmatched, transactionId: id, orderId: order.orderId, state: written.appends[0].order?.state ?? order.state,
                      finishTransaction: false, reason: contradiction.reason)
    }

    /// Whether Apple's signature points to `named` rather than to `holder`, the order holding the
    /// transaction: Apple signed `named`'s token (not the holder's), or the Apple account or token
    /// the ledger knows is `named`'s user's and not the holder's.
    func appleNames(_ named: Order, over holder: Order?, for transaction: AppleTransaction, in tx: DatabaseTransaction) async throws -> Bool {
        if let token = transaction.appAccountToken, token == named.appAccountToken, token != holder?.appAccountToken { return true }
        guard let known = try await TransactionPool(database: database).knownUser(of: transaction, in: tx) else { return false }
        return known == named.userId && known != holder?.userId
    }
}
