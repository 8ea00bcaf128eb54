import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore

/// Records what the ledger learns of an auto-renewable subscription on its stream
/// (`subscription-<originalTransactionId>`) and keeps its projection row in step, in the caller's
/// transaction, under the stream's lock. Each event has a named id (a period's is named after its
/// `webOrderLineItemId`, a notification's is its UUID), so what arrives twice is recorded once.
public struct SubscriptionLedger: Sendable {
    let writer: LedgerWriter
    let events: EventStore
    let store: SubscriptionStore

    public init(writer: LedgerWriter, events: EventStore, store: SubscriptionStore) {
        self.writer = writer
        self.events = events
        self.store = store
    }

    /// What a call recorded.
    public struct Recorded: Sendable {
        /// The subscription as the events leave it (nil: not started yet, so nothing was recorded).
        public var subscription: Subscription?
        /// The events appended (those stored before are skipped).
        public var appended: [SubscriptionEventType]
    }

    /// The id of the period event for `transaction` on subscription `id`: one per billing period.
    public static func periodEventID(_ id: String, _ transaction: AppleTransaction) -> EventID {
        EventID.named("subscription-period", id, transaction.webOrderLineItemId ?? transaction.transactionId.rawValue)
    }

    /// The id of `subscription-started` on subscription `id`.
    public static func startedEventID(_ id: String) -> EventID {
        EventID.named("subscription-started", id)
    }

    /// The id of what notification `uuid` records on subscription `id` when the notification's own
    /// id names an event elsewhere (the start's order's refund, a waiting renewal's stream).
    public static func notificationEventID(_ id: String, _ uuid: UUID) -> EventID {
        EventID.named("subscription-notification", id, uuid.uuidString.lowercased())
    }

    /// The id of `subscription-user-recorded` on subscription `id`: a subscription learns its user once.
    public static func userEventID(_ id: String) -> EventID {
        EventID.named("subscription-user", id)
    }

    /// The id of a `subscription-user-recorded` that changes subscription `id`'s user, at stream
    /// version `version`, to `user` (nil: none): the start paid another user's order, or no order
    /// since a pairing was undone.
    public static func userChangeEventID(_ id: String, to user: UserID?, at version: Int64) -> EventID {
        EventID.named("subscription-user-changed", id, user?.rawValue ?? "", "\(version)")
    }

    /// `subscription-user-recorded` making `user` (nil: none) the user of `held`: its id the
    /// first one's while none was stored, else named after the version it changes.
    func userEvent(
        _ user: UserID?, of held: Subscription, from transaction: TransactionID, order: OrderID?, in tx: DatabaseTransaction
    ) async throws -> (SubscriptionEvent, EventID) {
        let id = held.originalTransactionId
        let first = Self.userEventID(id)
        let eventID = try await events.storedIDs([first], in: tx).isEmpty ? first : Self.userChangeEventID(id, to: user, at: held.version)
        return (.userRecorded(SubscriptionUserRecorded(userId: user, transactionId: transaction, orderId: order)), eventID)
    }

    /// Makes `user` (nil: none) subscription `id`'s whoever had it: the user of the order its
    /// start now pays (a pairing by the reconciler or support), or the user its start waits for
    /// in the pool again (an undone pairing). Nothing when it is not started or is `user`'s already.
    public func moveUser(
        to user: UserID?, from transaction: TransactionID, order: OrderID?, on id: String, metadata: Data, in tx: DatabaseTransaction
    ) async throws {
        try await setUser(user, from: transaction, order: order, on: id, onlyWhenNone: false, metadata: metadata, in: tx)
    }

    /// Records `user` as subscription `id`'s when it has none (it started before anyone claimed
    /// it): `subscription-user-recorded`, in the caller's transaction, under the stream's lock.
    /// Nothing when the subscription is not started, already has a user, or `user` is nil.
    public func recordUser(
        _ user: UserID?, from transaction: TransactionID, order: OrderID?, on id: String, metadata: Data, in tx: DatabaseTransaction
    ) async throws {
        guard let user else { return }
        try await setUser(user, from: transaction, order: order, on: id, onlyWhenNone: true, metadata: metadata, in: tx)
    }

    /// `user` as subscription `id`'s, under the stream's lock (`onlyWhenNone`: unless it has one).
    private func setUser(
        _ user: UserID?, from transaction: TransactionID, order: OrderID?, on id: String, onlyWhenNone: Bool, metadata: Data,
        in tx: DatabaseTransaction
    ) async throws {
        try await writer.lock([StreamID.subscription(id)], in: tx)
        guard let held = try await store.subscription(id, in: tx), held.userId != user, !onlyWhenNone || held.userId == nil else { return }
        _ = try await record([try await userEvent(user, of: held, from: transaction, order: order, in: tx)], on: id, metadata: metadata, in: tx)
    }

