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
