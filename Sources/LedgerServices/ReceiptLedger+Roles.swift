import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore

/// The intake by role (issue 40): only a purchase of its own pays an order. A subscription's start
/// pays its order and starts the subscription's stream; a later period of it is recorded on the
/// subscription (or waits for its start), and a family member's share is an entitlement. Neither
/// of these is ever an order's: they are kept with a status the pool and every pairing skip
/// (`renewal`, `shared`), and an order the proof names is left as it is.
extension ReceiptLedger {
    /// Applies `transaction` as `role` in the caller's transaction. `typing`: what the catalog
    /// says of its product.
    func apply(
        _ transaction: AppleTransaction, as role: TransactionRole, typing: ProductCatalog.Typing?, claim: Claim, metadata: Data,
        in tx: DatabaseTransaction
    ) async throws -> Answer {
        switch role {
        case .purchase:
            return try await applyPurchase(transaction, claim: claim, metadata: metadata, in: tx)
        case .subscriptionStart(let id):
            let answer = try await applyPurchase(transaction, claim: claim, metadata: metadata, in: tx)
            // Refunded before any order took it: never granted, and no subscription of it is kept.
            // Held for support (an Apple-account conflict): no one's until support decides.
            if answer.outcome != .rejected, answer.reason != AppleTransactionRecord.accountConflictReason {
                try await recordStart(transaction, of: id, typing: typing, metadata: metadata, in: tx)
            }
            return answer
        case .subscriptionPeriod(let id):
            return try await applyRenewal(transaction, of: id, typing: typing, claim: claim, metadata: metadata, in: tx)
        case .familyShared(let id):
            return try await applyShared(transaction, subscription: id, claim: claim, metadata: metadata, in: tx)
        case .restore(let original):
            return try await applyRestore(transaction, of: original, claim: claim, metadata: metadata, in: tx)
        }
    }

    /// A restore pays no order: kept with the status `restore` (for the user sent, if any), as a
    /// family member's share is, and the order the proof names is left as it is. The answer
    /// names that order, else the one the original purchase paid. A backend's unverified claim of
    /// it is taken back first; one an order took before restores were told apart is answered as
    /// that order's.
    private func applyRestore(
        _ transaction: AppleTransaction, of original: String, claim: Claim, metadata: Data, in tx: DatabaseTransaction
    ) async throws -> Answer {
        let (snapshot, named, _, _) = try await lookUp(transaction, claim: claim, in: tx)
        let holder = snapshot.transaction(transaction.transactionId)
        if try await takeBackClaim(of: transaction, holder: holder, metadata: metadata, in: tx) {
            return try await applyRestore(transaction, of: original, claim: claim, metadata: metadata, in: tx)
        }
        if holder?.orderId != nil { return try await applyPurchase(transaction, claim: claim, metadata: metadata, in: tx) }
        var originalRecord: AppleTransactionRecord?
        if let originalID = try? TransactionID(original) {
            originalRecord = try await writer.read(orders: [], transactions: [originalID], in: tx).transaction(originalID)
        }
        if holder == nil {
            // Without a user sent, the original purchase's (as a renewal takes its subscription's).
            let kept = try Self.poolAppend(
                transaction, userId: claim.userId ?? claim.poolUserId ?? originalRecord?.userId, claimedOrder: claim.orderId,
                reason: AppleTransactionRecord.restoreReason, metadata: metadata)
            _ = try await writer.append(LedgerWriter.Write(kept), in: tx, knowing: snapshot)
        }
        var order = named
        if order == nil, let paid = originalRecord?.orderId {
            order = try await writer.read(orders: [paid], transactions: [], in: tx).order(paid)
        }
        return Answer(outcome: .recorded, transactionId: transaction.transactionId, orderId: order?.orderId, state: order?.state,
                      finishTransaction: true, reason: AppleTransactionRecord.restoreReason)
    }

    /// The reason a row the ledger holds is never an order's (`renewal`, `shared`, `restore`), else nil.
    static func neverAnOrders(_ row: AppleTransactionRecord) -> String? {
        guard row.orderId == nil else { return nil }
        switch row.status {
        case .renewal: return AppleTransactionRecord.subscriptionRenewalReason
        case .shared: return AppleTransactionRecord.familySharedReason
        case .restore: return AppleTransactionRecord.restoreReason
        case .unmatched, .refunded, .claimed, .conflict: return nil
        }
    }

