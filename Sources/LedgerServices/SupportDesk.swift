import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import Logging

/// Support's tools on the pool: pair a transaction with an order by hand, and undo a pairing.
public struct SupportDesk: Sendable {
    let database: Database
    let writer: LedgerWriter
    /// Support's pairing ties a transaction to an order as a client's proof does.
    let receipts: ReceiptLedger

    public init(database: Database, writer: LedgerWriter, receipts: ReceiptLedger) {
        self.database = database
        self.writer = writer
        self.receipts = receipts
    }

    /// Pairs a pooled transaction with an open order by hand (`matchedBy: support`). Another
    /// user's or another product's order, or one created after the purchase (beyond the clock
    /// skew), is refused unless `force` comes with a `reason`, which is recorded with the
    /// pairing, as is who did it (the metadata).
    public func match(
        _ transactionId: TransactionID, to orderId: OrderID, force: Bool, reason: String?, metadata: Data
    ) async throws -> Order {
        if force, Self.isBlank(reason) { throw SupportMatchError.reasonRequired }
        // As an undo's: the reason is recorded on the order's event, read by every answer about it.
        if let reason, reason.unicodeScalars.count > 1_000 { throw SupportMatchError.reasonTooLong }
        // The Apple account's lock comes after the transaction's and the order's: a writer that
        // took them the other way round may deadlock with this, and the attempt then runs again.
        return try await database.transactionAgainAfterLostRace { tx in
            try await writer.lock([transactionId.streamID, orderId.streamID], in: tx)
            let snapshot = try await writer.read(orders: [orderId], transactions: [transactionId], in: tx)
            guard let known = snapshot.transaction(transactionId) else { throw SupportMatchError.transactionNotFound(transactionId) }
            guard known.isPooled || known.isHeldForSupport, let transaction = try known.verifiedTransaction() else {
                throw SupportMatchError.notInPool(transactionId, status: known.status.rawValue)
            }
            // An Apple-account conflict is support's to decide, between the two users, with a reason.
            var conflict = known.isHeldForSupport ? try known.pooled().map { Set([$0.userId, $0.knownUserId].compactMap { $0 }) } : nil
            // The user the ledger knows for its token or Apple account (`ledger_known_user`), as the
            // reconciler reads it, under the account's lock (a link being made waits or is seen).
            var accountUser: UserID?
            if conflict == nil, transaction.appAccountToken != nil || transaction.appTransactionId != nil {
                if let account = transaction.appTransactionId { try await writer.lock([AppTransactionID(unchecked: account).streamID], in: tx) }
                accountUser = try await TransactionPool(database: database).knownUser(of: transaction, in: tx)
                // Pooled for one user, of an account the ledger knows for another: a conflict in all
                // but its status (the reconciler's next pass holds it).
                if let pooledUser = known.userId, let accountUser, accountUser != pooledUser { conflict = [pooledUser, accountUser] }
            }
            if conflict != nil, Self.isBlank(reason) { throw SupportMatchError.conflictReasonRequired(transactionId) }
            guard let order = snapshot.order(orderId) else { throw OrderDecisionError.noSuchOrder }
            guard order.isOpen else { throw SupportMatchError.orderNotOpen(orderId, state: order.state) }
            if !force {
                if let conflict {
                    if !conflict.contains(order.userId) {
                        throw SupportMatchError.userMismatch(transaction: known.userId ?? order.userId, order: order.userId)
                    }
                } else if let user = known.userId ?? accountUser, user != order.userId {
                    // Pooled for no one, its user is the one the ledger knows for its token or account.
                    throw SupportMatchError.userMismatch(transaction: user, order: order.userId)
                }
                switch order.mismatch(product: transaction.productId, quantity: transaction.quantity) {
                case .product?: throw SupportMatchError.productMismatch(transaction: transaction.productId, order: order.productId)
                case .quantity?: throw SupportMatchError.quantityMismatch(transaction: transaction.quantity, order: order.quantity)
                case nil: break
                }
                if receipts.purchased(transaction, before: order) {
                    throw SupportMatchError.purchasedBeforeOrder(purchased: transaction.purchaseDate, created: order.createdAt)
                }
            }
            // A forced pairing of a conflict says both: what support overrode, and that it was one.
            let rule = switch (force, conflict != nil) {
            case (true, true): "support-forced-conflict: \(reason ?? "")"
            case (true, false): "support-forced: \(reason ?? "")"
            case (false, true): "support-conflict: \(reason ?? "")"
            case (false, false): "support"
            }
            let matched = try await receipts.match(
                transaction, to: order, by: .support, pairing: .init(candidates: 1, rule: rule), metadata: metadata, in: tx, knowing: snapshot)
            // A subscription's start held for a conflict was no one's: it starts now, as its order's.
            // One that started without a user (Apple's notification first) is now its order's user's.
            let typing = try await receipts.catalog.typing(of: transaction.productId, bundleId: transaction.bundleId, in: tx)
            if case .subscriptionStart(let subscription)? = try? TransactionRole.of(transaction, catalogType: typing?.type) {
                // Started before for another user (the one it was pooled for): the order's user paid for it.
                try await receipts.recordStart(transaction, of: subscription, typing: typing, metadata: metadata, in: tx)
            }
            return matched
        }
    }
}

