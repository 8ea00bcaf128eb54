import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging

/// History sweeps: for each Apple account the ledger knows (linked, or named by a transaction
/// it holds) whose user has an open order older than `recoverAfter`, the account's transaction
/// history from Apple (Get Transaction History v2), from where the last sweep stopped (Apple's
/// `revision`, kept per account in `apple_history_cursors`). Every transaction the ledger does
/// not know goes through the intake a client's proof goes through: tied to its order by its
/// `appAccountToken`, else into the pool with the account's user, for the reconciler.
///
/// A sweep ingests nothing twice: the intake refuses a known transaction in the database, and
/// an account another server is sweeping is skipped (that server holds the account's lease), not
/// waited for.
public struct HistorySweep: Sendable {
    let api: LazyAppStoreServerAPI
    let verifier: AppleProofVerifier
    let receipts: ReceiptLedger
    let pool: TransactionPool
    let cursors: HistoryCursors
    let leases: Leases
    let logger: Logger
    /// An open order this old makes its user's accounts due.
    public var recoverAfter: TimeInterval = 600
    /// How much earlier than the oldest open order a first sweep starts (the reconciler's skew).
    public var clockSkew: TimeInterval = 300
    /// Accounts swept at once (the request rate is shared by all of them).
    public var accountsAtOnce = 4
    /// Pages read of one account in one sweep; the rest waits for the next.
    public var maximumPages = 500

    public init(
        api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, receipts: ReceiptLedger, pool: TransactionPool,
        cursors: HistoryCursors, leases: Leases, logger: Logger
    ) {
        self.api = api
        self.verifier = verifier
        self.receipts = receipts
        self.pool = pool
        self.cursors = cursors
        self.leases = leases
        self.logger = logger
    }

    /// What a sweep did.
    public struct Summary: Codable, Sendable, Equatable {
        /// Accounts whose history was read.
        public var accounts = 0
        /// Accounts another server was sweeping at the time: left to it.
        public var busy = 0
        /// Accounts of an app without an App Store Server API key: left until it has one.
        public var skipped = 0
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
        /// Signed transactions that failed verification: logged, never ingested; the account's
        /// cursor stays before them.
        public var refused = 0
        /// Transactions Apple had refunded or revoked: never ingested by a sweep.
        public var revoked = 0
        /// Why accounts failed, by code: the App Store Server API's, verification's, `cancelled`,
        /// `internal-error`.
        public var failures: [String: Int] = [:]
        /// Set when a sweep stopped early: Apple refused the key or asked for a pause too long,
        /// verification cannot run (no root certificates), or the server is stopping.
        public var stoppedBy: String?
        public var seconds = 0.0
        public init() {}

        mutating func add(_ other: Summary) {
            accounts += other.accounts
            busy += other.busy
            skipped += other.skipped
            failed += other.failed
            pages += other.pages
            transactions += other.transactions
            known += other.known
            refused += other.refused
            revoked += other.revoked
            ingested.merge(other.ingested, uniquingKeysWith: +)
            failures.merge(other.failures, uniquingKeysWith: +)
            stoppedBy = stoppedBy ?? other.stoppedBy
        }
    }

    typealias Account = HistoryCursors.DueAccount