    /// `subscription-started` and the start's period on subscription `id`, with every renewal of
    /// it that waited for the start (their periods, once each), under the subscription's lock. The
    /// subscription's user is the one the transaction is now held for (its order's, else the
    /// pool's), else the one a waiting renewal came with; a subscription started without a user
    /// gets the one its start is now held for (`subscription-user-recorded`). A waiting renewal
    /// Apple refunded or revoked meanwhile has its period refunded (`subscription-period-refunded`).
    func recordStart(
        _ transaction: AppleTransaction, of id: String, typing: ProductCatalog.Typing?, metadata: Data, in tx: DatabaseTransaction
    ) async throws {
        let holder = try await writer.read(orders: [], transactions: [transaction.transactionId], in: tx).transaction(transaction.transactionId)
        // Locked before the waiting renewals are read: a renewal arriving meanwhile either
        // committed before (and is read here) or finds the subscription started once this commits.
        try await writer.lock([StreamID.subscription(id)], in: tx)
        let group = Self.group(of: transaction, typing: typing)
        var renewals: [TransactionUnmatched] = []
        for waiting in try await subscriptions.store.renewals(of: id, in: tx) where waiting.transaction.transactionId != transaction.transactionId {
            // One of another group is not this subscription's: it keeps waiting (and support sees it).
            if let group, let other = try await self.group(of: waiting.transaction, in: tx), other != group { continue }
            renewals.append(waiting)
        }
        let user = holder?.userId ?? renewals.lazy.compactMap(\.userId).first
        if let holder, holder.isPooled, holder.userId == nil, let user, let entry = try holder.pooled(),
           try await TransactionPool(database: database).knownUser(of: transaction, in: tx).map({ $0 == user }) ?? true {
            // Pooled for no one (Apple's notification), while a client named the user of a renewal
            // that waited: the start waits for that user, as `nameUser` has it.
            _ = try await writer.append(LedgerWriter.Write(try Self.poolUser(user, of: entry, metadata: metadata)), in: tx)
        }
        let started = SubscriptionStarted(originalTransactionId: id, transaction: transaction, userId: user, familyShared: false)
        // A start recorded from its order's receipt (`startHeldSubscription`) keeps its period
        // (`SubscriptionLedger.record` records a transaction's period once).
        var events: [(SubscriptionEvent, EventID)] = [
            (.started(started), SubscriptionLedger.startedEventID(id)),
            (.period(SubscriptionPeriodRecorded(transaction: transaction, kind: .start)), SubscriptionLedger.periodEventID(id, transaction)),
        ]
        let before = try await subscriptions.store.subscription(id, in: tx)
        if let before, let user = holder?.userId, user != before.userId {
            // Started before anyone claimed it (Apple's notification first): its user is now the
            // one its start is held for, the order's that took it or the pool entry's. Started for
            // another user: the user of the order its start pays now (who paid for it), never on
            // a backend's claim not verified yet.
            var takes = before.userId == nil
            if !takes, holder?.orderId != nil { takes = try await unverifiedClaim(of: transaction.transactionId, holder: holder, in: tx) == nil }
            if takes {
                events.append(try await subscriptions.userEvent(user, of: before, from: transaction.transactionId, order: holder?.orderId, in: tx))
            }
        }
        // What Apple said of a waiting renewal's refund is on the renewal's own stream: its period
        // is refunded with it, once (the event is named after the notification).
        let told = try await subscriptions.store.refundNotifications(
            of: [transaction.transactionId] + renewals.map(\.transaction.transactionId), in: tx)
        // What Apple said of renewal about the start itself while it waited (held for support
        // before a subscription was started), and about each waiting renewal.
        func renewalNews(of held: AppleTransaction) -> [(NotificationReceived, AppleTransaction)] {
            (told[held.transactionId] ?? []).filter { $0.renewalInfo != nil || $0.periodEnd != nil }.map { ($0, held) }
        }
        var lifecycle = renewalNews(of: transaction)
        for waiting in renewals {
            let renewal = waiting.transaction
            let period = SubscriptionPeriodRecorded(transaction: renewal, kind: .renewal)
            events.append((.period(period), SubscriptionLedger.periodEventID(id, renewal)))
            if let standing = SubscriptionPeriodRefunded.standing(
                after: told[renewal.transactionId] ?? [], transactionId: renewal.transactionId, periodKey: period.periodKey) {
                events.append((.periodRefunded(standing.refund), SubscriptionLedger.notificationEventID(id, standing.notification)))
            }
            lifecycle += renewalNews(of: renewal)
        }
        // What Apple said of renewal while they waited (a grace period, billing retry, auto-renew
        // turned off), after every period, in the order Apple signed it: as it would have been
        // recorded had the start come first.
        for (notification, renewal) in lifecycle.sorted(by: { $0.0.signedDate < $1.0.signedDate }) {
            var record = notification
            (record.renewalInfo, record.periodEnd) = (nil, nil)
            let changed = SubscriptionRenewalChanged(
                notification: record, renewalInfo: notification.renewalInfo, expiresDate: notification.periodEnd ?? renewal.periodEnd,
                purchaseDate: renewal.purchaseDate)
            events.append((.renewalChanged(changed), SubscriptionLedger.notificationEventID(id, notification.notificationUUID)))
        }
        _ = try await subscriptions.record(events, on: id, metadata: metadata, in: tx)
    }

