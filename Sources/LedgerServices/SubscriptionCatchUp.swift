import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging

/// The catch-up of one auto-renewable subscription from Apple (`GET
/// /v1/subscriptions/{originalTransactionId}?refresh=true`): what the ledger missed of it (a
/// notification lost, a renewal no client uploaded) is asked of Apple and recorded once. Its
/// transactions come from Apple's transaction history of its `originalTransactionId` and go
/// through `ReceiptLedger.apply`, as a client's proof does (so a known one is skipped, and each
/// period is recorded once), once a start an order holds has started the subscription
/// (`ReceiptLedger.startHeldSubscriptions`); Apple's status of it and its renewal info (Get All Subscription
/// Statuses) become one `subscription-renewal-changed` (no notification) when they change what
/// the ledger holds, with an event id named by the subscription and the renewal info's
/// `signedDate`, under the subscription's lock. No database transaction stays open while Apple
/// answers.
public struct SubscriptionCatchUp: Sendable {
    let api: LazyAppStoreServerAPI
    let verifier: AppleProofVerifier
    let database: Database
    let receipts: ReceiptLedger
    let pool: TransactionPool
    let subscriptions: SubscriptionLedger
    /// Where a refund Apple reversed, whose `REFUND_REVERSED` the ledger missed, is applied.
    let notifications: NotificationLedger
    let logger: Logger
    /// Pages of the customer's history read at most (Apple's pages hold 20 transactions).
    public var maximumPages = 100

    public init(
        api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, database: Database, receipts: ReceiptLedger, pool: TransactionPool,
        subscriptions: SubscriptionLedger, notifications: NotificationLedger, logger: Logger
    ) {
        self.api = api
        self.verifier = verifier
        self.database = database
        self.receipts = receipts
        self.pool = pool
        self.subscriptions = subscriptions
        self.notifications = notifications
        self.logger = logger
    }

    /// What a refresh did.
    public struct Summary: Codable, Sendable, Equatable {
        /// What became of Apple's status: `recorded`, `unchanged` (the ledger held it already),
        /// `subscription-unknown` (no purchase started the subscription in the ledger, so there is
        /// nothing to record it on), `no-status` (Apple's answer holds none for it).
        public enum Status: String, Codable, Sendable {
            case recorded, unchanged
            case subscriptionUnknown = "subscription-unknown"
            case noStatus = "no-status"
        }

        /// The subscription's transactions in Apple's history.
        public var transactions = 0
        /// Of those, transactions the ledger held already.
        public var known = 0
        /// The others, by `ReceiptLedger`'s outcome.
        public var ingested: [String: Int] = [:]
        /// Refunded or revoked ones: never taken in here (a refund reaches the ledger by
        /// notification or the refund catch-up).
        public var revoked = 0
        /// Signed transactions that failed verification: logged, not taken in.
        public var refused = 0
        /// Apple's status: 1 active, 2 expired, 3 billing retry, 4 grace period, 5 revoked.
        public var appleStatus: Int?
        /// A refund of the latest period the ledger holds, which Apple's latest signed
        /// transaction no longer carries: reversed now, as its missed `REFUND_REVERSED` would.
        public var refundReversed = false
        public var status: Status = .noStatus
        public init() {}
    }

