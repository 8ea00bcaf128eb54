import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging
import PostgresNIO

/// The refund catch-up: for the Apple accounts with transactions granted in the last
/// `lookbackDays`, Apple's refund history (Get Refund History v2, from the `revision` kept per
/// account in `apple_refund_cursors`); a refund the ledger has not recorded is applied as a
/// `REFUND` notification would be (the order refunded, or the pooled transaction kept from being
/// granted), with an event id named by the transaction, so it is applied once however often it is
/// read. Each account is read at most once per `recheckAfter`, under a lease on its cursor row.
public struct RefundCatchUp: Sendable {
    let api: LazyAppStoreServerAPI
    let verifier: AppleProofVerifier
    let notifications: NotificationLedger
    public var lookbackDays = 90
    public var recheckAfter: TimeInterval = 86_400
    public var maximumPages = 100
    var database: Database { notifications.receipts.orders.database }
    var logger: Logger { database.logger }

    public init(api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, notifications: NotificationLedger) {
        self.api = api
        self.verifier = verifier
        self.notifications = notifications
    }

    /// What a catch-up did.
    public struct Summary: Codable, Sendable, Equatable {
        public var accounts = 0
        /// Accounts another server was reading: left to it.
        public var busy = 0
        /// Accounts whose history could not be read; their cursor stays where it was.
        public var failed = 0
        public var pages = 0
        public var transactions = 0
        /// Refunds the ledger had not recorded, applied now.
        public var applied = 0
        /// Refunds the ledger had recorded already.
        public var known = 0
        /// Signed transactions that failed verification: logged, not applied.
        public var refused = 0
        public var failures: [String: Int] = [:]
        public init() {}
    }