    /// A later transaction of subscription `id`: kept as a renewal (never pooled for an order) and
    /// recorded as a period of the subscription once it is known; until then it waits, and the
    /// start ties it. The order the proof names (by id or appAccountToken) is left as it is.
    private func applyRenewal(
        _ transaction: AppleTransaction, of id: String, typing: ProductCatalog.Typing?, claim: Claim, metadata: Data,
        in tx: DatabaseTransaction
    ) async throws -> Answer {
        let (snapshot, named, _, _) = try await lookUp(transaction, claim: claim, in: tx)
        let holder = snapshot.transaction(transaction.transactionId)
        if try await takeBackClaim(of: transaction, holder: holder, metadata: metadata, in: tx) {
            // A backend's unverified claim of it for an order: taken back, then recorded as if never claimed.
            return try await applyRenewal(transaction, of: id, typing: typing, claim: claim, metadata: metadata, in: tx)
        }
        if let refused = Self.refusedAsRefunded(holder, transaction, named) { return refused }
        try await startHeldSubscription(id, seen: transaction, metadata: metadata, in: tx)
        // The start's lock before the subscription's, as its intake takes them: a client naming
        // its user may name the start's too (`nameUser`).
        if claim.userId != nil { try await lockTransaction(TransactionID(unchecked: id), in: tx) }
        try await writer.lock([StreamID.subscription(id)], in: tx)
        let subscription = try await subscriptions.store.subscription(id, in: tx)
        if let subscription {
            try Self.checkApp(transaction, of: subscription)
            try await checkGroup(transaction, typing: typing, of: subscription, in: tx)
        }
        if holder == nil {
            let pooled = try Self.poolAppend(
                transaction, userId: claim.userId ?? subscription?.userId ?? claim.poolUserId, claimedOrder: claim.orderId,
                reason: AppleTransactionRecord.subscriptionRenewalReason, metadata: metadata)
            _ = try await writer.append(LedgerWriter.Write(pooled), in: tx, knowing: snapshot)
        }
        let period = SubscriptionEvent.period(SubscriptionPeriodRecorded(transaction: transaction, kind: .renewal))
        _ = try await subscriptions.record([(period, SubscriptionLedger.periodEventID(id, transaction))], on: id, metadata: metadata, in: tx)
        if let user = claim.userId { try await nameUser(user, of: id, held: subscription, from: transaction, metadata: metadata, in: tx) }
        var order = named ?? holder?.orderId.flatMap { snapshot.order($0) }
        if order == nil, holder?.orderId == nil {
            // The order that bought the subscription, for the client to show.
            let start = TransactionID(unchecked: id)
            if let owner = try await writer.read(orders: [], transactions: [start], in: tx).transaction(start)?.orderId {
                order = try await writer.read(orders: [owner], transactions: [], in: tx).order(owner)
            }
        }
        return Answer(outcome: .recorded, transactionId: transaction.transactionId, orderId: order?.orderId ?? holder?.orderId,
                      state: order?.state, finishTransaction: true, reason: AppleTransactionRecord.subscriptionRenewalReason)
    }

