import AppleReceipts
import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import Logging

/// Applies App Store Server Notifications: refunds and their reversals change the order, every
/// other type is recorded on the stream of the order (or pooled transaction) it concerns; the end
/// of a family member's shared access is recorded on the transaction's own stream and changes no
/// order. A notification about an auto-renewable subscription's transaction is recorded on the
/// subscription (`NotificationLedger+Subscriptions`). The notification's UUID is the id of the
/// event it appends, so Apple's retries apply it once.
public struct NotificationLedger: Sendable {
    let database: Database
    let writer: LedgerWriter
    let events: EventStore
    /// The intake of a client's proof: a notification about a transaction the ledger does not
    /// know takes it in as one, without an order.
    let receipts: ReceiptLedger
    /// Where a subscription's lifecycle is recorded.
    let subscriptions: SubscriptionLedger
    /// Where renewal notifications' common case waits for its group (`NotificationLedger+Renewals`).
    let renewalGroups: RenewalGroups

    public init(database: Database, writer: LedgerWriter, events: EventStore, receipts: ReceiptLedger, subscriptions: SubscriptionLedger) {
        self.database = database
        self.writer = writer
        self.events = events
        self.receipts = receipts
        self.subscriptions = subscriptions
        self.renewalGroups = Self.renewalGroups(
            database: database, writer: writer, events: events, store: subscriptions.store, catalog: receipts.catalog)
    }

    /// A verified notification and the transaction it carries.
    public struct Notification: Sendable {
        public var record: NotificationReceived
        public var transaction: AppleTransaction?
        /// How Apple refunded or revoked the transaction, as its signed transaction says.
        public var revocation: Revocation?
        /// True for a refund the refund catch-up read in Apple's refund history: no notification
        /// said it, so its `refunded` names none.
        public var fromRefundHistory: Bool
        /// The subscription's renewal info the notification carried, verified.
        public var renewalInfo: RenewalInfo?

        public init(
            record: NotificationReceived, transaction: AppleTransaction?, revocation: Revocation?, fromRefundHistory: Bool = false,
            renewalInfo: RenewalInfo? = nil
        ) {
            self.record = record
            self.transaction = transaction
            self.revocation = revocation
            self.fromRefundHistory = fromRefundHistory
            self.renewalInfo = renewalInfo
        }
    }

    /// What the notification did.
    public struct Applied: Sendable, Equatable {
        /// False when this notification had been applied before (Apple retried it).
        public var appended: Bool
        /// The stream it was recorded on.
        public var streamId: StreamID
        /// The event type it appended there.
        public var type: String
    }

