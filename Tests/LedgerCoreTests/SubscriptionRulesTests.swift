import Foundation
import LedgerCore
import Testing

@Suite("A subscription's rules: Subscription.evolve and status(at:)")
struct SubscriptionRulesTests {
    let start = Date(timeIntervalSince1970: 1_800_000_000)
    let month: TimeInterval = 30 * 86_400
    let otid = "7000001"

    /// The transaction of period `n` (0: the purchase that started it), a month each.
    func transaction(_ n: Int, expires: Date? = nil) -> AppleTransaction {
        AppleTransaction(
            transactionId: TransactionID(unchecked: n == 0 ? otid : "\(otid)-\(n)"), originalTransactionId: otid,
            productId: ProductID(unchecked: "pro.monthly"), purchaseDate: start.addingTimeInterval(Double(n) * month),
            environment: "Sandbox", bundleId: "com.example", price: "4.99", currency: "USD", format: .jws,
            receiptSha256: String(repeating: "a", count: 64), type: "Auto-Renewable Subscription",
            expiresDate: expires ?? start.addingTimeInterval(Double(n + 1) * month), webOrderLineItemId: "w-\(n)",
            transactionReason: n == 0 ? "PURCHASE" : "RENEWAL", subscriptionGroupIdentifier: "g-1")
    }

    func notified(_ type: String, _ subtype: String? = nil, period: Int, info: RenewalInfo? = nil, expires: Date? = nil) -> SubscriptionEvent {
        .renewalChanged(SubscriptionRenewalChanged(
            notification: NotificationReceived(
                notificationUUID: UUID(), notificationType: type, subtype: subtype, transactionId: transaction(period).transactionId,
                signedDate: start),
            renewalInfo: info, expiresDate: expires ?? transaction(period).expiresDate))
    }

    func refund(_ period: Int) -> SubscriptionEvent {
        .periodRefunded(SubscriptionPeriodRefunded(
            transactionId: transaction(period).transactionId, periodKey: "w-\(period)", revocation: Revocation(date: start.addingTimeInterval(2 * month)),
            notificationType: "REFUND", notificationUUID: UUID()))
    }

    /// The subscription the events leave, folded as the log would.
    func fold(_ events: [SubscriptionEvent]) -> Subscription? {
        var state: Subscription?
        for (index, event) in events.enumerated() {
            state = Subscription.evolve(state, event, version: Int64(index), at: start.addingTimeInterval(Double(index)))
        }
        return state
    }

    var started: [SubscriptionEvent] {
        [.started(SubscriptionStarted(originalTransactionId: otid, transaction: transaction(0), userId: UserID(unchecked: "u-1"), familyShared: false)),
         .period(SubscriptionPeriodRecorded(transaction: transaction(0), kind: .start))]
    }

    func renewal(_ n: Int) -> SubscriptionEvent { .period(SubscriptionPeriodRecorded(transaction: transaction(n), kind: .renewal)) }

    @Test("Apple's status 1 ends a revocation or an expiry signed before it, never one after it")
    func activeStatusAgainstNewerNews() throws {
        func status(_ code: Int, signed: Date) -> SubscriptionEvent {
            .renewalChanged(SubscriptionRenewalChanged(
                notification: nil, appleStatus: code, renewalInfo: RenewalInfo(autoRenew: true, signedDate: signed),
                expiresDate: transaction(0).expiresDate, purchaseDate: transaction(0).purchaseDate))
        }
        let now = start.addingTimeInterval(86_400)
        let revoked = SubscriptionEvent.familyShareRevoked(SubscriptionFamilyShareRevoked(
            transactionId: transaction(0).transactionId, revocationDate: start.addingTimeInterval(2 * 3600), notificationUUID: UUID()))
        // Read before the revocation, written after it: the revocation stands.
        let stale = try #require(fold(started + [revoked, status(1, signed: start.addingTimeInterval(3600))]))
        #expect(stale.status(at: now) == .revoked)
        // Signed after it: active.
        let later = try #require(fold(started + [revoked, status(1, signed: start.addingTimeInterval(3 * 3600))]))
        #expect(later.status(at: now) == .active)
        // Apple's status 5, then 1 signed later: active again.
        let back = try #require(fold(started + [status(5, signed: start.addingTimeInterval(3600)), status(1, signed: start.addingTimeInterval(3 * 3600))]))
        #expect(back.status(at: now) == .active)
        // EXPIRED with renewal info signed after the status Apple answered: expired.
        let expired = SubscriptionEvent.renewalChanged(SubscriptionRenewalChanged(
            notification: NotificationReceived(
                notificationUUID: UUID(), notificationType: "EXPIRED", subtype: "VOLUNTARY", transactionId: transaction(0).transactionId, signedDate: start),
            renewalInfo: RenewalInfo(autoRenew: false, signedDate: start.addingTimeInterval(2 * 3600)), expiresDate: transaction(0).expiresDate))
        let ended = try #require(fold(started + [expired, status(1, signed: start.addingTimeInterval(3600))]))
        #expect(ended.status(at: now) == .expired)
    }