    /// Appends those of `events` not stored yet to subscription `id`'s stream, and writes its row.
    /// Events before the subscription has started (no `subscription-started` in the stream or in
    /// `events`) are not recorded: the caller keeps the transaction waiting instead.
    public func record(
        _ new: [(SubscriptionEvent, EventID)], on id: String, metadata: Data, in tx: DatabaseTransaction
    ) async throws -> Recorded {
        let stream = StreamID.subscription(id)
        try await writer.lock([stream], in: tx)
        let before = try await store.subscription(id, in: tx)
        var started = before != nil
        let stored = try await events.storedIDs(new.map(\.1), in: tx)
        // A transaction has one period: one recorded under another key (a start known from its
        // order's receipt has its transaction's id; Apple's signed start names it by its
        // `webOrderLineItemId`) is not recorded again, and what is said of it names that key.
        var keys = Dictionary(before?.periods.map { ($0.transactionId, $0.periodKey) } ?? [], uniquingKeysWith: { first, _ in first })
        var chosen: [(SubscriptionEvent, EventID)] = []
        for (event, eventID) in new {
            if chosen.contains(where: { $0.1 == eventID }) { continue }
            if stored.contains(eventID) { continue }
            if !started, event.type != .started { continue }
            started = true
            var event = event
            switch event {
            case .period(let body):
                if let key = keys[body.transaction.transactionId], key != body.periodKey { continue }
                keys[body.transaction.transactionId] = body.periodKey
            case .periodRefunded(var body):
                body.periodKey = keys[body.transactionId] ?? body.periodKey
                event = .periodRefunded(body)
            case .periodRefundReversed(var body):
                body.periodKey = keys[body.transactionId] ?? body.periodKey
                event = .periodRefundReversed(body)
            default:
                break
            }
            chosen.append((event, eventID))
        }
        // A period an order holds whose refund refunded that order before the ledger knew the
        // subscription (Apple's refund of a renewal a backend claimed for an order of its own): it
        // is recorded refunded, as that refund would have recorded it, under the same id.
        let periods = chosen.compactMap { event, _ -> TransactionID? in
            if case .period(let body) = event { return body.transaction.transactionId } else { return nil }
        }
        if started, !periods.isEmpty {
            let refunds = try await store.refundsOfHoldingOrders(periods, in: tx)
            let named = refunds.mapValues { Self.notificationEventID(id, $0.0.uuid) }
            let told = try await events.storedIDs(Array(named.values), in: tx)
            for (transaction, (refundID, refund)) in refunds {
                guard let eventID = named[transaction], !told.contains(eventID), !chosen.contains(where: { $0.1 == eventID }),
                      let at = chosen.firstIndex(where: { if case .period(let body) = $0.0 { body.transaction.transactionId == transaction } else { false } }),
                      case .period(let period) = chosen[at].0 else { continue }
                let body = SubscriptionPeriodRefunded(
                    transactionId: transaction, periodKey: period.periodKey,
                    revocation: Revocation(date: refund.revocationDate, reason: refund.revocationReason, type: refund.revocationType, percentage: refund.revocationPercentage),
                    notificationType: refund.notificationType, notificationUUID: refundID.uuid)
                chosen.insert((.periodRefunded(body), eventID), at: at + 1)
            }
        }
        guard !chosen.isEmpty else { return Recorded(subscription: before, appended: []) }
        let appends = try chosen.map { try EventCoding.newEvent($0.0, id: $0.1, metadata: metadata) }
        let expected: ExpectedVersion = before.map { .exact($0.version) } ?? .noStream
        let written = try await writer.append(LedgerWriter.Write(LedgerWriter.Append(appends, to: stream, expected: expected)), in: tx)
        // Folded as the log recorded the events (their bodies as stored, their versions and time),
        // as a rebuild folds them: a body read back can differ from the one given (times are
        // stored to the millisecond).
        var row = before
        for (new, stored) in zip(appends, written.appends[0].events) {
            guard case .subscription(let event) = new.body else { continue }
            row = Subscription.evolve(row, event, version: stored.streamVersion, at: stored.recordedAt)
        }
        guard let row else { return Recorded(subscription: before, appended: []) }
        try await store.write(row, since: before, in: tx)
        let types = chosen.map(\.0.type)
        return Recorded(subscription: row, appended: types)
    }
}