extension SupportDesk {
    /// A reason that says nothing: none, or only whitespace (and byte-order marks).
    static func isBlank(_ reason: String?) -> Bool {
        !(reason ?? "").unicodeScalars.contains { !$0.properties.isWhitespace && $0 != "\u{FEFF}" }
    }

    /// Undoes the pairing of `transactionId` with its order, made from the pool (by the
    /// reconciler or support), while the order is not delivered: `pairing-undone` on the order,
    /// which returns to the state it had before the receipt, and `transaction-unmatched` (reason
    /// `undone: <reason>`) on the transaction, which returns to the pool and is never paired with
    /// that order by the reconciler again. Both in one write; who did it is in the metadata.
    /// Answers the order as it leaves it.
    public func unmatch(_ transactionId: TransactionID, reason: String, metadata: Data) async throws -> Order {
        guard !Self.isBlank(reason) else { throw SupportUnmatchError.reasonRequired }
        // Counted in code points, as the API's schema counts.
        guard reason.unicodeScalars.count <= 1_000 else { throw SupportUnmatchError.reasonTooLong }
        // The transaction's lock, then its order's: a writer that took them the other way round
        // may deadlock with this, and the attempt then runs again.
        return try await database.transactionAgainAfterLostRace { tx in
            let found = try await writer.read(locking: [transactionId.streamID], orders: [], transactions: [transactionId], in: tx)
            guard let known = found.transaction(transactionId) else { throw SupportUnmatchError.transactionNotFound(transactionId) }
            guard let orderId = known.orderId, known.status == .claimed else {
                throw SupportUnmatchError.notPaired(transactionId, status: known.status.rawValue)
            }
            // The order's lock after the transaction's, as a receipt takes them when it finds its order.
            let snapshot = try await writer.read(
                locking: [orderId.streamID], orders: [orderId], transactions: [transactionId], in: tx)
            guard let row = snapshot.transaction(transactionId), row.orderId == orderId,
                  let order = snapshot.order(orderId), order.transactionId == transactionId else {
                throw SupportUnmatchError.notPaired(transactionId, status: known.status.rawValue)
            }
            guard let pooled = try row.pooled(), let matchedBy = row.matchedBy, matchedBy == .reconciler || matchedBy == .support else {
                throw SupportUnmatchError.notFromPool(transactionId, order: orderId, matchedBy: row.matchedBy?.rawValue ?? "its proof")
            }
            guard OrderTransitions.isAllowed(.pairingUndone, from: order.state) else {
                throw SupportUnmatchError.delivered(orderId, state: order.state)
            }
            // One held for support (an Apple-account conflict) when support paired it is held again,
            // with both its users: never free for the reconciler meanwhile, and in the conflicts'
            // dashboard at once. Support's reason is the `pairing-undone`'s.
            let held = pooled.reason == AppleTransactionRecord.accountConflictReason
            let back = TransactionUnmatched(
                // Pooled for no one, it waits for no one again: support's pairing named the user.
                transaction: pooled.transaction, userId: pooled.userId, claimedOrderId: orderId,
                reason: held ? pooled.reason : "undone: \(reason)",
                undoneOrderIds: (pooled.undoneOrderIds ?? []).filter { $0 != orderId } + [orderId],
                knownUserId: held ? pooled.knownUserId : nil)
            let version = "\(order.version + 1)"
            let undone = try EventCoding.newEvent(
                .pairingUndone(PairingUndone(transactionId: transactionId, reason: reason, fromState: order.state)),
                id: EventID.named("pairing-undone", orderId.rawValue, transactionId.rawValue, version), metadata: metadata)
            let unmatched = try EventCoding.newEvent(
                .unmatched(back), id: EventID.named("undone", transactionId.rawValue, orderId.rawValue, version), metadata: metadata)
            let write = LedgerWriter.Write([
                LedgerWriter.Append([undone], to: orderId.streamID),
                LedgerWriter.Append([unmatched], to: transactionId.streamID),
            ])
            let written = try await writer.append(write, in: tx, knowing: snapshot)
            guard let left = written.appends[0].order else { throw SupportUnmatchError.notPaired(transactionId, status: known.status.rawValue) }
            // A subscription's start pays no order now: the subscription is the user's its start
            // waits for again (none while held for support, or pooled for no one).
            if let original = pooled.transaction.originalTransactionId, original == transactionId.rawValue {
                try await receipts.subscriptions.moveUser(
                    to: held ? nil : pooled.userId, from: transactionId, order: nil, on: original, metadata: metadata, in: tx)
            }
            return left
        }
    }
}