    /// Sweeps every due account, or only `user`'s, of every app or of `apps` alone; `progress`
    /// gets (accounts done, accounts due).
    public func run(
        user: UserID? = nil, apps: [BundleID]? = nil, metadata: Data = Data(#"{"appendedBy":"history-sweep"}"#.utf8),
        progress: (@Sendable (Int, Int) -> Void)? = nil
    ) async throws -> Summary {
        let started = ContinuousClock.now
        let accounts = try await cursors.dueAccounts(user: user, apps: apps, openFor: recoverAfter)
        var summary = Summary()
        var done = 0
        progress?(0, accounts.count)
        await withTaskGroup(of: (Summary, String).self) { group in
            var next = accounts.makeIterator()
            // Apps whose key Apple refused or that Apple asked to pause: their other accounts wait
            // for the next sweep; the other apps' go on.
            var stoppedApps = Set<String>()
            var stopped = false
            func startNext() -> Bool {
                while let account = next.next() {
                    if stoppedApps.contains(Self.appKey(account.bundleId)) { continue }
                    group.addTask { (await sweep(account, metadata: metadata), Self.appKey(account.bundleId)) }
                    return true
                }
                return false
            }
            for _ in 0..<max(1, accountsAtOnce) { guard startNext() else { break } }
            while let result = await group.next() {
                let (swept, app) = result
                summary.add(swept)
                done += 1
                progress?(done, accounts.count)
                if let code = swept.stoppedBy {
                    if Self.endsApp(code) { stoppedApps.insert(app) } else { stopped = true }
                }
                // Verification cannot run, or the server is stopping: no point starting another
                // account now.
                if !stopped, !Task.isCancelled { _ = startNext() }
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

    /// How long a sweep may hold an account before another server may take it over; each page
    /// read renews it.
    static let lease: TimeInterval = 600

    /// Sweeps one account under its lease (no database transaction stays open while Apple
    /// answers): reads its history from the cursor on, ingests what the ledger does not know, and
    /// moves the stored cursor page by page, never past a page with an entry it could not verify.
    /// A sweep that lost its lease stops (another server goes on). Every failure is the
    /// account's, counted, never the sweep's.
    func sweep(_ account: Account, metadata: Data) async -> Summary {
        var summary = Summary()
        do {
            // The account's app's key, at its environment's host; an app without a key is skipped.
            let client: AppStoreServerAPI
            do {
                client = try await api.client(for: account.bundleId, environment: AppleEnvironment(stored: account.environment))
            } catch let error as AppStoreServerAPIError where error.code == "apple-api-no-key" {
                summary.skipped = 1
                return summary
            }
            let swept: Void? = try await leases.withLease("history-sweep/" + account.id, for: Self.lease) { lease in
                let cursor = try await cursors.open(
                    account.id, user: account.user, startDate: account.oldestOpenOrder.addingTimeInterval(-clockSkew),
                    bundleId: account.bundleId, environment: account.environment)
                do {
                    do {
                        try await read(account, with: client, from: cursor, under: lease, metadata: metadata, into: &summary)
                    } catch let error as AppStoreServerAPIError where cursor.revision != nil && error.appleErrorCode == AppStoreServerAPIError.invalidRequestRevision {
                        // Apple no longer takes the stored revision: the account's history again
                        // from the cursor's start date (what was taken in before is known).
                        logger.warning("Apple refused an account's stored history revision; reading it again from its start date", metadata: [
                            "apple.account": "\(account.id)"])
                        try await cursors.forgetRevision(account.id)
                        try await read(account, with: client, from: .init(revision: nil, startDate: cursor.startDate), under: lease, metadata: metadata, into: &summary)
                    }
                } catch {
                    summary = failed(account, error, summary)
                }
            }
            if swept == nil {
                summary.busy = 1
                return summary
            }
        } catch {
            summary = failed(account, error, summary)
        }
        if summary.failed == 0 { summary.accounts = 1 }
        return summary
    }

    /// Reads the account's pages from `cursor` and takes their transactions in, renewing `lease`
    /// at each page.
    private func read(
        _ account: Account, with client: AppStoreServerAPI, from cursor: HistoryCursors.Cursor, under lease: Lease, metadata: Data,
        into summary: inout Summary
    ) async throws {
        var revision = cursor.revision
        // Once a page held an entry that did not verify, the stored cursor stays before it, so
        // that the next sweep reads it again (what this one took in is then known).
        var held = false
        // The positions asked in this read: one named again ends it.
        var seen = Set<String>()
        for _ in 0..<maximumPages {
            let asked = revision
            let page = try await client.transactionHistory(account.id, revision: asked, startDate: cursor.startDate)
            summary.pages += 1
            let (ingested, refused) = try await ingest(page.signedTransactions, of: account, metadata: metadata, into: &summary)
            held = held || refused
            revision = page.revision
            // Lost (expired and taken over): the holder now goes on from the stored cursor.
            guard try await leases.renew(lease, for: Self.lease) else {
                logger.warning("a history sweep lost its lease on an account; another server goes on", metadata: ["apple.account": "\(account.id)"])
                return
            }
            try await cursors.advance(account.id, to: page.revision, holdingBack: held, found: ingested)
            try AppStoreServerAPIError.requireMoved(page.revision, from: asked, hasMore: page.hasMore, reading: "transaction history", seen: &seen)
            if !page.hasMore { break }
        }
    }

    /// Verifies each signed transaction of a page and takes the ones the ledger does not know
    /// through the receipts' intake, at once (each in a transaction of its own); answers how
    /// many it took in, and whether an entry was refused. Verification that cannot run at all
    /// (no root certificates) fails the account instead.
    private func ingest(
        _ signed: [String], of account: Account, metadata: Data, into summary: inout Summary
    ) async throws -> (ingested: Int, refused: Bool) {
        var transactions: [AppleTransaction] = []
        var refused = false
        for jws in signed {
            summary.transactions += 1
            do {
                let (transaction, revocation) = try await verifier.transactionAndRevocation(signed: jws)
                if let revoked = revocation?.date {
                    // Never granted from here: a refund reaches the ledger by notification.
                    summary.revoked += 1
                    logger.info("a refunded or revoked transaction in Apple's history was not taken in", metadata: [
                        "apple.account": "\(account.id)", "apple.transaction": "\(transaction.transactionId)", "apple.revoked": "\(revoked)"])
                    continue
                }
                transactions.append(transaction)
            } catch {
                if error.isRetryable { throw error }
                refused = true
                summary.refused += 1
                logger.warning("a signed transaction in Apple's transaction history was refused", metadata: [
                    "apple.account": "\(account.id)", "user.id": "\(account.user)", "error": "\(error.code)",
                    "error.message": "\(error.message)"])
            }
        }
        let known = try await pool.holders(of: transactions.map(\.transactionId))
        let new = transactions.filter { known.index(forKey: $0.transactionId) == nil }
        summary.known += transactions.count - new.count
        // The purchase's own token decides its order (another user's, it may be); the account's
        // user is whom one no order takes is pooled for.
        let claim = ReceiptLedger.Claim(userId: nil, orderId: nil, poolUserId: account.user)
        // An order holding one on its backend's own claim, unverified, that what Apple signed
        // contradicts yields it: taken back, then taken in as a new one would be (counted so).
        let claimed = known.compactMap { $0.value == nil ? nil : $0.key }
        let unverified = claimed.isEmpty ? [] : try await pool.unverifiedClaims(of: claimed)
        var takenBack = 0
        for transaction in transactions where unverified.contains(transaction.transactionId) {
            do {
                guard let answer = try await receipts.takeBackClaim(of: transaction, claim: claim, metadata: metadata) else { continue }
                summary.known -= 1
                summary.ingested[answer.outcome.rawValue, default: 0] += 1
                takenBack += 1
            } catch let error as LedgerInputError {
                // As for a new one below: nothing of it is written (the claim stays), and the
                // cursor waits until the catalog is mended.
                logger.warning("a transaction in Apple's transaction history was refused", metadata: [
                    "apple.account": "\(account.id)", "apple.transaction": "\(transaction.transactionId)",
                    "error": "\(error.code)", "error.message": "\(error)"])
                summary.refused += 1
                refused = true
            }
        }
        // A subscription whose start an order holds but never started (an imported or
        // pre-subscription grant): started from it, with the renewals that waited; the new ones
        // taken in below find it (the intake starts it for those too).
        _ = try await receipts.startHeldSubscriptions(
            of: transactions.filter { known.index(forKey: $0.transactionId) != nil }, metadata: metadata)
        let outcomes = try await withThrowingTaskGroup(of: ReceiptOutcome?.self) { group in
            for transaction in new {
                group.addTask {
                    do {
                        return try await receipts.apply(transaction, claim: claim, metadata: metadata).outcome
                    } catch let error as LedgerInputError {
                        // A subscription's transaction the catalog or its group refuses (issue 40):
                        // nothing of it is recorded, and the cursor waits until the catalog is mended.
                        logger.warning("a transaction in Apple's transaction history was refused", metadata: [
                            "apple.account": "\(account.id)", "apple.transaction": "\(transaction.transactionId)",
                            "error": "\(error.code)", "error.message": "\(error)"])
                        return nil
                    }
                }
            }
            return try await group.reduce(into: [ReceiptOutcome?]()) { $0.append($1) }
        }
        let taken = outcomes.compactMap { $0 }
        for outcome in taken { summary.ingested[outcome.rawValue, default: 0] += 1 }
        summary.refused += outcomes.count - taken.count
        return (taken.count + takenBack, refused || taken.count < outcomes.count)
    }

    /// The account's failure, counted by code: Apple's, verification's, or `internal-error`.
    private func failed(_ account: Account, _ error: any Error, _ summary: Summary) -> Summary {
        var summary = summary
        let code = Self.failureCode(error)
        summary.failed = 1
        summary.failures[code, default: 0] += 1
        if Self.endsRun(code) { summary.stoppedBy = code }
        let level: Logger.Level = code == "internal-error" ? .error : .warning
        logger.log(level: level, "the history of an Apple account could not be read", metadata: [
            "apple.account": "\(account.id)", "user.id": "\(account.user)", "error": "\(code)", "error.message": "\(String(describing: error))"])
        return summary
    }
}

extension HistorySweep {
    /// Whether a failure with this code would fail every account after it too (the key refused,
    /// Apple's rate limit beyond what the client waits, no roots to verify with, cancelled): a
    /// run that reads account after account stops there instead of asking Apple again.
    static func endsRun(_ code: String) -> Bool {
        endsApp(code) || ["cancelled", "verification-unavailable"].contains(code)
    }

    /// Whether a failure with this code is its app's alone (its key refused or unreadable, its
    /// rate limit beyond what the client waits: Apple counts per app): that app's other accounts
    /// wait, the other apps' go on.
    static func endsApp(_ code: String) -> Bool {
        ["apple-api-unauthorized", "apple-api-rate-limited", "apple-api-key-invalid", "app-key-unavailable"].contains(code)
    }

    /// An account's app, as runs tell apps apart (nil: the first app).
    static func appKey(_ app: BundleID?) -> String { app?.rawValue.lowercased() ?? "" }

    /// Why work that asks Apple failed, as a stable code: the App Store Server API's,
    /// verification's, `cancelled`, or `internal-error`.
    static func failureCode(_ error: any Error) -> String {
        switch error {
        case let error as AppStoreServerAPIError: error.code
        case let error as AppleVerificationError: error.code
        case is CancellationError: "cancelled"
        default: "internal-error"
        }
    }
}