    /// Asks Apple about subscription `originalTransactionId` of `bundleId` (nil: the ledger's
    /// first app) in `environment` (nil: production's when the app accepts it) and records what
    /// the ledger missed. Apple's refusals and failures are thrown (`AppStoreServerAPIError`:
    /// `apple-api-not-found` for an id Apple does not know), and so is an answer whose signed parts
    /// do not verify (`AppleVerificationError`); what was recorded before stays recorded.
    public func refresh(
        originalTransactionId id: String, bundleId: BundleID?, environment: AppleEnvironment?,
        metadata: Data = Data(#"{"appendedBy":"subscription-catch-up"}"#.utf8)
    ) async throws -> Summary {
        let client = try await api.client(for: bundleId, environment: environment)
        var summary = Summary()
        let transactions = try await history(of: id, from: client, into: &summary)
        // A start an order holds that never started the subscription (an imported or pre-subscription
        // grant): started now, so that what follows is recorded on it.
        _ = try await receipts.startHeldSubscriptions(of: transactions, metadata: metadata)
        let known = try await subscriptions.store.subscription(id)
        try await takeIn(transactions, user: known?.userId, metadata: metadata, into: &summary)
        let statuses = try await verifier.subscriptionStatuses(try await client.subscriptionStatuses(id))
        guard let status = statuses.first(where: { $0.originalTransactionId == id }) else { return summary }
        summary.appleStatus = status.status
        summary.refundReversed = try await reverseMissedRefund(status, on: id, metadata: metadata)
        summary.status = try await record(status, on: id, metadata: metadata)
        if summary.status != .unchanged {
            logger.info("subscription caught up from Apple", metadata: [
                "subscription.id": "\(id)", "subscription.apple_status": "\(status.status.map(String.init) ?? "none")",
                "subscription.outcome": "\(summary.status.rawValue)", "subscription.ingested": "\(summary.ingested.values.reduce(0, +))"])
        }
        return summary
    }

    /// The subscription's transactions in Apple's history of the customer, verified, oldest first
    /// (the purchase that started it before its renewals). Apple's history holds every purchase
    /// of the customer: only its auto-renewable ones are asked for (a game's customer may have
    /// bought thousands of consumables, which `maximumPages` would stop at), and of those, the
    /// other subscriptions' are not this catch-up's.
    private func history(of id: String, from client: AppStoreServerAPI, into summary: inout Summary) async throws -> [AppleTransaction] {
        var transactions: [AppleTransaction] = []
        var revision: String?
        // The positions asked in this read: one named again ends it.
        var seen = Set<String>()
        // Whether Apple said more pages follow the last one read.
        var more = false
        for _ in 0..<maximumPages {
            let page = try await client.transactionHistory(id, revision: revision, productTypes: [.autoRenewable])
            for jws in page.signedTransactions {
                do {
                    let (transaction, revocation) = try await verifier.transactionAndRevocation(signed: jws)
                    guard transaction.originalTransactionId == id else { continue }
                    summary.transactions += 1
                    if revocation != nil {
                        summary.revoked += 1
                        continue
                    }
                    transactions.append(transaction)
                } catch {
                    if error.isRetryable { throw error }
                    summary.refused += 1
                    logger.warning("a signed transaction in Apple's transaction history was refused", metadata: [
                        "subscription.id": "\(id)", "error": "\(error.code)", "error.message": "\(error.message)"])
                }
            }
            try AppStoreServerAPIError.requireMoved(page.revision, from: revision, hasMore: page.hasMore, reading: "transaction history", seen: &seen)
            revision = page.revision
            more = page.hasMore
            if !more { break }
        }
        if more {
            logger.warning("a subscription's transaction history has more pages than a catch-up reads: its later transactions were not read", metadata: [
                "subscription.id": "\(id)", "apple.pages": "\(maximumPages)"])
        }
        return transactions.sorted { ($0.purchaseDate, $0.transactionId.rawValue) < ($1.purchaseDate, $1.transactionId.rawValue) }
    }

    /// Takes the transactions the ledger does not hold through the intake of a client's proof,
    /// one after the other (a renewal finds its subscription started by the purchase before it).
    /// One no order takes waits in the pool for the subscription's user, when the ledger knows it.
    private func takeIn(_ transactions: [AppleTransaction], user: UserID?, metadata: Data, into summary: inout Summary) async throws {
        let held = try await pool.holders(of: transactions.map(\.transactionId))
        let claim = ReceiptLedger.Claim(userId: nil, orderId: nil, poolUserId: user)
        for transaction in transactions {
            guard held.index(forKey: transaction.transactionId) == nil else {
                summary.known += 1
                continue
            }
            let answer = try await receipts.apply(transaction, claim: claim, metadata: metadata)
            summary.ingested[answer.outcome.rawValue, default: 0] += 1
        }
    }

    /// Apple's latest signed transaction of the subscription carries no revocation, in an answer
    /// Apple signed after the refund the ledger holds of that period: Apple reversed that refund,
    /// and its `REFUND_REVERSED` never arrived. Applied as that notification would be (the period, and the order its start
    /// paid), named after the refund it reverses, so it is applied once. Whether it was applied now.
    private func reverseMissedRefund(_ status: VerifiedSubscriptionStatus, on id: String, metadata: Data) async throws -> Bool {
        guard let latest = status.transaction, status.revocation == nil, let signed = status.renewalInfo?.info.signedDate,
              let held = try await subscriptions.store.subscription(id),
              let refunded = held.periods.first(where: { $0.transactionId == latest.transactionId })?.refundedAt,
              // Apple signed its answer after the refund: a refund recorded since Apple answered
              // (its notification arriving meanwhile) is not what this answer knew of.
              signed > refunded
        else { return false }
        let record = NotificationReceived(
            notificationUUID: EventID.named("refund-reversed-by-status", latest.transactionId.rawValue, String(refunded.millisecondsSince1970)).uuid,
            notificationType: "REFUND_REVERSED", subtype: nil, transactionId: latest.transactionId, signedDate: signed)
        let applied = try await notifications.apply(.init(record: record, transaction: latest, revocation: nil, fromRefundHistory: true), metadata: metadata)
        if applied.appended {
            logger.info("a refund Apple reversed, whose notification never arrived, reversed from Apple's subscription status", metadata: [
                "subscription.id": "\(id)", "apple.transaction": "\(latest.transactionId)"])
        }
        return applied.appended
    }

    /// Apple's status of the subscription as `subscription-renewal-changed`, when it changes what
    /// the ledger holds: decided and written under the subscription's lock, so two refreshes at
    /// once record it once.
    private func record(_ status: VerifiedSubscriptionStatus, on id: String, metadata: Data) async throws -> Summary.Status {
        let body = SubscriptionRenewalChanged(
            notification: nil, appleStatus: status.status, renewalInfo: status.renewalInfo?.info, expiresDate: status.transaction?.periodEnd,
            purchaseDate: status.transaction?.purchaseDate)
        let event = SubscriptionEvent.renewalChanged(body)
        return try await database.transaction { tx -> Summary.Status in
            try await subscriptions.writer.lock([StreamID.subscription(id)], in: tx)
            guard let held = try await subscriptions.store.subscription(id, in: tx) else { return .subscriptionUnknown }
            guard let next = Subscription.evolve(held, event, version: held.version + 1, at: Date()), Self.changes(held, into: next) else {
                return .unchanged
            }
            let recorded = try await subscriptions.record([(event, Self.statusEventID(id, status))], on: id, metadata: metadata, in: tx)
            return recorded.appended.isEmpty ? .unchanged : .recorded
        }
    }

    /// Whether `next` differs from `held` in anything but the version and the time of the change.
    static func changes(_ held: Subscription, into next: Subscription) -> Bool {
        var next = next
        (next.version, next.updatedAt) = (held.version, held.updatedAt)
        return next != held
    }

    /// The id of the `subscription-renewal-changed` a catch-up records: named by the subscription
    /// and the renewal info's `signedDate` (or, without renewal info, Apple's status and the
    /// period's end), so the same answer of Apple's is recorded once.
    public static func statusEventID(_ id: String, _ status: VerifiedSubscriptionStatus) -> EventID {
        if let signed = status.renewalInfo?.info.signedDate {
            return EventID.named("subscription-status", id, String(signed.millisecondsSince1970))
        }
        return EventID.named(
            "subscription-status", id, String(status.status ?? 0), status.transaction?.expiresDate.map { String($0.millisecondsSince1970) } ?? "")
    }
}