    /// A client uploading a later period of subscription `id` for `user` (StoreKit's latest
    /// transaction of it) when Apple told of the subscription first, with no user: the
    /// subscription is that user's (`subscription-user-recorded`), and its start, waiting in the
    /// pool for no one, waits for that user, whose open order the reconciler may then pair it
    /// with, as when the client uploads the start itself. Once each: a later claim changes
    /// nothing, and neither does a claim against the user the ledger knows for the Apple account
    /// or token. `subscription`: as the caller read it under the locks it holds, the start's and
    /// the subscription's.
    private func nameUser(
        _ user: UserID, of id: String, held subscription: Subscription?, from transaction: AppleTransaction, metadata: Data, in tx: DatabaseTransaction
    ) async throws {
        let unnamed = subscription.map { $0.userId == nil } ?? false
        let startID = TransactionID(unchecked: id)
        let snapshot = try await writer.read(orders: [], transactions: [startID], in: tx)
        let waiting = try snapshot.transaction(startID).flatMap { $0.isPooled && $0.userId == nil ? try $0.pooled() : nil }
        // Most uploads find both named: nothing more is asked.
        guard unnamed || waiting != nil else { return }
        // The user the ledger knows for its Apple account or token decides, never a client's word against it.
        if let known = try await TransactionPool(database: database).knownUser(of: transaction, in: tx), known != user { return }
        if unnamed { try await subscriptions.recordUser(user, from: transaction.transactionId, order: nil, on: id, metadata: metadata, in: tx) }
        guard let entry = waiting else { return }
        _ = try await writer.append(LedgerWriter.Write(try Self.poolUser(user, of: entry, metadata: metadata)), in: tx, knowing: snapshot)
    }

    /// A subscription's start waiting in the pool for no one (`entry`), now for `user`: the
    /// `pool-user` event, as an upload of the start writes it, once.
    static func poolUser(_ user: UserID, of entry: TransactionUnmatched, metadata: Data) throws -> LedgerWriter.Append {
        try poolAppend(
            entry.transaction, userId: user, claimedOrder: nil, reason: entry.reason, undoneOrderIds: entry.undoneOrderIds,
            id: EventID.named("pool-user", entry.transaction.transactionId.rawValue), metadata: metadata)
    }

    /// A family member's shared access (`FAMILY_SHARED`): kept as `shared` for the member as
    /// claimed, never an order's nor paired; of an auto-renewable product, also the member's own
    /// subscription (`subscription`, the member's originalTransactionId), started by the first
    /// shared transaction the ledger meets, with its periods. The order the proof names is left as it is.
    private func applyShared(
        _ transaction: AppleTransaction, subscription id: String?, claim: Claim, metadata: Data, in tx: DatabaseTransaction
    ) async throws -> Answer {
        let (snapshot, named, _, _) = try await lookUp(transaction, claim: claim, in: tx)
        let holder = snapshot.transaction(transaction.transactionId)
        if try await takeBackClaim(of: transaction, holder: holder, metadata: metadata, in: tx) {
            // A backend's unverified claim of it: taken back, then recorded as if never claimed.
            return try await applyShared(transaction, subscription: id, claim: claim, metadata: metadata, in: tx)
        }
        if let refused = Self.refusedAsRefunded(holder, transaction, named) { return refused }
        let member = claim.userId ?? holder?.userId ?? claim.poolUserId
        if holder == nil {
            let pooled = try Self.poolAppend(
                transaction, userId: member, claimedOrder: claim.orderId, reason: AppleTransactionRecord.familySharedReason, metadata: metadata)
            _ = try await writer.append(LedgerWriter.Write(pooled), in: tx, knowing: snapshot)
        } else if let holder, holder.status == .shared, holder.orderId == nil, holder.userId == nil, let member = claim.userId {
            // Kept before anyone claimed it (Apple's notification first): the member who uploads
            // it is the one it is shared with, once (as a shared subscription learns its user).
            let named = try Self.poolAppend(
                transaction, userId: member, claimedOrder: claim.orderId, reason: AppleTransactionRecord.familySharedReason,
                id: EventID.named("shared-user", transaction.transactionId.rawValue), metadata: metadata)
            _ = try await writer.append(LedgerWriter.Write(named), in: tx, knowing: snapshot)
        }
        if let id {
            if let existing = try await subscriptions.store.subscription(id, in: tx) { try Self.checkApp(transaction, of: existing) }
            let started = SubscriptionStarted(originalTransactionId: id, transaction: transaction, userId: member, familyShared: true)
            let kind: SubscriptionPeriodKind = transaction.transactionId.rawValue == id ? .start : .renewal
            _ = try await subscriptions.record([
                (.started(started), SubscriptionLedger.startedEventID(id)),
                (.period(SubscriptionPeriodRecorded(transaction: transaction, kind: kind)), SubscriptionLedger.periodEventID(id, transaction)),
            ], on: id, metadata: metadata, in: tx)
            // Started by a notification before the member's upload: the member is known now.
            try await subscriptions.recordUser(member, from: transaction.transactionId, order: nil, on: id, metadata: metadata, in: tx)
        }
        let order = named ?? holder?.orderId.flatMap { snapshot.order($0) }
        return Answer(outcome: .recorded, transactionId: transaction.transactionId, orderId: order?.orderId ?? holder?.orderId,
                      state: order?.state, finishTransaction: true, reason: AppleTransactionRecord.familySharedReason)
    }