    @Test("a family member's share revoked, then a period bought before that told late: still revoked; a refund's revocation ends with a later period")
    func latePeriodAfterRevocation() throws {
        let revoked = SubscriptionEvent.familyShareRevoked(SubscriptionFamilyShareRevoked(
            transactionId: transaction(0).transactionId, revocationDate: start.addingTimeInterval(1.5 * month), notificationUUID: UUID()))
        let late = try #require(fold(started + [revoked, renewal(1)]))
        #expect(late.periods.count == 2 && late.status(at: start.addingTimeInterval(1.6 * month)) == .revoked, "\(late)")
        // Shared again later: a period bought after the revocation lifts it.
        let again = try #require(fold(started + [revoked, renewal(1), renewal(2)]))
        #expect(again.status(at: start.addingTimeInterval(2.1 * month)) == .active)
        // The latest period known refunded (at two months), then the next one, bought before that refund, arrives: active.
        let refundedThenLater = try #require(fold(started + [refund(0), renewal(1)]))
        #expect(refundedThenLater.status(at: start.addingTimeInterval(1.6 * month)) == .active, "\(refundedThenLater)")
    }

    @Test("a billing retry whose EXPIRED never arrives ends 60 days after the period's end")
    func billingRetryEnds() throws {
        let failed = try #require(fold(started + [notified("DID_FAIL_TO_RENEW", period: 0, info: RenewalInfo(autoRenew: true, isInBillingRetryPeriod: true))]))
        let end = try #require(failed.expiresAt)
        #expect(failed.status(at: end.addingTimeInterval(-1)) == .active)
        #expect(failed.status(at: end.addingTimeInterval(59 * 86_400)) == .billingRetry)
        #expect(failed.status(at: end.addingTimeInterval(60 * 86_400)) == .expired)
    }