    public func apply(_ notification: Notification, metadata: Data) async throws -> Applied {
        // Another type's signed transaction that says Apple refunded or revoked it (signed after
        // the refund; Apple's notifications come in no promised order): the refund first, as one
        // read in Apple's refund history, so that no notification grants what Apple took back.
        let type = notification.record.notificationType
        if !notification.fromRefundHistory, let transaction = notification.transaction, let revocation = notification.revocation,
           !AppleTransactionRecord.isRefund(type), type != "REFUND_REVERSED" {
            _ = try await apply(Self.refundRead(transaction, revocation), metadata: Self.markedCaughtUp(metadata))
        }
        if let applied = try await applyInGroup(notification, metadata: metadata) { return applied }
        // The transaction's lock, then its order's: a client's proof takes them together, and
        // PostgreSQL may break a deadlock between the two here; the same notification delivered
        // twice at once stores its event once. Again from the start, where the winner is visible
        // (the event stored: `applied: false`).
        return try await database.transactionAgainAfterLostRace(lost: ReceiptLedger.lostRace) { tx in
            var eventID = EventID(notification.record.notificationUUID)
            if let stored = try await events.event(eventID, in: tx) {
                guard !notification.fromRefundHistory, Self.isBackendsOwn(stored) else {
                    return Applied(appended: false, streamId: stored.streamID, type: stored.type)
                }
                // A backend's own event took Apple's notificationUUID as its id, and keeps it: the
                // notification is recorded under an id named after its UUID, where Apple's retries
                // find it.
                eventID = EventID.named("apple-notification", notification.record.notificationUUID.uuidString.lowercased())
                if let stored = try await events.event(eventID, in: tx) {
                    return Applied(appended: false, streamId: stored.streamID, type: stored.type)
                }
            }
            let record = notification.record
            guard let transaction = notification.transaction else {
                // Nothing to tie it to: kept on a stream of its own.
                let stream = StreamID(unchecked: "notification-" + record.notificationUUID.uuidString.lowercased())
                let event = try EventCoding.newEvent(type: OrderEventType.notificationReceived.rawValue, record, id: eventID, metadata: metadata)
                _ = try await writer.append(LedgerWriter.Write(LedgerWriter.Append([event], to: stream)), in: tx)
                return Applied(appended: true, streamId: stream, type: OrderEventType.notificationReceived.rawValue)
            }
            let id = transaction.transactionId
            // With the lock of the order holding it, taken in one call as a client's proof takes the
            // two (one after the other, they deadlocked with a proof of the same transaction). An
            // order that took it after this read is locked later, and a deadlock then is a lost
            // race, run again.
            let holderOrder = try await writer.read(orders: [], transactions: [id], in: tx).transaction(id)?.orderId
            try await writer.lock([id.streamID] + (holderOrder.map { [$0.streamID] } ?? []), in: tx)
            // The same notification delivered twice at once: the one that waited for these locks
            // finds the other's event committed, and answers as a retry does.
            if let stored = try await events.event(eventID, in: tx) {
                return Applied(appended: false, streamId: stored.streamID, type: stored.type)
            }
            var known = try await writer.read(orders: [], transactions: [id], in: tx).transaction(id)
            let type = record.notificationType
            let revocation = notification.revocation ?? Revocation(date: record.signedDate)
            let role = try await self.role(of: transaction, in: tx)
            if let claimant = known?.orderId {
                // Held by an order, perhaps on its backend's own claim, unverified: Apple's word
                // decides. What Apple signed contradicts the claim, or Apple took the purchase back
                // before the order was verified (a refund not reversed already): taken back, then
                // taken in as if that claim had never been (a refund's transaction leaves the pool
                // with its refund, below).
                var refunded = AppleTransactionRecord.isRefund(type)
                if refunded {
                    refunded = try await !events.refundReversed(id.rawValue, revokedAt: revocation.date, on: [id.streamID, claimant.streamID], in: tx)
                }
                if try await receipts.takeBackClaim(of: transaction, holder: known, refund: refunded ? .notification(type) : nil, metadata: metadata, in: tx) {
                    if !refunded {
                        _ = try await receipts.apply(transaction, claim: .init(userId: nil, orderId: nil), metadata: metadata, in: tx)
                    }
                    known = try await writer.read(orders: [], transactions: [id], in: tx).transaction(id)
                }
            }
            if AppleTransactionRecord.isRefund(type), revocation.endsFamilyShare(of: transaction) {
                if let applied = try await revokeSharedSubscription(
                    notification, transaction, role: role, revocation: revocation, eventID: eventID, metadata: metadata, in: tx) {
                    return applied
                }
                return try await recordFamilyRevocation(
                    transaction, revocation, notification, known: known, eventID: eventID, metadata: metadata, in: tx)
            }
            if known != nil, let subscription = ReceiptLedger.purchasedSubscription(role) {
                // A subscription whose start an order holds but never started: started first, so
                // that what the notification says is recorded on it (the intake does it for a
                // transaction it takes in).
                try await receipts.startHeldSubscription(subscription, seen: transaction, metadata: metadata, in: tx)
            }
            if known == nil {
                // Unknown to the ledger: tied to its order by appAccountToken, or into the pool.
                _ = try await receipts.apply(transaction, claim: .init(userId: nil, orderId: nil), metadata: metadata, in: tx)
                known = try await writer.read(orders: [], transactions: [id], in: tx).transaction(id)
            }
            guard let holder = known else { throw OrderLedgerError.duplicateTransaction(id) }
            // A refund Apple reversed (its `REFUND_REVERSED` recorded first, signed after this
            // refund's revocation; or this refund recorded already, by the refund catch-up or
            // another notification, and reversed since): a retried or backfilled `REFUND` that
            // arrives late refunds nothing, and is recorded as the notification it is.
            var reversed = false
            if AppleTransactionRecord.isRefund(type) {
                let streams = [id.streamID] + (holder.orderId.map { [$0.streamID] } ?? []) + (role.subscription.map { [StreamID.subscription($0)] } ?? [])
                reversed = try await events.refundReversed(id.rawValue, revokedAt: revocation.date, on: streams, in: tx)
            }
            var told = record
            if reversed { told.reversedBefore = true }
            if !reversed, let applied = try await recordOnSubscription(
                notification, transaction, role: role, heldByOrder: holder.orderId != nil, revocation: revocation, eventID: eventID,
                metadata: metadata, in: tx) {
                return applied
            }
            if let orderID = holder.orderId {
                try await writer.lock([orderID.streamID], in: tx)
                let snapshot = try await writer.read(orders: [orderID], transactions: [], in: tx)
                if let order = snapshot.order(orderID) {
                    var event = OrderEvent.notificationReceived(told)
                    var marked = metadata
                    var standing: Refunded?
                    if told.takesBack, OrderTransitions.isAllowed(.refunded, from: order.state) {
                        event = .refunded(Refunded(revocation, notificationType: notification.fromRefundHistory ? nil : type))
                    } else if told.takesBack {
                        // A refund the order's state does not take (refunded already): kept with
                        // the notification, for a reversal of the earlier refund arriving after it.
                        var kept = told
                        kept.refund = Refunded(revocation, notificationType: notification.fromRefundHistory ? nil : type)
                        event = .notificationReceived(kept)
                    } else if type == "REFUND_REVERSED", OrderTransitions.isAllowed(.refundReversed, from: order.state) {
                        event = .refundReversed
                        marked = Self.reversalMarked(metadata, signedDate: record.signedDate, transactionId: id)
                        standing = try await laterRefund(of: id, after: record.signedDate, on: [orderID.streamID, id.streamID], in: tx)
                    }
                    var events = [(event, eventID)]
                    // Apple refunded again after this reversal, and that refund arrived first
                    // (Apple's notifications come in no promised order): it stands, taken again.
                    if let standing { events.append((.refunded(standing), EventID.named("refund-after-reversal", eventID.uuid.uuidString.lowercased()))) }
                    _ = try await receipts.append(events, to: order, metadata: marked, in: tx, knowing: snapshot)
                    return Applied(appended: true, streamId: orderID.streamID, type: event.type.rawValue)
                }
            }
            // Waiting in the pool: recorded on its stream, where a refund keeps it from being granted.
            // A refund keeps what Apple signed of it: a renewal waiting for its subscription's start
            // has its period refunded with it when the start ties it (`recordStart`).
            var received = told
            if told.takesBack {
                received.refund = Refunded(revocation, notificationType: notification.fromRefundHistory ? nil : type)
            }
            if role.subscription != nil, Self.lifecycleTypes.contains(type) {
                // A renewal waiting for its start, or a start held for support before its
                // subscription started: what Apple said of renewal is recorded on the subscription
                // when the start starts it (`recordStart`).
                received.renewalInfo = notification.renewalInfo
                received.periodEnd = transaction.periodEnd
            }
            var events = [try EventCoding.newEvent(TransactionEvent.notificationReceived(received), id: eventID, metadata: metadata)]
            if type == "REFUND_REVERSED", let standing = try await laterRefund(of: id, after: record.signedDate, on: [id.streamID], in: tx) {
                // A refund Apple made after this reversal, which arrived first: it stands, and keeps
                // the transaction from being granted, told again after the reversal.
                var again = NotificationReceived(
                    notificationUUID: EventID.named("refund-after-reversal", eventID.uuid.uuidString.lowercased()).uuid, notificationType: "REFUND",
                    subtype: nil, transactionId: id, signedDate: record.signedDate)
                again.refund = standing
                events.append(try EventCoding.newEvent(TransactionEvent.notificationReceived(again), id: EventID(again.notificationUUID), metadata: metadata))
            }
            _ = try await writer.append(LedgerWriter.Write(LedgerWriter.Append(events, to: id.streamID)), in: tx)
            return Applied(appended: true, streamId: id.streamID, type: TransactionEventType.notificationReceived.rawValue)
        }
    }
}

