import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore

/// The common case of Apple's notifications, in groups (issue 40, point 9): a lifecycle
/// notification (`DID_RENEW` above all) about a later period of a subscription the ledger holds.
/// Notifications that arrive together share one database transaction and a few round trips: the
/// locks and reads of all of them, one call of the append routine, the subscriptions' rows. What
/// is recorded is what `apply`'s locked path records for one: the renewal kept as `renewal` when
/// the ledger did not know it, its period once, `subscription-renewal-changed` under the
/// notification's UUID. Everything else (a repeat, a subscription not known yet, a transaction
/// held otherwise, a product of another group than the subscription's) is left to the locked path.
extension NotificationLedger {
    /// One notification waiting for its group.
    struct Renewal: Sendable {
        let notification: Notification
        let transaction: AppleTransaction
        /// The subscription's `originalTransactionId`.
        let subscription: String
        let metadata: Data
    }

    /// Groups of renewals, written one at a time.
    typealias RenewalGroups = GroupCommit<Renewal, Applied?>

    static func renewalGroups(
        database: Database, writer: LedgerWriter, events: EventStore, store: SubscriptionStore, catalog: ProductCatalog
    ) -> RenewalGroups {
        // The writer holds one connection while groups follow each other, and runs on that
        // connection's event loop, as the ledger's writer does: off the loop, the machine sat idle
        // a fifth of the time during renewals (docs/performance.md).
        RenewalGroups(
            executor: database.writerExecutor, session: { body in await database.holdingConnection(body) }, select: selectRenewals
        ) { batch in
            let renewals = batch.map(\.work)
            let answers: [Applied?]
            do {
                answers = try await database.heldTransaction { tx in
                    try await recordRenewals(
                        renewals, database: database, writer: writer, events: events, store: store, catalog: catalog, in: tx)
                }
            } catch {
                // Nothing of the group is stored (a deadlock broken, the database away): each takes the locked path.
                database.logger.debug("a group of renewals failed; each alone", metadata: ["error": "\(String(reflecting: error))"])
                answers = renewals.map { _ in nil }
            }
            for (pending, answer) in zip(batch, answers) { pending.continuation.resume(with: .success(answer)) }
        }
    }

    /// Groups of renewals written so far, the renewals they carried, and those waiting now (for
    /// tests and the benchmark).
    public var renewalGroupStatistics: (groups: Int, renewals: Int, waiting: Int) {
        let statistics = renewalGroups.statistics
        return (statistics.batches, statistics.items, statistics.waiting)
    }

    /// `notification` through a group when it is the common case; nil when it is not, or the
    /// group left it (then the locked path decides, from the start).
    func applyInGroup(_ notification: Notification, metadata: Data) async throws -> Applied? {
        guard let transaction = notification.transaction, Self.lifecycleTypes.contains(notification.record.notificationType) else {
            return nil
        }
        // A later period by what Apple signed; the group looks up the catalog's type, which comes
        // first, for all of its renewals at once. A transaction of no role (what a subscription needs
        // missing) is refused by the locked path.
        guard case .subscriptionPeriod(let id)? = try? TransactionRole.of(transaction, catalogType: nil) else { return nil }
        return try await renewalGroups.submit(Renewal(notification: notification, transaction: transaction, subscription: id, metadata: metadata))
    }

    /// The oldest renewals that share no Apple transaction or subscription with an older one in
    /// the group (one call of the append routine takes writes with no stream in common).
    private static func selectRenewals(_ pending: [Renewal]) -> [Int] {
        var touched = Set<String>()
        var chosen: [Int] = []
        for (index, renewal) in pending.enumerated() where chosen.count < 256 {
            let keys = [renewal.transaction.transactionId.rawValue, "subscription " + renewal.subscription]
            guard !keys.contains(where: touched.contains) else { continue }
            touched.formUnion(keys)
            chosen.append(index)
        }
        return chosen
    }

