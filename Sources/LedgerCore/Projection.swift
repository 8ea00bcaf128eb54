import Foundation

/// How events change the ledger's two projections: `orders` (an `Order` per order stream) and
/// `apple_transactions` (an `AppleTransactionRecord` per Apple transaction the ledger knows).
/// This is the only statement of those rules: the writer applies them to the rows it read before
/// it appends, and `projections rebuild` to the rows it folds from the log.
///
/// The result does not depend on whether a transaction's pool entry or its claim is folded first:
/// the writer meets them in log order, the rebuild folds every order stream before the
/// transaction streams.
public enum Projection {
    /// What order event `event` (version `version` of order `id`, recorded at `date`) makes of the
    /// order and of the row of the transaction it claims (`claimed`: that row before, nil when the
    /// ledger did not know the transaction). An event the state machine refuses changes nothing.
    public static func apply(
        _ event: OrderEvent, to order: Order?, id: OrderID, claimed: AppleTransactionRecord?, version: Int64, at date: Date
    ) -> (order: Order?, claimed: AppleTransactionRecord?) {
        guard OrderTransitions.isAllowed(event.type, from: order?.state),
              let next = Order.evolve(order, event, orderID: id, version: version, at: date) else { return (order, claimed) }
        switch event {
        case .receiptReceived(let receipt):
            let claim = AppleTransactionRecord.claimed(receipt, by: next, at: date)
            return (next, claimed.map { $0.taken(by: claim) } ?? claim)
        case .pairingUndone:
            // The transaction leaves this order (its stream's `transaction-unmatched`, in the
            // same write, puts it back in the pool).
            guard var row = claimed, row.orderId == id else { return (next, claimed) }
            row.orderId = nil
            row.status = .unmatched
            row.matchedBy = nil
            row.updatedAt = date
            return (next, row)
        case .verified(let verified):
            // A transaction its order holds, known only by a backend's own receipt-received (no
            // signed pool entry), takes the environment the verification names: the claim may name
            // none, or Production for App Review's sandbox purchase, and the proof's signed
            // environment outranks it. A row whose environment Apple signed keeps it. Reports
            // count it there.
            guard var row = claimed, row.orderId == id, let environment = verified.environment, row.environment != environment,
                  row.environment == nil || row.verification == nil else {
                return (next, claimed)
            }
            row.environment = environment
            row.updatedAt = date
            return (next, row)
        default:
            return (next, claimed)
        }
    }

    /// The app of a row whose events name none (written before the ledger knew apps, or while it
    /// held none): the ledger's first app (`firstApp`, nil while it holds none). The append routine
    /// gives a new row without an app the same, and a ledger's first app takes the rows it finds.
    public static func inFirstApp(_ order: Order, _ firstApp: BundleID?) -> Order {
        guard order.bundleId == nil, let firstApp else { return order }
        var order = order
        order.bundleId = firstApp
        return order
    }

    /// `inFirstApp` for a transaction's row.
    public static func inFirstApp(_ row: AppleTransactionRecord, _ firstApp: BundleID?) -> AppleTransactionRecord {
        guard row.bundleId == nil, let firstApp else { return row }
        var row = row
        row.bundleId = firstApp
        return row
    }

    /// What event `event` of a transaction's stream (recorded at `date`, `data` its body as
    /// stored) makes of the transaction's row.
    public static func apply(_ event: TransactionEvent, data: Data, to row: AppleTransactionRecord?, at date: Date) -> AppleTransactionRecord? {
        switch event {
        case .unmatched(let body):
            let pooled = AppleTransactionRecord.pooled(body, data: data, at: date)
            // Claimed already: only a rebuild meets the claim first; in the log the pool came first.
            guard let row, row.orderId != nil else { return pooled }
            return pooled.taken(by: row)
        case .notificationReceived(let body):
            // A renewal or a family member's share is never an order's: a refund of it changes no pool status.
            // A refund Apple had reversed before it arrived (`reversedBefore`) changes nothing.
            guard var row, row.orderId == nil, row.status == .unmatched || row.status == .refunded || row.status == .conflict,
                  body.reversedBefore != true, let status = row.poolStatus(after: body.notificationType) else { return row }
            row.status = status
            row.updatedAt = date
            return row
        case .familyShareRevoked:
            // Waiting in the pool: never granted. Held by an order: the order's, untouched.
            guard var row, row.orderId == nil else { return row }
            row.status = .refunded
            row.updatedAt = date
            return row
        case .matched, .consumptionAnswer:
            // The claim (`receipt-received` on the order) moves the row; this records the pairing.
            return row
        }
    }
}
