import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerStore
import Logging
import PostgresNIO

/// History sweeps: for each Apple account the ledger knows (linked, or named by a transaction
/// it holds) whose user has an open order older than `recoverAfter`, the account's transaction
/// history from Apple (Get Transaction History v2), from where the last sweep stopped (Apple's
/// `revision`, kept per account in `apple_history_cursors`). Every transaction the ledger does
/// not know goes through the intake a client's proof goes through: tied to its order by its
/// `appAccountToken`, else into the pool with the account's user, for the reconciler.
///
/// A sweep ingests nothing twice: the intake refuses a known transaction in the database, and
/// an account being swept by another server is skipped (its cursor row is locked), not waited for.
public struct HistorySweep: Sendable {
    let api: LazyAppStoreServerAPI
    let verifier: AppleProofVerifier
    let receipts: ReceiptLedger
    /// An open order this old makes its user's accounts due.
    public var recoverAfter: TimeInterval = 600
    /// How much earlier than the oldest open order a first sweep starts (the reconciler's skew).
    public var clockSkew: TimeInterval = 300
    /// Accounts swept at once (the request rate is shared by all of them).
    public var accountsAtOnce = 4
    /// Pages read of one account in one sweep; the rest waits for the next.
    public var maximumPages = 500
    var database: Database { receipts.orders.database }
    var logger: Logger { database.logger }

    public init(api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, receipts: ReceiptLedger) {
        self.api = api
        self.verifier = verifier
        self.receipts = receipts
    }

    /// What a sweep did.
    public struct Summary: Codable, Sendable, Equatable {
        /// Accounts whose history was read.
        public var accounts = 0
        /// Accounts another server was sweeping at the time: left to it.
        public var busy = 0
        /// Accounts whose history could not be read (Apple refused or failed); their cursor
        /// stays where the last page read left it.
        public var failed = 0
        public var pages = 0
        /// Signed transactions in the pages.
        public var transactions = 0
        /// Of those, transactions the ledger knew already.
        public var known = 0
        /// Ingested: tied to their order (`matched`), into the pool (`unmatched`), a second
        /// claim on a granted transaction (`duplicate`), refunded before any order (`rejected`).
        public var ingested: [String: Int] = [:]
        /// Signed transactions that failed verification: logged, never ingested.
        public var refused = 0
        /// Why accounts failed, by the App Store Server API's error code.
        public var failures: [String: Int] = [:]
        /// Set when a sweep stopped early: Apple refused the key, or asked for a pause too long.
        public var stoppedBy: String?
        public var seconds = 0.0
        public init() {}

        mutating func add(_ other: Summary) {
            accounts += other.accounts
            busy += other.busy
            failed += other.failed
            pages += other.pages
            transactions += other.transactions
            known += other.known
            refused += other.refused
            ingested.merge(other.ingested, uniquingKeysWith: +)
            failures.merge(other.failures, uniquingKeysWith: +)
            stoppedBy = stoppedBy ?? other.stoppedBy
        }
    }

    /// One account due a sweep.
    struct Account: Sendable {
        /// The id history is asked by: the appTransactionId, else a transaction id of the account.
        let id: String
        let user: UserID
        /// The user's oldest open order.
        let oldestOpenOrder: Date
    }