    /// Records `renewals` in the caller's transaction: the answer for each, nil for one the
    /// locked path must decide.
    private static func recordRenewals(
        _ renewals: [Renewal], database: Database, writer: LedgerWriter, events: EventStore, store: SubscriptionStore,
        catalog: ProductCatalog, in tx: DatabaseTransaction
    ) async throws -> [Applied?] {
        var typings: [String: ProductCatalog.Typing?] = [:]
        for renewal in renewals {
            let key = renewal.transaction.bundleId + " " + renewal.transaction.productId.rawValue
            if typings[key] == nil {
                // As a receipt reads it: the catalog's copy, no round trip the group waits for.
                typings[key] = .some(try await catalog.typing(of: renewal.transaction.productId, bundleId: renewal.transaction.bundleId))
            }
        }
        let ids = renewals.map(\.transaction.transactionId)
        let snapshot = try await writer.read(
            locking: renewals.flatMap { [$0.transaction.transactionId.streamID, StreamID.subscription($0.subscription)] },
            orders: [], transactions: ids, in: tx)
        // Of each subscription, the period its renewal would add, if recorded: the rest of its
        // periods play no part in recording a renewal.
        let subscriptions = try await store.subscriptions(
            renewals.map(\.subscription), periodKeys: renewals.map { $0.transaction.webOrderLineItemId ?? $0.transaction.transactionId.rawValue },
            in: tx)
        let stored = try await events.storedIDs(
            renewals.flatMap { [EventID($0.notification.record.notificationUUID), SubscriptionLedger.periodEventID($0.subscription, $0.transaction)] },
            in: tx)
        var writes: [LedgerWriter.Write] = []
        var taken: [(index: Int, before: Subscription, events: [NewEvent])] = []
        for (index, renewal) in renewals.enumerated() {
            let transaction = renewal.transaction
            let notificationID = EventID(renewal.notification.record.notificationUUID)
            let typing = typings[transaction.bundleId + " " + transaction.productId.rawValue] ?? nil
            // The intake's rule: the catalog's type first (a product it types otherwise is no renewal).
            guard case .subscriptionPeriod(renewal.subscription)? = try? TransactionRole.of(transaction, catalogType: typing?.type),
                  !stored.contains(notificationID), let before = subscriptions[renewal.subscription],
                  before.bundleId.map({ $0.rawValue.lowercased() == transaction.bundleId.lowercased() }) ?? true,
                  sameGroup(transaction, typing: typing, as: before) else { continue }
            let holder = snapshot.transaction(transaction.transactionId)
            if let holder, holder.status != .renewal || holder.orderId != nil { continue }
            var appends: [LedgerWriter.Append] = []
            if holder == nil {
                appends.append(try ReceiptLedger.poolAppend(
                    transaction, userId: before.userId, claimedOrder: nil, reason: AppleTransactionRecord.subscriptionRenewalReason,
                    metadata: renewal.metadata))
            }
            var recorded: [(SubscriptionEvent, EventID)] = []
            let periodID = SubscriptionLedger.periodEventID(renewal.subscription, transaction)
            if !stored.contains(periodID) {
                recorded.append((.period(SubscriptionPeriodRecorded(transaction: transaction, kind: .renewal)), periodID))
            }
            recorded.append((.renewalChanged(SubscriptionRenewalChanged(
                notification: renewal.notification.record, renewalInfo: renewal.notification.renewalInfo,
                expiresDate: transaction.periodEnd, purchaseDate: transaction.purchaseDate)), notificationID))
            let new = try recorded.map { try EventCoding.newEvent($0.0, id: $0.1, metadata: renewal.metadata) }
            appends.append(LedgerWriter.Append(new, to: .subscription(renewal.subscription), expected: .exact(before.version)))
            writes.append(LedgerWriter.Write(appends))
            taken.append((index, before, new))
        }
        var answers = [Applied?](repeating: nil, count: renewals.count)
        guard !writes.isEmpty else { return answers }
        let results = try await writer.append(writes, in: tx, knowing: snapshot)
        var rows: [(subscription: Subscription, before: Subscription?)] = []
        for (result, (index, before, new)) in zip(results, taken) {
            // Under the locks nothing moved since the read: a refusal fails the group, and each
            // takes the locked path.
            let written = try result.get()
            guard let appended = written.appends.last, appended.events.count == new.count else {
                throw AppendError.invalidBatch("a renewal's subscription events were not all appended")
            }
            // Folded as the log recorded the events, as `SubscriptionLedger.record` folds them.
            var row: Subscription? = before
            for (event, stored) in zip(new, appended.events) {
                guard case .subscription(let event) = event.body else { continue }
                row = Subscription.evolve(row, event, version: stored.streamVersion, at: stored.recordedAt)
            }
            guard let row else { continue }
            rows.append((row, before))
            answers[index] = Applied(
                appended: true, streamId: .subscription(renewals[index].subscription), type: SubscriptionEventType.renewalChanged.rawValue)
        }
        try await store.write(rows, in: tx)
        return answers
    }

    /// The locked path's group check (`ReceiptLedger.checkGroup`) when it needs no read: the
    /// renewal names no group, or is of the subscription's own product, whose group `typing` gives.
    private static func sameGroup(_ transaction: AppleTransaction, typing: ProductCatalog.Typing?, as subscription: Subscription) -> Bool {
        guard let renewalGroup = ReceiptLedger.group(of: transaction, typing: typing) else { return true }
        // Another product's group is the catalog's to say: the locked path reads it.
        guard subscription.productId == transaction.productId else { return false }
        guard let group = typing?.subscriptionGroup ?? subscription.subscriptionGroup else { return true }
        return group == renewalGroup
    }
}
