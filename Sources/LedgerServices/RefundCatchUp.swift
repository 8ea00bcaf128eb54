import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging

/// The refund catch-up: for the Apple accounts with transactions granted in the last
/// `lookbackDays`, Apple's refund history (Get Refund History v2, from the `revision` kept per
/// account in `apple_refund_cursors`); a refund the ledger has not recorded is applied as a
/// `REFUND` notification would be (the order refunded, or the pooled transaction kept from being
/// granted), with an event id named by the transaction, so it is applied once however often it is
/// read. Each account is read at most once per `recheckAfter`, under the account's lease.
public struct RefundCatchUp: Sendable {
    let api: LazyAppStoreServerAPI
    let verifier: AppleProofVerifier
    let notifications: NotificationLedger
    let pool: TransactionPool
    let cursors: RefundCursors
    let leases: Leases
    let logger: Logger
    public var lookbackDays = 90
    public var recheckAfter: TimeInterval = 86_400
    public var maximumPages = 100

    public init(
        api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, notifications: NotificationLedger, pool: TransactionPool,
        cursors: RefundCursors, leases: Leases, logger: Logger
    ) {
        self.api = api
        self.verifier = verifier
        self.notifications = notifications
        self.pool = pool
        self.cursors = cursors
        self.leases = leases
        self.logger = logger
    }

    /// What a catch-up did.
    public struct Summary: Codable, Sendable, Equatable {
        public var accounts = 0
        /// Accounts another server was reading: left to it.
        public var busy = 0
        /// Accounts of an app without an App Store Server API key: left until it has one.
        public var skipped = 0
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
        /// Accounts asked by a backend's unverified claim of a transaction Apple does not know
        /// (404, 4040010): nothing to read; logged, and asked again after `recheckAfter`.
        public var unknownClaims = 0
        public var failures: [String: Int] = [:]
        public init() {}
    }

