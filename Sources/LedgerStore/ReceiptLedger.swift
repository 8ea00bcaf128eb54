import Crypto
import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// Applies verified Apple transactions to orders: each proof in one database transaction that
/// serialises on the transaction id, ties the transaction to its order by the strongest evidence,
/// appends `receipt-received` + `verified` (or `failed`), or puts the transaction in the pool.
/// Re-sending a proof finds it applied and appends nothing.
public struct ReceiptLedger: Sendable {
    public let orders: OrderLedger
    var database: Database { orders.database }
    var logger: Logger { orders.database.logger }

    public init(orders: OrderLedger) {
        self.orders = orders
    }

    /// Who sent the proof and which order it names.
    public struct Claim: Sendable {
        public var userId: UserID?
        public var orderId: OrderID?
        public init(userId: UserID?, orderId: OrderID?) {
            self.userId = userId
            self.orderId = orderId
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

    /// Applies `transaction`, proven by the client or by Apple, for `claim`.
    public func apply(_ transaction: AppleTransaction, claim: Claim, metadata: Data) async throws -> Answer {
        do {
            return try await database.transaction { connection in
                try await apply(transaction, claim: claim, metadata: metadata, on: connection)
            }
        } catch let error where Self.lostRace(error) {
            // A writer that takes no transaction lock (an order event appended by hand, naming
            // this transaction) claimed it meanwhile, and the database refused this claim; or
            // PostgreSQL broke a deadlock here. Again, from the start: the holder is now visible.
            return try await database.transaction { connection in
                try await apply(transaction, claim: claim, metadata: metadata, on: connection)
            }
        }
    }

    /// The refusals a lost race ends in: the claim's key or the pool's event id taken, or a
    /// deadlock broken by PostgreSQL.
    static func lostRace(_ error: any Error) -> Bool {
        switch error {
        case OrderLedgerError.duplicateTransaction, AppendError.eventIDConflict, AppendError.wrongExpectedVersion: true
        // 40P01: a deadlock with a reconciler's chunk of pairings, which PostgreSQL broke here.
        case let error as PSQLError: error.sqlState == "23505" || error.sqlState == "40P01"
        default: false
        }
    }

    func apply(_ transaction: AppleTransaction, claim: Claim, metadata: Data, on connection: PostgresConnection) async throws -> Answer {
        let id = transaction.transactionId
        let (now, holder, candidate, matchedBy, noOrderReason) = try await lookUp(transaction, claim: claim, on: connection)

        if let holder = holder, let holderOrder = holder.orderId {
            // Already granted: to this order (a re-sent proof), or to another one.
            if let candidate, candidate.orderId == holderOrder {
                return Answer(outcome: .matched, transactionId: id, orderId: holderOrder, state: candidate.state,
                              finishTransaction: candidate.state.clientMayFinish, reason: nil)
            }
            let owner = try await orders.projection.order(holderOrder, on: connection)
            let ownerMayFinish = owner?.state.clientMayFinish ?? false
            guard var loser = candidate else {
                let sameUser = claim.userId == nil || owner?.userId == claim.userId
                return sameUser
                    ? Answer(outcome: .matched, transactionId: id, orderId: holderOrder, state: owner?.state, finishTransaction: ownerMayFinish, reason: nil)
                    : Answer(outcome: .duplicate, transactionId: id, orderId: nil, state: nil, finishTransaction: ownerMayFinish, reason: "duplicate-transaction")
            }
            if loser.isOpen {
                let failed = OrderEvent.failed(Failed(reason: "duplicate-transaction", detail: "Apple transaction \(id) belongs to another order"))
                loser = try await orders.apply([(failed, Self.eventID("duplicate", loser.orderId.rawValue, id.rawValue))], to: loser, at: now, metadata: metadata, on: connection)
            }
            return Answer(outcome: .duplicate, transactionId: id, orderId: loser.orderId, state: loser.state,
                          finishTransaction: ownerMayFinish, reason: "duplicate-transaction")
        }

        let pooled = holder != nil
        if let holder, holder.status != "unmatched" {
            // Left the pool without an order: Apple refunded or revoked it. Never granted.
            return Answer(outcome: .rejected, transactionId: id, orderId: candidate?.orderId, state: candidate?.state,
                          finishTransaction: true, reason: "transaction-\(holder.status)")
        }
        if var order = candidate, let matchedBy, order.isOpen {
            if order.productId != transaction.productId {
                // Apple's product is not the order's: the order fails and the paid transaction
                // waits in the pool for an order of its own product (DESIGN.md promises 7 and 8).
                let failed = OrderEvent.failed(Failed(
                    reason: "product-mismatch",
                    detail: "Apple transaction \(id) is for \(transaction.productId), the order for \(order.productId)"))
                order = try await orders.apply([(failed, Self.eventID("product-mismatch", order.orderId.rawValue, id.rawValue))], to: order, at: now, metadata: metadata, on: connection)
                if !pooled {
                    try await pool(transaction, userId: claim.userId ?? order.userId, claimedOrder: order.orderId, reason: "product-mismatch", at: now, metadata: metadata, on: connection)
                }
                return Answer(outcome: .unmatched, transactionId: id, orderId: order.orderId, state: order.state, finishTransaction: false, reason: "product-mismatch")
            }
            order = try await match(transaction, to: order, by: matchedBy, candidates: 1, fromPool: pooled, at: now, metadata: metadata, on: connection)
            return Answer(outcome: .matched, transactionId: id, orderId: order.orderId, state: order.state,
                          finishTransaction: order.state.clientMayFinish, reason: nil)
        }
        let reason = candidate == nil ? noOrderReason : "order-closed"
        if !pooled {
            try await pool(transaction, userId: claim.userId ?? candidate?.userId, claimedOrder: claim.orderId, reason: reason, at: now, metadata: metadata, on: connection)
        }
        return Answer(outcome: .unmatched, transactionId: id, orderId: candidate?.orderId, state: candidate?.state, finishTransaction: false, reason: reason)
    }

    /// Ties `transaction` to `order`: `receipt-received` and `verified` on the order, and
    /// `transaction-matched` on the transaction's stream when it leaves the pool.
    func match(
        _ transaction: AppleTransaction, to order: Order, by matchedBy: MatchedBy, candidates: Int, rule: String? = nil, fromPool: Bool,
        at now: Date, metadata: Data, on connection: PostgresConnection
    ) async throws -> Order {
        let id = transaction.transactionId
        if fromPool {
            let matched = TransactionMatched(orderId: order.orderId, matchedBy: matchedBy, candidates: candidates, rule: rule ?? matchedBy.rawValue)
            let event = try NewEvent(
                id: Self.eventID("matched", id.rawValue, order.orderId.rawValue), type: TransactionEventType.matched.rawValue,
                data: try LedgerJSON.encoder.encode(matched), metadata: metadata)
            _ = try await orders.store.append([event], to: id.streamID, expectedVersion: .any, on: connection)
        }
        let received = OrderEvent.receiptReceived(ReceiptReceived(
            transactionId: id, productId: transaction.productId, purchaseDate: transaction.purchaseDate,
            receiptSha256: transaction.receiptSha256, format: transaction.format, matchedBy: matchedBy,
            originalTransactionId: transaction.originalTransactionId, appTransactionId: transaction.appTransactionId,
            appAccountToken: transaction.appAccountToken, environment: transaction.environment))
        let verified = OrderEvent.verified(Verified(transactionId: id, environment: transaction.environment))
        return try await orders.apply(
            [(received, Self.eventID("receipt-received", order.orderId.rawValue, id.rawValue)),
             (verified, Self.eventID("verified", order.orderId.rawValue, id.rawValue))],
            to: order, at: now, metadata: metadata, on: connection)
    }

    /// Puts a verified transaction no order can take into the pool (`transaction-unmatched`).
    func pool(
        _ transaction: AppleTransaction, userId: UserID?, claimedOrder: OrderID?, reason: String, at now: Date, metadata: Data,
        on connection: PostgresConnection
    ) async throws {
        let body = TransactionUnmatched(transaction: transaction, userId: userId, claimedOrderId: claimedOrder, reason: reason)
        let data = try LedgerJSON.encoder.encode(body)
        let event = try NewEvent(
            id: Self.eventID("unmatched", transaction.transactionId.rawValue), type: TransactionEventType.unmatched.rawValue,
            data: data, metadata: metadata)
        let result = try await orders.store.append([event], to: transaction.transactionId.streamID, expectedVersion: .any, on: connection)
        guard !result.replayed else { return }
        try await orders.projection.enterPool(body, verification: data, at: now, on: connection)
    }

    /// Takes the transaction's lock, then answers the transaction's time, who holds the
    /// transaction, and the order the proof names by the strongest evidence: the order id it
    /// carries, then its appAccountToken; never an order of another user than the proof's. A
    /// named order comes locked, with the holder read after the lock, in one round trip
    /// (`lock_order_for_receipt`).
    private func lookUp(
        _ transaction: AppleTransaction, claim: Claim, on connection: PostgresConnection
    ) async throws -> (Date, Holder?, Order?, MatchedBy?, String) {
        let id = transaction.transactionId
        var reason = "no-order"
        let now: Date
        let holder: Holder?
        if let orderId = claim.orderId, let (time, order, held) = try await orders.projection.lockAndOrder(orderId, transaction: id, on: connection) {
            now = time
            holder = held.map { Holder(orderId: $0.0, status: $0.1) }
            if claim.userId == nil || claim.userId == order.userId { return (now, holder, order, .applicationUsername, "") }
            reason = "user-mismatch"
        } else {
            if claim.orderId != nil { reason = "unknown-order" }
            // (When the named order is unknown the function took the lock already; advisory
            // locks are re-entrant within a transaction, and this answers the time.)
            now = try await lockTransaction(id, on: connection)
            holder = try await holderOfTransaction(id, on: connection)
        }
        if let token = transaction.appAccountToken,
           let order = try await orders.projection.order(appAccountToken: token, on: connection, forUpdate: true),
           claim.userId == nil || claim.userId == order.userId {
            return (now, holder, order, .appAccountToken, "")
        }
        return (now, holder, nil, nil, reason)
    }

    /// Serialises every writer of one Apple transaction id (receipts, notifications, the
    /// reconciler) for the rest of the database transaction; answers the transaction's time.
    @discardableResult
    func lockTransaction(_ id: TransactionID, on connection: PostgresConnection) async throws -> Date {
        let rows = try await connection.guardedQuery(
            "SELECT now() FROM (SELECT pg_advisory_xact_lock(hashtextextended('apple-transaction:' || \(id.rawValue), 0))) AS locked",
            logger: logger)
        for try await now in rows.decode(Date.self) { return now }
        throw OrderLedgerError.duplicateTransaction(id)
    }

    struct Holder {
        let orderId: OrderID?
        let status: String
    }

    func holderOfTransaction(_ id: TransactionID, on connection: PostgresConnection) async throws -> Holder? {
        let rows = try await connection.guardedQuery(
            "SELECT order_id, status FROM apple_transactions WHERE transaction_id = \(id.rawValue)", logger: logger)
        for try await (order, status) in rows.decode((String?, String).self) {
            return Holder(orderId: order.map(OrderID.init(unchecked:)), status: status)
        }
        return nil
    }

    /// A UUID named by its parts (SHA-256, version 8): the same proof yields the same event ids,
    /// so a re-sent proof that races its first sending still appends once.
    static func eventID(_ parts: String...) -> EventID {
        var bytes = Array(SHA256.hash(data: Data(parts.joined(separator: "\u{1F}").utf8)).prefix(16))
        bytes[6] = (bytes[6] & 0x0F) | 0x80
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let uuid = UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                               bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
        return EventID(uuid)
    }
}

/// The answer to one proof, as `POST /v1/receipts` says it.
public enum ReceiptOutcome: String, Codable, Sendable {
    case matched, unmatched, duplicate, rejected
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
            id: Self.eventID("proof-rejected", rejection.receiptSha256, rejection.reason, rejection.orderId?.rawValue ?? ""),
            type: "proof-rejected", data: try LedgerJSON.encoder.encode(rejection), metadata: metadata)
        do {
            _ = try await orders.store.append([event], to: StreamID(unchecked: "proof-" + rejection.receiptSha256), expectedVersion: .any)
        } catch AppendError.eventIDConflict {
            // The same proof was refused for the same reason and order before, sent then with other
            // fields (a user id, a transaction id): the first record stands; this is a retry.
        }
    }

    /// The order holding each of `ids` (nil: in the pool); ids the ledger does not know are absent.
    public func holders(of ids: [TransactionID]) async throws -> [TransactionID: OrderID?] {
        let rows = try await database.query(
            "SELECT transaction_id, order_id FROM apple_transactions WHERE transaction_id = ANY(\(ids.map(\.rawValue)))")
        var holders: [TransactionID: OrderID?] = [:]
        for try await (id, order) in rows.decode((String, String?).self) {
            holders[TransactionID(unchecked: id)] = order.map(OrderID.init(unchecked:))
        }
        return holders
    }
}
