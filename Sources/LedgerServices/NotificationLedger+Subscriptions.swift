import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore

/// The lifecycle of an auto-renewable subscription from Apple's notifications (issue 40): what a
/// notification about a subscription's transaction records on the subscription's stream, in the
/// transaction `apply` holds, with the notification's UUID as the event's id.
extension NotificationLedger {
    /// The notification types that say something of a subscription's renewal; each becomes
    /// `subscription-renewal-changed` on the subscription, with the renewal info Apple signed.
    public static let lifecycleTypes: Set<String> = [
        "SUBSCRIBED", "DID_RENEW", "OFFER_REDEEMED", "DID_CHANGE_RENEWAL_STATUS", "DID_CHANGE_RENEWAL_PREF", "DID_FAIL_TO_RENEW",
        "GRACE_PERIOD_EXPIRED", "EXPIRED", "RENEWAL_EXTENDED", "PRICE_INCREASE",
    ]

    /// What `transaction` is to the ledger, in the caller's transaction, by the intake's rule (the
    /// catalog's type first), so a notification and an upload of one transaction agree.
    func role(of transaction: AppleTransaction, in tx: DatabaseTransaction) async throws -> TransactionRole {
        try await receipts.role(of: transaction, in: tx).0
    }

    /// Records what the notification says on the subscription of its transaction (`role`), which
    /// the ledger holds (`holder`): the transaction's period (once per billing period, as every
    /// way in records it), then
    /// - a lifecycle type (`lifecycleTypes`): `subscription-renewal-changed`;
    /// - `REFUND` or `REVOKE`: `subscription-period-refunded` of that period alone;
    /// - `REFUND_REVERSED`: `subscription-period-refund-reversed`.
    /// Nil when the rest of `apply` goes on as before: the transaction is no subscription's, the
    /// subscription is not known yet (the notification is then recorded on the transaction's or
    /// order's stream as before, and the catch-up fills the subscription in), the type says
    /// nothing of it, or the transaction started the subscription (it pays an order, or waits in
    /// the pool for one), or an order holds it (`heldByOrder`: a renewal a backend claimed and
    /// verified for an order of its own): its refund (or the reversal) follows on the order's or the
    /// transaction's stream under the notification's UUID.
    func recordOnSubscription(
        _ notification: Notification, _ transaction: AppleTransaction, role: TransactionRole, heldByOrder: Bool, revocation: Revocation,
        eventID: EventID, metadata: Data, in tx: DatabaseTransaction
    ) async throws -> Applied? {
        guard let id = role.subscription else { return nil }
        let record = notification.record
        let type = record.notificationType
        let uuid = notification.fromRefundHistory ? nil : record.notificationUUID
        let periodKey = transaction.webOrderLineItemId ?? transaction.transactionId.rawValue
        let event: SubscriptionEvent
        if AppleTransactionRecord.isRefund(type) {
            event = .periodRefunded(SubscriptionPeriodRefunded(
                transactionId: transaction.transactionId, periodKey: periodKey, revocation: revocation,
                notificationType: notification.fromRefundHistory ? nil : type, notificationUUID: uuid))
        } else if type == "REFUND_REVERSED" {
            event = .periodRefundReversed(SubscriptionPeriodRefundReversed(
                transactionId: transaction.transactionId, periodKey: periodKey, notificationUUID: uuid, signedDate: record.signedDate))
        } else if Self.lifecycleTypes.contains(type) {
            event = .renewalChanged(SubscriptionRenewalChanged(
                notification: record, renewalInfo: notification.renewalInfo, expiresDate: transaction.periodEnd,
                purchaseDate: transaction.purchaseDate))
        } else {
            return nil
        }
        // The refund of the start, or of a period an order holds (or its reversal), is that order's
        // or pool entry's too, whose event takes the notification's UUID: the subscription's is
        // named after it.
        let orderToo = (role.paysOrder || heldByOrder) && event.type != .renewalChanged
        let ownID = orderToo ? SubscriptionLedger.notificationEventID(id, eventID.uuid) : eventID
        let kind: SubscriptionPeriodKind = transaction.transactionId.rawValue == id ? .start : .renewal
        let period = SubscriptionEvent.period(SubscriptionPeriodRecorded(transaction: transaction, kind: kind))
        // The same refund of the period recorded already, by another way (a client's proof, the
        // refund catch-up, then Apple's REFUND): a period is refunded once.
        var events = [(period, SubscriptionLedger.periodEventID(id, transaction))]
        let again = event.type == .periodRefunded
            ? try await self.events.periodRefundStands(id, periodKey: periodKey, revokedAt: revocation.date, in: tx) : false
        if !again { events.append((event, ownID)) }
        // A reversal of an earlier refund, after a refund Apple made later that arrived first: that
        // refund stands, told again after the reversal (as an order's, NotificationLedger.apply).
        if event.type == .periodRefundReversed,
           let body = try await self.events.periodRefund(id, periodKey: periodKey, revokedAfter: record.signedDate, in: tx) {
            var standing = try EventCoding.decoder.decode(SubscriptionPeriodRefunded.self, from: body)
            standing.notificationUUID = nil
            events.append((.periodRefunded(standing), EventID.named("refund-after-reversal", ownID.uuid.uuidString.lowercased())))
        }
        let recorded = try await subscriptions.record(events, on: id, metadata: metadata, in: tx)
        if again, !orderToo, recorded.subscription != nil {
            return Applied(appended: false, streamId: .subscription(id), type: event.type.rawValue)
        }
        guard recorded.subscription != nil, !orderToo else { return nil }
        return Applied(appended: true, streamId: .subscription(id), type: event.type.rawValue)
    }

    /// A family member's shared subscription ended (`REVOKE`, `FAMILY_REVOKE`): the transaction's
    /// period (so that its `DID_RENEW` arriving later is no news), then
    /// `subscription-family-share-revoked` on the member's subscription, which ends the member's
    /// access alone; the purchaser's subscription and order are untouched. Nil when the
    /// transaction is no shared subscription's, or the ledger does not know the member's
    /// subscription: `family-share-revoked` on the transaction's stream then, as for a shared
    /// non-consumable.
    func revokeSharedSubscription(
        _ notification: Notification, _ transaction: AppleTransaction, role: TransactionRole, revocation: Revocation,
        eventID: EventID, metadata: Data, in tx: DatabaseTransaction
    ) async throws -> Applied? {
        guard case .familyShared(let shared) = role, let id = shared else { return nil }
        let event = SubscriptionEvent.familyShareRevoked(SubscriptionFamilyShareRevoked(
            transactionId: transaction.transactionId, revocationDate: revocation.date,
            notificationUUID: notification.fromRefundHistory ? nil : notification.record.notificationUUID))
        let kind: SubscriptionPeriodKind = transaction.transactionId.rawValue == id ? .start : .renewal
        let period = SubscriptionEvent.period(SubscriptionPeriodRecorded(transaction: transaction, kind: kind))
        let recorded = try await subscriptions.record(
            [(period, SubscriptionLedger.periodEventID(id, transaction)), (event, eventID)], on: id, metadata: metadata, in: tx)
        guard recorded.subscription != nil else { return nil }
        return Applied(appended: true, streamId: .subscription(id), type: event.type.rawValue)
    }
}