extension NotificationLedger {
    /// The refund of `id` revoked after `date` that `streams` hold (the latest), as Apple signed it.
    func laterRefund(of id: TransactionID, after date: Date, on streams: [StreamID], in tx: DatabaseTransaction) async throws -> Refunded? {
        guard let body = try await events.refund(of: id.rawValue, revokedAfter: date, on: streams, in: tx) else { return nil }
        return try EventCoding.decoder.decode(Refunded.self, from: body)
    }

    /// `metadata` of an order's `refund-reversed` written for Apple's `REFUND_REVERSED`, marked with
    /// the transaction and when Apple signed the reversal (the event has no body): a refund revoked
    /// before it that arrives late refunds nothing (`EventStore.refundReversed`), whatever date the
    /// refund it reversed was recorded with (a backend's own `refunded`, to the second, say).
    static func reversalMarked(_ metadata: Data, signedDate: Date, transactionId: TransactionID) -> Data {
        marked(metadata, with: ["reversalSignedDate": EventCoding.formatDate(signedDate), "transactionId": transactionId.rawValue])
    }

    /// `metadata` (a JSON object) with `marks` added.
    static func marked(_ metadata: Data, with marks: [String: Any]) -> Data {
        var object = (try? JSONSerialization.jsonObject(with: metadata)) as? [String: Any] ?? [:]
        object.merge(marks) { _, mark in mark }
        return (try? JSONSerialization.data(withJSONObject: object)) ?? metadata
    }

