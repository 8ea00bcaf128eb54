import Foundation
import LedgerCore
import LedgerJSON
import Logging
import PostgresNIO

extension SubscriptionStore {
    /// The later transactions of subscription `id` the ledger holds as renewals (status `renewal`,
    /// never an order's), as they entered (`transaction-unmatched`), in purchase order: those that waited for the
    /// subscription's start are tied to it when it arrives (issue 40). Read in the caller's
    /// transaction, which holds the subscription's lock.
    public func renewals(of id: String, in transaction: DatabaseTransaction) async throws -> [TransactionUnmatched] {
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT verification::text FROM apple_transactions
             WHERE original_transaction_id = \(id) AND status = 'renewal' AND order_id IS NULL AND verification IS NOT NULL
             ORDER BY purchase_date, transaction_id
            """, logger: database.logger)
        var renewals: [TransactionUnmatched] = []
        for try await text in rows.decode(String.self) {
            renewals.append(try StoredBodyDecoder.decode(TransactionUnmatched.self, from: text))
        }
        return renewals
    }
}

extension SubscriptionStore {
    /// Of `transactions`, those an order holds that is refunded now (a backend's own claim of a
    /// renewal, which Apple's refund refunded before the ledger knew its subscription), each with
    /// that order's latest `refunded`: its event's id and body. Read in the caller's transaction.
    public func refundsOfHoldingOrders(
        _ transactions: [TransactionID], in transaction: DatabaseTransaction
    ) async throws -> [TransactionID: (EventID, Refunded)] {
        guard !transactions.isEmpty else { return [:] }
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT t.transaction_id, e.event_id, e.data::text
              FROM apple_transactions t JOIN orders o ON o.order_id = t.order_id
              JOIN LATERAL (SELECT r.event_id, r.data FROM events r WHERE r.stream_id = 'order-' || o.order_id AND r.type = 'refunded'
                             ORDER BY r.stream_version DESC LIMIT 1) e ON true
             WHERE t.transaction_id = ANY(\(transactions.map(\.rawValue))::text[]) AND o.state = 'refunded'
            """, logger: database.logger)
        var refunds: [TransactionID: (EventID, Refunded)] = [:]
        for try await (id, eventID, text) in rows.decode((String, UUID, String).self) {
            refunds[TransactionID(unchecked: id)] = (EventID(eventID), try StoredBodyDecoder.decode(Refunded.self, from: text))
        }
        return refunds
    }
}

extension SubscriptionStore {
    /// The refunds, revocations and reversals recorded on the streams of `transactions` while no
    /// order or subscription held them (`notification-received` of `REFUND`, `REVOKE`,
    /// `REFUND_REVERSED`), and the lifecycle notifications kept with their renewal info, each
    /// transaction's in the log's order: what the renewals that waited for their subscription's
    /// start were told. Read in the caller's transaction.
    public func refundNotifications(
        of transactions: [TransactionID], in transaction: DatabaseTransaction
    ) async throws -> [TransactionID: [NotificationReceived]] {
        guard !transactions.isEmpty else { return [:] }
        let streams = Dictionary(transactions.map { ($0.streamID.rawValue, $0) }, uniquingKeysWith: { first, _ in first })
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT stream_id, data::text FROM events
             WHERE stream_id = ANY(\(Array(streams.keys))::text[]) AND type = 'notification-received'
               AND (data ->> 'notificationType' IN ('REFUND', 'REVOKE', 'REFUND_REVERSED') OR data ? 'periodEnd' OR data ? 'renewalInfo')
             ORDER BY stream_id, stream_version
            """, logger: database.logger)
        var told: [TransactionID: [NotificationReceived]] = [:]
        for try await (stream, text) in rows.decode((String, String).self) {
            guard let id = streams[stream] else { continue }
            told[id, default: []].append(try StoredBodyDecoder.decode(NotificationReceived.self, from: text))
        }
        return told
    }
}

extension SubscriptionStore {
    /// What order `order` recorded of the transaction that started subscription `id` (its latest
    /// `receipt-received` naming it): for a start the order holds that never went through the
    /// intake as one (an imported history, a backend's own `receipt-received`, a grant from before
    /// subscriptions), so the subscription can be started from it. Read in the caller's transaction.
    public func startReceipt(_ id: String, order: OrderID, in transaction: DatabaseTransaction) async throws -> ReceiptReceived? {
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT data::text FROM events
             WHERE stream_id = \(order.streamID.rawValue) AND type = 'receipt-received' AND data ->> 'transactionId' = \(id)
             ORDER BY stream_version DESC LIMIT 1
            """, logger: database.logger)
        for try await text in rows.decode(String.self) {
            return try StoredBodyDecoder.decode(ReceiptReceived.self, from: text)
        }
        return nil
    }
}