    @Test("a failure in the grace period, its end, then the recovery: grace-period, billing-retry, active")
    func graceThenRecovery() throws {
        let end = transaction(0).expiresDate!
        let grace = end.addingTimeInterval(16 * 86_400)
        let inGrace = try #require(fold(started + [notified(
            "DID_FAIL_TO_RENEW", "GRACE_PERIOD", period: 0, info: RenewalInfo(autoRenew: true, gracePeriodExpiresDate: grace, isInBillingRetryPeriod: true))]))
        #expect(inGrace.status(at: end.addingTimeInterval(86_400)) == .gracePeriod)
        let graceOver = try #require(fold(started + [
            notified("DID_FAIL_TO_RENEW", "GRACE_PERIOD", period: 0, info: RenewalInfo(gracePeriodExpiresDate: grace, isInBillingRetryPeriod: true)),
            notified("GRACE_PERIOD_EXPIRED", period: 0, info: RenewalInfo(isInBillingRetryPeriod: true)),
        ]))
        #expect(graceOver.status(at: end.addingTimeInterval(86_400)) == .billingRetry)
        let recovered = try #require(fold(started + [
            notified("DID_FAIL_TO_RENEW", "GRACE_PERIOD", period: 0, info: RenewalInfo(gracePeriodExpiresDate: grace, isInBillingRetryPeriod: true)),
            renewal(1), notified("DID_RENEW", "BILLING_RECOVERY", period: 1, info: RenewalInfo(autoRenew: true, isInBillingRetryPeriod: false)),
        ]))
        #expect(recovered.status(at: end.addingTimeInterval(86_400)) == .active)
        #expect(recovered.periods.count == 2 && recovered.gracePeriodExpiresAt == nil && !recovered.inBillingRetry)
    }

    @Test("a notification about an earlier period, arriving after a later period, changes nothing")
    func staleNotification() throws {
        let renewed = try #require(fold(started + [renewal(1)]))
        let late = try #require(fold(started + [renewal(1), notified("EXPIRED", "VOLUNTARY", period: 0, info: RenewalInfo(autoRenew: false, expirationIntent: 1))]))
        #expect(late.status(at: start.addingTimeInterval(1.5 * month)) == .active)
        #expect(late.expired == false && late.autoRenew == renewed.autoRenew && late.expirationIntent == nil)
        let failedLate = try #require(fold(started + [renewal(1), notified("DID_FAIL_TO_RENEW", period: 0, info: RenewalInfo(isInBillingRetryPeriod: true))]))
        #expect(failedLate.inBillingRetry == false)
    }

    @Test("a DID_FAIL_TO_RENEW after Apple's EXPIRED starts no billing retry, whatever its renewal info says")
    func failureAfterExpired() throws {
        let expired = notified("EXPIRED", "BILLING_RETRY", period: 0, info: RenewalInfo(autoRenew: false, isInBillingRetryPeriod: false, signedDate: start))
        let failed = notified("DID_FAIL_TO_RENEW", period: 0, info: RenewalInfo(isInBillingRetryPeriod: true, signedDate: start.addingTimeInterval(60)))
        let state = try #require(fold(started + [expired, failed]))
        #expect(state.expired && !state.inBillingRetry)
        #expect(state.status(at: transaction(0).expiresDate!.addingTimeInterval(86_400)) == .expired)
    }

    @Test("a late notification about the period an upgrade replaced (signed before it, so not marked upgraded) moves nothing back")
    func lateNotificationAboutAReplacedPeriod() {
        // A yearly start, then an upgrade to monthly ten days in: the monthly period ends first.
        var yearly = transaction(0, expires: start.addingTimeInterval(365 * 86_400))
        yearly.productId = ProductID(unchecked: "pro.yearly")
        var monthly = transaction(0, expires: start.addingTimeInterval(40 * 86_400))
        monthly.transactionId = TransactionID(unchecked: "t-upgrade")
        monthly.purchaseDate = start.addingTimeInterval(10 * 86_400)
        monthly.webOrderLineItemId = "w-upgrade"
        let late = SubscriptionEvent.renewalChanged(SubscriptionRenewalChanged(
            notification: NotificationReceived(
                notificationUUID: UUID(), notificationType: "DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_ENABLED",
                transactionId: yearly.transactionId, signedDate: start),
            renewalInfo: nil, expiresDate: yearly.expiresDate, purchaseDate: yearly.purchaseDate))
        let expired = notified("EXPIRED", "VOLUNTARY", period: 0, expires: monthly.expiresDate)
        let state = fold([
            .started(SubscriptionStarted(originalTransactionId: otid, transaction: yearly, userId: UserID(unchecked: "u"), familyShared: false)),
            .period(SubscriptionPeriodRecorded(transaction: yearly, kind: .start)),
            .period(SubscriptionPeriodRecorded(transaction: monthly, kind: .renewal)),
            expired, late,
        ])
        #expect(state?.expiresAt == monthly.expiresDate && state?.expired == true && state?.productId.rawValue == "pro.monthly", "\(String(describing: state))")
    }

    @Test("a DID_FAIL_TO_RENEW arriving after the EXPIRED that Apple signed later starts no billing retry, with or without its renewal info")
    func failureAfterExpiry() throws {
        let failedAt = start.addingTimeInterval(month), expiredAt = start.addingTimeInterval(1.1 * month)
        let expired = notified("EXPIRED", "BILLING_RETRY", period: 0, info: RenewalInfo(autoRenew: false, expirationIntent: 2, isInBillingRetryPeriod: false, signedDate: expiredAt))
        for info in [RenewalInfo(autoRenew: true, isInBillingRetryPeriod: true, signedDate: failedAt), nil] {
            let late = try #require(fold(started + [expired, notified("DID_FAIL_TO_RENEW", period: 0, info: info)]))
            #expect(late.status(at: start.addingTimeInterval(1.2 * month)) == .expired && !late.inBillingRetry && late.autoRenew == false,
                    "\(late)")
        }
        let inOrder = try #require(fold(started + [notified("DID_FAIL_TO_RENEW", period: 0, info: RenewalInfo(autoRenew: true, isInBillingRetryPeriod: true, signedDate: failedAt))]))
        #expect(inOrder.status(at: start.addingTimeInterval(1.05 * month)) == .billingRetry && inOrder.inBillingRetry)
    }

    @Test("EXPIRED ends the subscription at once; a resubscription whose period the ledger lacks brings it back")
    func expiredThenResubscribed() throws {
        let expired = try #require(fold(started + [notified("EXPIRED", "VOLUNTARY", period: 0, info: RenewalInfo(autoRenew: false, expirationIntent: 1))]))
        #expect(expired.status(at: start.addingTimeInterval(0.5 * month)) == .expired && expired.expirationIntent == 1)
        let back = try #require(fold(started + [
            notified("EXPIRED", "VOLUNTARY", period: 0, info: RenewalInfo(autoRenew: false, expirationIntent: 1)),
            notified("SUBSCRIBED", "RESUBSCRIBE", period: 3, info: RenewalInfo(autoRenew: true)),
        ]))
        #expect(back.status(at: start.addingTimeInterval(3.5 * month)) == .active && back.autoRenew == true)
        #expect(back.expirationIntent == nil, "Apple's reason for the expiry is gone with it")
        // A billing recovery's new period clears it too, whatever renewal info came with it.
        let recovered = try #require(fold(started + [
            notified("EXPIRED", "BILLING_RETRY", period: 0, info: RenewalInfo(autoRenew: false, expirationIntent: 2)), renewal(1),
        ]))
        #expect(recovered.status(at: start.addingTimeInterval(1.5 * month)) == .active && recovered.expirationIntent == nil)
    }

    @Test("a refund of one period takes back that period only; the latest one's ends the service, even past its own end")
    func periodRefunds() throws {
        let earlier = try #require(fold(started + [renewal(1), refund(0)]))
        #expect(earlier.periods.map { $0.refundedAt != nil } == [true, false])
        #expect(earlier.status(at: start.addingTimeInterval(1.5 * month)) == .active)
        let extended = start.addingTimeInterval(2.5 * month)
        let latest = try #require(fold(started + [renewal(1), notified("RENEWAL_EXTENDED", period: 1, expires: extended), refund(1)]))
        #expect(latest.expiresAt == extended)
        #expect(latest.status(at: start.addingTimeInterval(1.5 * month)) == .revoked)
        let reversed = try #require(fold(started + [
            renewal(1), notified("RENEWAL_EXTENDED", period: 1, expires: extended), refund(1),
            .periodRefundReversed(SubscriptionPeriodRefundReversed(transactionId: transaction(1).transactionId, periodKey: "w-1", notificationUUID: nil)),
        ]))
        #expect(reversed.status(at: start.addingTimeInterval(1.5 * month)) == .active && reversed.periods[1].refundedAt == nil)
    }

    @Test("auto-renew follows DID_CHANGE_RENEWAL_STATUS, from the renewal info or else the subtype")
    func autoRenewStatus() throws {
        let off = try #require(fold(started + [notified("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED", period: 0)]))
        #expect(off.autoRenew == false && off.status(at: start) == .active)
        let on = try #require(fold(started + [
            notified("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED", period: 0),
            notified("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_ENABLED", period: 0, info: RenewalInfo(autoRenew: true, autoRenewProductId: "pro.monthly")),
        ]))
        #expect(on.autoRenew == true && on.autoRenewProductId == "pro.monthly")
    }
}