    /// Reads the due accounts' refund histories (`all`: every account in the look-back, however
    /// recently read); `progress` gets (accounts done, accounts due).
    public func run(
        all: Bool = false, metadata: Data = Data(#"{"appendedBy":"refund-catch-up"}"#.utf8),
        progress: (@Sendable (Int, Int) -> Void)? = nil
    ) async throws -> Summary {
        let accounts = try await cursors.dueAccounts(lookbackDays: lookbackDays, recheckAfter: recheckAfter, all: all)
        // Marked, so that the report counts the refunds this caught up.
        let metadata = NotificationLedger.markedCaughtUp(metadata)
        var summary = Summary()
        progress?(0, accounts.count)
        // Apps whose key Apple refused or that Apple asked to pause: their other accounts wait
        // for the next run; the other apps' go on.
        var stoppedApps = Set<String>()
        for (done, account) in accounts.enumerated() {
            try Task.checkCancellation()
            let app = HistorySweep.appKey(account.bundleId)
            if stoppedApps.contains(app) { continue }
            let before = summary.failures
            await catchUp(account, metadata: metadata, into: &summary)
            progress?(done + 1, accounts.count)
            let failedNow = summary.failures.filter { before[$0.key] != $0.value }.keys
            if failedNow.contains(where: { HistorySweep.endsRun($0) && !HistorySweep.endsApp($0) }) { break }
            if failedNow.contains(where: HistorySweep.endsApp) { stoppedApps.insert(app) }
        }
        if summary.applied > 0 || summary.failed > 0 {
            logger.info("refund catch-up", metadata: [
                "refunds.accounts": "\(summary.accounts)", "refunds.applied": "\(summary.applied)", "refunds.failed": "\(summary.failed)"])
        }
        return summary
    }

    typealias Account = RefundCursors.DueAccount

    static let lease: TimeInterval = 600

    /// Apple's `TransactionIdNotFoundError`.
    static let transactionIdNotFound = 4040010

    private func catchUp(_ account: Account, metadata: Data, into summary: inout Summary) async {
        do {
            // The account's app's key, at its environment's host; an app without a key is skipped.
            let client: AppStoreServerAPI
            do {
                client = try await api.client(for: account.bundleId, environment: AppleEnvironment(stored: account.environment))
            } catch let error as AppStoreServerAPIError where error.code == "apple-api-no-key" {
                summary.skipped += 1
                return
            }
            let read: Void? = try await leases.withLease("refund-catch-up/" + account.key, for: Self.lease) { lease in
                let start = try await cursors.revision(of: account.key, bundleId: account.bundleId, environment: account.environment)
                do {
                    do {
                        try await self.read(account, with: client, from: start, under: lease, metadata: metadata, into: &summary)
                    } catch let error as AppStoreServerAPIError where start != nil && error.appleErrorCode == AppStoreServerAPIError.invalidRequestRevision {
                        // Apple no longer takes the stored revision: the account's history again
                        // from its start (a refund recorded before is known, and applied once).
                        logger.warning("Apple refused an account's stored refund-history revision; reading it again from the start", metadata: [
                            "apple.account": "\(account.key)"])
                        try await cursors.forgetRevision(account.key)
                        try await self.read(account, with: client, from: nil, under: lease, metadata: metadata, into: &summary)
                    }
                } catch let error as AppStoreServerAPIError where account.claimed && error.appleErrorCode == Self.transactionIdNotFound {
                    // A backend claimed a transaction Apple does not know (a mistyped id, another
                    // environment's, or made up): no refund of it to find. Not a failure of the
                    // read, which would ask again at every run; the claim stays unverified.
                    try await cursors.checked(account.key)
                    summary.unknownClaims += 1
                    logger.warning("Apple does not know the transaction a backend claimed for an order; its account's refund history was not read", metadata: [
                        "apple.account": "\(account.key)", "apple.transaction": "\(account.transactionId)",
                        "apple.environment": "\(account.environment ?? AppleEnvironment.production.rawValue)"])
                }
            }
            guard read != nil else {
                summary.busy += 1
                return
            }
            summary.accounts += 1
        } catch {
            let code = HistorySweep.failureCode(error)
            summary.failed += 1
            summary.failures[code, default: 0] += 1
            logger.log(level: code == "internal-error" ? .error : .warning, "the refund history of an Apple account could not be read", metadata: [
                "apple.account": "\(account.key)", "error": "\(code)", "error.message": "\(String(describing: error))"])
        }
    }

    /// Reads the account's pages from `start`, applies the refunds the ledger has not recorded,
    /// and renews `lease` at each page; stops when it lost the lease. A page with an entry that
    /// did not verify keeps the cursor before it (the next read starts there again), but the
    /// pages after it are read and applied all the same: one entry that never verifies must not
    /// hide every later refund of the account.
    private func read(
        _ account: Account, with client: AppStoreServerAPI, from start: String?, under lease: Lease, metadata: Data, into summary: inout Summary
    ) async throws {
        var revision = start
        // Since a page held an entry back, the cursor stays where it was.
        var holding = false
        // The positions asked in this read: one named again ends it.
        var seen = Set<String>()
        for _ in 0..<maximumPages {
            let page = try await client.refundHistory(account.transactionId, revision: revision)
            summary.pages += 1
            var held = false
            var refunds: [(transaction: AppleTransaction, revocation: Revocation)] = []
            for jws in page.signedTransactions {
                summary.transactions += 1
                do {
                    let (transaction, revocation) = try await verifier.transactionAndRevocation(signed: jws)
                    if let revocation { refunds.append((transaction, revocation)) } else { summary.known += 1 }
                } catch {
                    if error.isRetryable { throw error }
                    held = true
                    summary.refused += 1
                    logger.warning("a signed transaction in Apple's refund history was refused", metadata: [
                        "apple.account": "\(account.key)", "error": "\(error.code)", "error.message": "\(error.message)"])
                }
            }
            let recorded = try await pool.refundsRecorded(refunds.map(\.transaction.transactionId))
            for (transaction, revocation) in refunds {
                guard !recorded.contains(transaction.transactionId) else {
                    summary.known += 1
                    continue
                }
                let result = try await notifications.apply(NotificationLedger.refundRead(transaction, revocation), metadata: metadata)
                // A refund Apple reversed since is recorded as such and took nothing back: known.
                if result.appended, try await pool.refundsRecorded([transaction.transactionId]).contains(transaction.transactionId) {
                    summary.applied += 1
                } else {
                    summary.known += 1
                }
            }
            guard try await leases.renew(lease, for: Self.lease) else {
                logger.warning("a refund catch-up lost its lease on an account; another server goes on", metadata: ["apple.account": "\(account.key)"])
                return
            }
            holding = holding || held
            try await cursors.advance(account.key, to: page.revision, holdingBack: holding)
            try AppStoreServerAPIError.requireMoved(page.revision, from: revision, hasMore: page.hasMore, reading: "refund history", seen: &seen)
            revision = page.revision
            if !page.hasMore { return }
        }
    }
}