/// Why support's undo was refused, with a stable code.
public enum SupportUnmatchError: Error, Sendable, Equatable, CustomStringConvertible {
    case transactionNotFound(TransactionID)
    case notPaired(TransactionID, status: String)
    case notFromPool(TransactionID, order: OrderID, matchedBy: String)
    case delivered(OrderID, state: OrderState)
    case reasonRequired
    case reasonTooLong

    public var code: String {
        switch self {
        case .transactionNotFound: "transaction-not-found"
        case .notPaired: "transaction-not-paired"
        case .notFromPool: "not-a-pool-pairing"
        case .delivered: "order-delivered"
        case .reasonRequired: "reason-required"
        case .reasonTooLong: "reason-too-long"
        }
    }

    public var description: String {
        switch self {
        case .transactionNotFound(let id): "Apple transaction \(id) is not known to the ledger"
        case .notPaired(let id, let status): "Apple transaction \(id) is paired with no order (it is \(status))"
        case .notFromPool(let id, let order, MatchedBy.imported.rawValue):
            "Apple transaction \(id) was granted to order \(order) in an imported history; only pairings made from the pool (reconciler, support) can be undone"
        case .notFromPool(let id, let order, let matchedBy):
            "Apple transaction \(id) was tied to order \(order) by \(matchedBy) when it was uploaded; only pairings made from the pool (reconciler, support) can be undone"
        case .delivered(let id, let state):
            "order \(id) is \(state.rawValue); a pairing can be undone only before delivery (receipt-received or verified)"
        case .reasonRequired: "reason is required: it is recorded with the undo"
        case .reasonTooLong: "reason is longer than 1000 characters"
        }
    }
}

/// Why support's pairing was refused, with a stable code.
public enum SupportMatchError: Error, Sendable, Equatable, CustomStringConvertible {
    case transactionNotFound(TransactionID)
    case notInPool(TransactionID, status: String)
    case orderNotOpen(OrderID, state: OrderState)
    case userMismatch(transaction: UserID, order: UserID)
    case productMismatch(transaction: ProductID, order: ProductID)
    case quantityMismatch(transaction: Int, order: Int)
    case purchasedBeforeOrder(purchased: Date, created: Date)
    case reasonRequired
    case reasonTooLong
    case conflictReasonRequired(TransactionID)

    public var code: String {
        switch self {
        case .transactionNotFound: "transaction-not-found"
        case .notInPool: "transaction-not-unmatched"
        case .orderNotOpen: "order-not-open"
        case .userMismatch: "user-mismatch"
        case .productMismatch: "product-mismatch"
        case .quantityMismatch: "quantity-mismatch"
        case .purchasedBeforeOrder: "purchased-before-order"
        case .reasonRequired, .conflictReasonRequired: "reason-required"
        case .reasonTooLong: "reason-too-long"
        }
    }

    public var description: String {
        switch self {
        case .transactionNotFound(let id): "Apple transaction \(id) is not known to the ledger"
        case .notInPool(let id, let status): "Apple transaction \(id) is not waiting in the pool (it is \(status))"
        case .orderNotOpen(let id, let state): "order \(id) is \(state.rawValue); only created or payment-added orders without a transaction take one"
        case .userMismatch(let transaction, let order): "the transaction is user \(transaction)'s, the order user \(order)'s; send force with a reason to pair them anyway"
        case .productMismatch(let transaction, let order): "the transaction is for \(transaction), the order for \(order); send force with a reason to pair them anyway"
        case .quantityMismatch(let transaction, let order):
            "Apple sold \(transaction) of the product, the order is for \(order); send force with a reason to pair them anyway"
        case .purchasedBeforeOrder(let purchased, let created):
            "the transaction was bought at \(EventCoding.formatDate(purchased)), before the order was created at \(EventCoding.formatDate(created)); send force with a reason to pair them anyway"
        case .reasonRequired: "force needs a reason, recorded with the pairing"
        case .reasonTooLong: "reason is longer than 1000 characters"
        case .conflictReasonRequired(let id):
            "Apple transaction \(id) waits for support to choose between two users of its Apple account: send a reason, recorded with the pairing"
        }
    }
}
