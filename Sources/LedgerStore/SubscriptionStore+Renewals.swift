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