    /// Sweeps every due account, or only `user`'s; `progress` gets (accounts done, accounts due).
    public func run(
        user: UserID? = nil, metadata: Data = Data(#"{"appendedBy":"history-sweep"}"#.utf8),
        progress: (@Sendable (Int, Int) -> Void)? = nil
    ) async throws -> Summary {
        let started = ContinuousClock.now
        let accounts = try await dueAccounts(user: user)
        var summary = Summary()
        var done = 0
        progress?(0, accounts.count)
        try await withThrowingTaskGroup(of: Summary.self) { group in
            var next = accounts.makeIterator()
            func startNext() -> Bool {
                guard let account = next.next() else { return false }
                group.addTask { try await sweep(account, metadata: metadata) }
                return true
            }
            for _ in 0..<max(1, accountsAtOnce) { guard startNext() else { break } }
            while let swept = try await group.next() {
                summary.add(swept)
                done += 1
                progress?(done, accounts.count)
                // Apple refused the key or asked for a long pause: no point asking again now.
                if summary.stoppedBy == nil { _ = startNext() }
            }
        }
        summary.seconds = (ContinuousClock.now - started).inSeconds
        if summary.accounts > 0 || summary.failed > 0 {
            logger.info("history sweep", metadata: [
                "sweep.accounts": "\(summary.accounts)", "sweep.transactions": "\(summary.transactions)",
                "sweep.ingested": "\(summary.ingested.values.reduce(0, +))", "sweep.refused": "\(summary.refused)",
                "sweep.failed": "\(summary.failed)",
            ])
        }
        return summary
    }

    /// The accounts of users with an open order older than `recoverAfter`: those they linked,
    /// those named by their transactions, and for a user with neither but with a transaction of
    /// an unknown account, that transaction's id.
    func dueAccounts(user: UserID?) async throws -> [Account] {
        let rows = try await database.query(
            """
            WITH due AS (
                SELECT user_id, min(created_at) AS oldest FROM orders
                 WHERE state IN ('created', 'payment-added') AND created_at <= now() - make_interval(secs => \(recoverAfter))
                   AND (\(user?.rawValue)::text IS NULL OR user_id = \(user?.rawValue)::text)
                 GROUP BY user_id),
            accounts AS (
                SELECT substr(e.stream_id, length('apple-account-') + 1) AS account_id, d.user_id, d.oldest, 0 AS strength
                  FROM due d JOIN events e ON e.type = 'account-linked' AND e.data->>'userId' = d.user_id
                UNION ALL
                SELECT t.app_transaction_id, d.user_id, d.oldest, 1
                  FROM due d JOIN orders o ON o.user_id = d.user_id JOIN apple_transactions t ON t.order_id = o.order_id
                 WHERE t.app_transaction_id IS NOT NULL
                UNION ALL
                SELECT t.app_transaction_id, d.user_id, d.oldest, 1
                  FROM due d JOIN apple_transactions t ON t.user_id = d.user_id AND t.order_id IS NULL
                 WHERE t.app_transaction_id IS NOT NULL),
            fallback AS (
                SELECT DISTINCT ON (d.user_id) t.transaction_id AS account_id, d.user_id, d.oldest, 2 AS strength
                  FROM due d JOIN orders o ON o.user_id = d.user_id JOIN apple_transactions t ON t.order_id = o.order_id
                 WHERE NOT EXISTS (SELECT FROM accounts a WHERE a.user_id = d.user_id)
                 ORDER BY d.user_id, t.purchase_date)
            SELECT DISTINCT ON (account_id) account_id, user_id, oldest
              FROM (SELECT * FROM accounts UNION ALL SELECT * FROM fallback) a
             ORDER BY account_id, strength, oldest
            """)
        var accounts: [Account] = []
        for try await (id, user, oldest) in rows.decode((String, String, Date).self) {
            accounts.append(Account(id: id, user: UserID(unchecked: user), oldestOpenOrder: oldest))
        }
        return accounts
    }

    /// Sweeps one account while holding its cursor row: reads its history from the cursor on,
    /// ingests what the ledger does not know, and moves the cursor page by page.
    func sweep(_ account: Account, metadata: Data) async throws -> Summary {
        try await database.transaction { connection in
            var summary = Summary()
            try await connection.guardedQuery(
                """
                INSERT INTO apple_history_cursors (account_id, user_id) VALUES (\(account.id), \(account.user.rawValue))
                ON CONFLICT (account_id) DO NOTHING
                """, logger: logger)
            var claimed = false
            var revision: String?
            let rows = try await connection.guardedQuery(
                "SELECT revision FROM apple_history_cursors WHERE account_id = \(account.id) FOR UPDATE SKIP LOCKED", logger: logger)
            for try await stored in rows.decode(String?.self) { (claimed, revision) = (true, stored) }
            guard claimed else {
                summary.busy = 1
                return summary
            }
            let client: AppStoreServerAPI
            do { client = try await api.client() } catch let error as AppStoreServerAPIError { return failed(account, error, summary) }
            var found = 0
            for _ in 0..<maximumPages {
                let page: AppStoreServerAPI.HistoryPage
                do {
                    page = try await client.transactionHistory(
                        account.id, revision: revision,
                        startDate: revision == nil ? account.oldestOpenOrder.addingTimeInterval(-clockSkew) : nil)
                } catch let error as AppStoreServerAPIError {
                    summary = failed(account, error, summary)
                    break
                }
                summary.pages += 1
                let ingested = try await ingest(page.signedTransactions, of: account, metadata: metadata, into: &summary)
                found += ingested
                revision = page.revision
                try await connection.guardedQuery(
                    """
                    UPDATE apple_history_cursors SET revision = \(page.revision), swept_at = now(), found = found + \(ingested)
                     WHERE account_id = \(account.id)
                    """, logger: logger)
                if !page.hasMore { break }
            }
            if summary.failed == 0 { summary.accounts = 1 }
            return summary
        }
    }

    /// Verifies each signed transaction of a page and takes the ones the ledger does not know
    /// through the receipts' intake; answers how many it ingested.
    private func ingest(_ signed: [String], of account: Account, metadata: Data, into summary: inout Summary) async throws -> Int {
        var transactions: [AppleTransaction] = []
        for jws in signed {
            summary.transactions += 1
            do {
                transactions.append(try await verifier.transaction(signed: jws))
            } catch {
                summary.refused += 1
                logger.warning("a signed transaction in Apple's transaction history was refused", metadata: [
                    "apple.account": "\(account.id)", "user.id": "\(account.user)", "error": "\(error.code)",
                    "error.message": "\(error.message)"])
            }
        }
        let known = try await receipts.holders(of: transactions.map(\.transactionId))
        let new = transactions.filter { known.index(forKey: $0.transactionId) == nil }
        summary.known += transactions.count - new.count
        // Different transactions: taken in at once (each in a transaction of its own).
        let outcomes = try await withThrowingTaskGroup(of: ReceiptOutcome.self) { group in
            for transaction in new {
                group.addTask { try await receipts.apply(transaction, claim: .init(userId: account.user, orderId: nil), metadata: metadata).outcome }
            }
            return try await group.reduce(into: [ReceiptOutcome]()) { $0.append($1) }
        }
        for outcome in outcomes { summary.ingested[outcome.rawValue, default: 0] += 1 }
        let ingested = outcomes.count
        return ingested
    }

    private func failed(_ account: Account, _ error: AppStoreServerAPIError, _ summary: Summary) -> Summary {
        var summary = summary
        summary.failed = 1
        summary.failures[error.code, default: 0] += 1
        if ["apple-api-unauthorized", "apple-api-rate-limited", "apple-api-key-invalid"].contains(error.code) { summary.stoppedBy = error.code }
        logger.warning("the history of an Apple account could not be read", metadata: [
            "apple.account": "\(account.id)", "user.id": "\(account.user)", "error": "\(error.code)", "error.message": "\(error.description)"])
        return summary
    }
}