    /// Reads the due accounts' refund histories (`all`: every account in the look-back, however
    /// recently read); `progress` gets (accounts done, accounts due).
    public func run(
        all: Bool = false, metadata: Data = Data(#"{"appendedBy":"refund-catch-up"}"#.utf8),
        progress: (@Sendable (Int, Int) -> Void)? = nil
    ) async throws -> Summary {
        let accounts = try await dueAccounts(all: all)
        // Marked, so that the report counts the refunds this caught up.
        var marked = (try? JSONSerialization.jsonObject(with: metadata)) as? [String: Any] ?? [:]
        marked["refundCatchUp"] = true
        let metadata = (try? JSONSerialization.data(withJSONObject: marked)) ?? metadata
        var summary = Summary()
        progress?(0, accounts.count)
        for (done, account) in accounts.enumerated() {
            try Task.checkCancellation()
            await catchUp(account, metadata: metadata, into: &summary)
            progress?(done + 1, accounts.count)
            if summary.failures.keys.contains(where: HistorySweep.endsRun) { break }
        }
        if summary.applied > 0 || summary.failed > 0 {
            logger.info("refund catch-up", metadata: [
                "refunds.accounts": "\(summary.accounts)", "refunds.applied": "\(summary.applied)", "refunds.failed": "\(summary.failed)"])
        }
        return summary
    }

    /// An account: its key (appTransactionId, else original transaction id) and a transaction id
    /// of it to ask Apple by.
    struct Account: Sendable {
        let key: String
        let transactionId: String
    }

    func dueAccounts(all: Bool) async throws -> [Account] {
        let rows = try await database.query(
            """
            SELECT a.account_id, a.transaction_id FROM (
                SELECT DISTINCT ON (account_id) account_id, transaction_id FROM (
                    SELECT coalesce(t.app_transaction_id, t.original_transaction_id, t.transaction_id) AS account_id,
                           t.transaction_id, t.purchase_date
                      FROM apple_transactions t JOIN orders o ON o.order_id = t.order_id
                     WHERE o.state IN ('verified', 'delivered', 'finished')
                       AND t.purchase_date >= now() - make_interval(days => \(lookbackDays)::int)) granted
                 ORDER BY account_id, purchase_date DESC) a
              LEFT JOIN apple_refund_cursors c ON c.account_id = a.account_id
             WHERE \(all) OR c.checked_at IS NULL OR c.checked_at < now() - make_interval(secs => \(recheckAfter))
             ORDER BY a.account_id
            """)
        var accounts: [Account] = []
        for try await (key, transaction) in rows.decode((String, String).self) { accounts.append(Account(key: key, transactionId: transaction)) }
        return accounts
    }

    static let lease: TimeInterval = 600

    private func catchUp(_ account: Account, metadata: Data, into summary: inout Summary) async {
        do {
            _ = try await database.query("INSERT INTO apple_refund_cursors (account_id) VALUES (\(account.key)) ON CONFLICT (account_id) DO NOTHING")
            let rows = try await database.query(
                """
                UPDATE apple_refund_cursors SET claimed_until = now() + make_interval(secs => \(Self.lease))
                 WHERE account_id = \(account.key) AND (claimed_until IS NULL OR claimed_until < now())
                RETURNING revision
                """)
            var claimed: String??
            for try await revision in rows.decode(String?.self) { claimed = .some(revision) }
            guard let revision = claimed else {
                summary.busy += 1
                return
            }
            let release: PostgresQuery = "UPDATE apple_refund_cursors SET claimed_until = NULL WHERE account_id = \(account.key)"
            do {
                try await read(account, from: revision, metadata: metadata, into: &summary)
            } catch {
                _ = try? await database.query(release)
                throw error
            }
            _ = try await database.query(release)
            summary.accounts += 1
        } catch {
            let code = HistorySweep.failureCode(error)
            summary.failed += 1
            summary.failures[code, default: 0] += 1
            logger.log(level: code == "internal-error" ? .error : .warning, "the refund history of an Apple account could not be read", metadata: [
                "apple.account": "\(account.key)", "error": "\(code)", "error.message": "\(String(describing: error))"])
        }
    }

    private func read(_ account: Account, from start: String?, metadata: Data, into summary: inout Summary) async throws {
        let client = try await api.client()
        var revision = start
        for _ in 0..<maximumPages {
            let page = try await client.refundHistory(account.transactionId, revision: revision)
            summary.pages += 1
            var held = false
            var refunds: [(transaction: AppleTransaction, revoked: Date, reason: Int?)] = []
            for jws in page.signedTransactions {
                summary.transactions += 1
                do {
                    let (transaction, revoked, reason) = try await verifier.transactionAndRevocation(signed: jws)
                    if let revoked { refunds.append((transaction, revoked, reason)) } else { summary.known += 1 }
                } catch {
                    if error.isRetryable { throw error }
                    held = true
                    summary.refused += 1
                    logger.warning("a signed transaction in Apple's refund history was refused", metadata: [
                        "apple.account": "\(account.key)", "error": "\(error.code)", "error.message": "\(error.message)"])
                }
            }
            let recorded = try await refundsRecorded(refunds.map(\.transaction.transactionId))
            for (transaction, revoked, reason) in refunds {
                guard !recorded.contains(transaction.transactionId) else {
                    summary.known += 1
                    continue
                }
                let record = NotificationReceived(
                    notificationUUID: EventID.named("refund-history", transaction.transactionId.rawValue).uuid, notificationType: "REFUND",
                    subtype: nil, transactionId: transaction.transactionId, signedDate: revoked)
                let result = try await notifications.apply(
                    .init(record: record, transaction: transaction, revocationDate: revoked, revocationReason: reason), metadata: metadata)
                if result.appended {
                    summary.applied += 1
                } else {
                    summary.known += 1
                }
            }
            // A page with an entry that did not verify is read again next time.
            _ = try await database.query(
                """
                UPDATE apple_refund_cursors
                   SET revision = CASE WHEN \(held) THEN revision ELSE \(page.revision) END, checked_at = now(),
                       claimed_until = now() + make_interval(secs => \(Self.lease))
                 WHERE account_id = \(account.key)
                """)
            revision = held ? revision : page.revision
            if !page.hasMore || held { return }
        }
    }

    /// Which of `transactions` the ledger already has refunded: by their order's state, or their
    /// pool row's.
    private func refundsRecorded(_ transactions: [TransactionID]) async throws -> Set<TransactionID> {
        guard !transactions.isEmpty else { return [] }
        let rows = try await database.query(
            """
            SELECT t.transaction_id
              FROM apple_transactions t LEFT JOIN orders o ON o.order_id = t.order_id
             WHERE t.transaction_id = ANY(\(transactions.map(\.rawValue))) AND (o.state = 'refunded' OR t.status = 'refunded')
            """)
        var recorded: Set<TransactionID> = []
        for try await id in rows.decode(String.self) { recorded.insert(TransactionID(unchecked: id)) }
        return recorded
    }
}