    /// Whether `stored`, found under a notification's UUID, is a backend's own event rather than
    /// the notification applied before: one a backend may append, on an order's stream, that no
    /// notification path wrote (those mark their events with the notification's type or the
    /// backfill that read them). A backend's `refunded` or `refund-reversed` under that id is the
    /// notification's own fact, forwarded: the notification counts as applied.
    static func isBackendsOwn(_ stored: RecordedEvent) -> Bool {
        guard stored.streamID.isOrder, let type = OrderEventType(rawValue: stored.type), type.isWrittenByClients,
              type != .refunded, type != .refundReversed else { return false }
        struct Marks: Decodable {
            let notificationType: String?
            let appendedBy: String?
        }
        guard let marks = try? JSONDecoder().decode(Marks.self, from: stored.metadata) else { return false }
        if marks.notificationType != nil { return false }
        if let by = marks.appendedBy, by == NotificationBackfill.appendedBy || by.hasPrefix("ledger backfill notifications") { return false }
        return true
    }

    /// A verified notification applied, whether it arrived or came from Apple's history.
    public func apply(_ notification: VerifiedNotification, metadata: Data) async throws -> Applied {
        let record = NotificationReceived(
            notificationUUID: notification.notificationUUID, notificationType: notification.notificationType,
            subtype: notification.subtype, transactionId: notification.transaction?.transactionId, signedDate: notification.signedDate,
            consumptionRequestReason: notification.consumptionRequestReason,
            environment: notification.transaction.map(\.environment) ?? notification.environment,
            bundleId: notification.transaction == nil ? notification.bundleId : nil)
        return try await apply(
            .init(record: record, transaction: notification.transaction, revocation: notification.revocation,
                  renewalInfo: notification.renewalInfo),
            metadata: metadata)
    }