    /// A transaction Apple refunded or revoked before the ledger recorded it otherwise: never
    /// granted, as a purchase's (`rejected`, `transaction-refunded`).
    private static func refusedAsRefunded(_ holder: AppleTransactionRecord?, _ transaction: AppleTransaction, _ named: Order?) -> Answer? {
        guard let holder, holder.orderId == nil, holder.status == .refunded else { return nil }
        return Answer(outcome: .rejected, transactionId: transaction.transactionId, orderId: named?.orderId, state: named?.state,
                      finishTransaction: true, reason: "transaction-\(holder.status.rawValue)")
    }

    /// Refuses a later transaction Apple signed for another app than its subscription's: a
    /// subscription is one app's, and never takes another's periods (issue 39).
    static func checkApp(_ transaction: AppleTransaction, of subscription: Subscription) throws {
        guard let app = subscription.bundleId, app.rawValue.lowercased() != transaction.bundleId.lowercased() else { return }
        throw LedgerInputError(
            field: "originalTransactionId",
            problem: "\(subscription.originalTransactionId) is a subscription of another app than \(transaction.bundleId)")
    }

    /// Refuses a renewal whose product is in another subscription group than its subscription's
    /// (by the catalog, else as Apple signed them): it is not that subscription's.
    private func checkGroup(
        _ transaction: AppleTransaction, typing: ProductCatalog.Typing?, of subscription: Subscription, in tx: DatabaseTransaction
    ) async throws {
        guard let renewalGroup = Self.group(of: transaction, typing: typing) else { return }
        let known = try await catalog.typing(of: subscription.productId, bundleId: transaction.bundleId, in: tx)?.subscriptionGroup
        guard let group = known ?? subscription.subscriptionGroup, group != renewalGroup else { return }
        throw LedgerInputError(
            field: "productId",
            problem: "\(transaction.productId) is in subscription group \(renewalGroup), not in group \(group) of subscription \(subscription.originalTransactionId)")
    }

    /// The subscription group of `transaction`'s product: the catalog's (`typing`), else as Apple signed it.
    static func group(of transaction: AppleTransaction, typing: ProductCatalog.Typing?) -> String? {
        typing?.subscriptionGroup ?? transaction.subscriptionGroupIdentifier
    }

    /// The subscription group of `transaction`'s product: the catalog's, else as Apple signed it.
    private func group(of transaction: AppleTransaction, in tx: DatabaseTransaction) async throws -> String? {
        Self.group(of: transaction, typing: try await catalog.typing(of: transaction.productId, bundleId: transaction.bundleId, in: tx))
    }
}