    /// Apple ended a family member's shared access: `family-share-revoked` on the transaction's
    /// own stream, never `refunded` on an order, so no order changes and no money moves. A
    /// transaction the ledger did not know enters the pool with it and is never granted; it is not
    /// tied to an order, which a shared purchase never pays.
    private func recordFamilyRevocation(
        _ transaction: AppleTransaction, _ revocation: Revocation, _ notification: Notification, known: AppleTransactionRecord?,
        eventID: EventID, metadata: Data, in tx: DatabaseTransaction
    ) async throws -> Applied {
        let record = notification.record
        let body = FamilyShareRevoked(
            transactionId: transaction.transactionId, orderId: known?.orderId, inAppOwnershipType: transaction.inAppOwnershipType,
            revocation: revocation, notificationType: notification.fromRefundHistory ? nil : record.notificationType,
            notificationUUID: notification.fromRefundHistory ? nil : record.notificationUUID)
        var events: [NewEvent] = []
        if known == nil {
            events += try ReceiptLedger.poolAppend(transaction, userId: nil, claimedOrder: nil, reason: AppleTransactionRecord.familyShareRevokedReason, metadata: metadata).events
        }
        events.append(try EventCoding.newEvent(TransactionEvent.familyShareRevoked(body), id: eventID, metadata: metadata))
        let stream = transaction.transactionId.streamID
        _ = try await writer.append(LedgerWriter.Write(LedgerWriter.Append(events, to: stream)), in: tx)
        return Applied(appended: true, streamId: stream, type: TransactionEventType.familyShareRevoked.rawValue)
    }
}

extension NotificationLedger {
    /// A refund Apple signed that no notification said: read in Apple's refund history, or seen
    /// in a client's proof. Applied as a `REFUND` notification would be; its event's id is named
    /// by the transaction and the refund's `revocationDate`, so one refund is applied once however
    /// often, and by whichever way, it arrives, and a refund Apple made again after reversing the
    /// first is another.
    public static func refundRead(_ transaction: AppleTransaction, _ revocation: Revocation) -> Notification {
        let name = EventID.named("refund-history", transaction.transactionId.rawValue, String(revocation.date.millisecondsSince1970))
        let record = NotificationReceived(
            notificationUUID: name.uuid, notificationType: "REFUND",
            subtype: nil, transactionId: transaction.transactionId, signedDate: revocation.date)
        return Notification(record: record, transaction: transaction, revocation: revocation, fromRefundHistory: true)
    }

    /// `metadata` marked `refundCatchUp`, so that the report counts the refunds no notification
    /// said (`refundsCaughtUp`).
    public static func markedCaughtUp(_ metadata: Data) -> Data {
        marked(metadata, with: ["refundCatchUp": true])
    }

    /// A refund or revocation Apple signed in a client's proof (a signed transaction's
    /// `revocationDate`, a legacy receipt's `cancellation_date_ms`) of a transaction the ledger
    /// holds, an order's or pooled, and has not recorded refunded: applied as the refund catch-up
    /// applies one it reads (the order `refunded`, the pooled transaction kept from being
    /// granted). One the ledger does not hold stays out, as the proof itself does. True when it
    /// was applied now.
    public func applyRefundSeen(_ transaction: AppleTransaction, _ revocation: Revocation, metadata: Data) async throws -> Bool {
        let id = transaction.transactionId
        let pool = TransactionPool(database: database)
        // A row the ledger holds (of an app, or of none) has a key here.
        guard try await pool.apps(of: [id])[id] != nil, try await !pool.refundsRecorded([id]).contains(id) else { return false }
        return try await apply(Self.refundRead(transaction, revocation), metadata: Self.markedCaughtUp(metadata)).appended
    }
}
