import AppleReceipts
import Foundation
import LedgerCore
import LedgerJSON
import LedgerServer
import LedgerServices
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// A subscription's transactions as verification gives them, and their recording as the intake
/// and the notifications record them (named ids: what they recorded already is skipped).
struct SubscriptionFixture {
    static let day: TimeInterval = 86_400
    static let start = Date(timeIntervalSince1970: 1_765_360_800)  // 2025-12-10T10:00:00Z

    /// The signed transaction of period `index` (0: the start) of subscription `original`.
    static func signed(
        _ original: String, period index: Int, product: String = "pro.monthly", price: Int64 = 9_990, currency: String = "USD",
        environment: String = "Production", familyShared: Bool = false
    ) -> SignedTransactionPayload {
        let id = index == 0 ? original : "\(original)-r\(index)"
        var payload = TestApple.transaction(
            id, product: product, environment: environment, purchaseDate: start.addingTimeInterval(Double(index) * 31 * day))
        payload.originalTransactionId = original
        payload.type = "Auto-Renewable Subscription"
        payload.expiresDate = start.addingTimeInterval(Double(index + 1) * 31 * day).millisecondsSince1970
        payload.webOrderLineItemId = "\(original)-line-\(index)"
        payload.transactionReason = index == 0 ? "PURCHASE" : "RENEWAL"
        payload.subscriptionGroupIdentifier = "group-1"
        payload.price = price
        payload.currency = currency
        if familyShared { payload.inAppOwnershipType = "FAMILY_SHARED" }
        return payload
    }

    /// `payload` as the verifier hands it over.
    static func transaction(_ payload: SignedTransactionPayload) -> AppleTransaction {
        AppleTransaction(
            transactionId: TransactionID(unchecked: payload.transactionId), originalTransactionId: payload.originalTransactionId,
            productId: ProductID(unchecked: payload.productId), purchaseDate: Date(millisecondsSince1970: payload.purchaseDate),
            environment: payload.environment, bundleId: payload.bundleId, inAppOwnershipType: payload.inAppOwnershipType,
            price: payload.price.map { "\(Decimal($0) / 1000)" }, currency: payload.currency, format: .jws,
            receiptSha256: String(repeating: "cd", count: 32), type: payload.type,
            expiresDate: payload.expiresDate.map(Date.init(millisecondsSince1970:)), webOrderLineItemId: payload.webOrderLineItemId,
            transactionReason: payload.transactionReason, subscriptionGroupIdentifier: payload.subscriptionGroupIdentifier)
    }

    /// Records subscription `original`'s start and the periods `payloads` (the first the start).
    static func record(_ services: ServiceAssembly, _ payloads: [SignedTransactionPayload], user: String, familyShared: Bool = false) async throws {
        let original = payloads[0].originalTransactionId ?? payloads[0].transactionId
        var events: [(SubscriptionEvent, EventID)] = [(
            .started(SubscriptionStarted(
                originalTransactionId: original, transaction: transaction(payloads[0]), userId: UserID(unchecked: user), familyShared: familyShared)),
            SubscriptionLedger.startedEventID(original))]
        for (index, payload) in payloads.enumerated() {
            let t = transaction(payload)
            events.append((.period(SubscriptionPeriodRecorded(transaction: t, kind: index == 0 ? .start : .renewal)), SubscriptionLedger.periodEventID(original, t)))
        }
        try await services.database.transaction { tx in
            _ = try await services.subscriptions.record(events, on: original, metadata: Data("{}".utf8), in: tx)
        }
    }

    /// Order `order` of `user` for `renewal`, which its backend claims and verifies itself (its own
    /// `receipt-received` and `verified`, in `environment`, `storefront` when given): a renewal an
    /// order holds.
    static func heldByOwnOrder(
        _ http: LedgerHTTP, _ order: String, user: String, renewal: SignedTransactionPayload, environment: String = "Production",
        storefront: String? = nil
    ) async throws {
        try await http.send(.post, "/v1/orders", json: ["orderId": order, "userId": user, "productId": renewal.productId, "price": "9.99", "currency": "USD"])
        var own = receipt(renewal.transactionId, product: renewal.productId)
        own["purchaseDate"] = EventCoding.formatDate(Date(millisecondsSince1970: renewal.purchaseDate))
        if let storefront { own["storefront"] = storefront }
        #expect(try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "receipt-received", "data": own]).0 == .created)
        #expect(try await http.send(.post, "/v1/orders/\(order)/events", json: [
            "type": "verified", "data": ["transactionId": renewal.transactionId, "environment": environment]]).0 == .created)
    }

    /// Records Apple's refund of one period (`percentage`: a prorated one's share, in thousandths).
    static func refund(_ services: ServiceAssembly, _ payload: SignedTransactionPayload, percentage: Int? = nil) async throws {
        let original = payload.originalTransactionId ?? payload.transactionId
        let t = transaction(payload)
        let refunded = SubscriptionPeriodRefunded(
            transactionId: t.transactionId, periodKey: payload.webOrderLineItemId ?? payload.transactionId,
            revocation: Revocation(date: Date(), reason: 0, type: percentage == nil ? .refundFull : .refundProrated, percentage: percentage),
            notificationType: "REFUND", notificationUUID: UUID())
        try await services.database.transaction { tx in
            _ = try await services.subscriptions.record(
                [(.periodRefunded(refunded), EventID(UUID()))], on: original, metadata: Data("{}".utf8), in: tx)
        }
    }
}

@Suite("Billed periods in the reconciliation report and dashboards.daily_orders")
struct SubscriptionReportTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("a renewal an order holds (a backend's own receipt-received of it) counts once: its order's money, in the report, the dashboard and the Apple comparison")
    func renewalHeldByAnOrder() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let services = secondServer(db)
            let periods = (0..<2).map { SubscriptionFixture.signed("9300301", period: $0) }
            try await http.send(.post, "/v1/orders", json: ["orderId": "held-start", "userId": "su-held", "productId": "pro.monthly", "price": "9.99", "currency": "USD"])
            let (_, started) = try await http.send(.post, "/v1/receipts", json: ["orderId": "held-start", "signedTransaction": try await apple.sign(periods[0])])
            #expect(started["state"] as? String == "verified", "\(started)")
            // The backend's own order for the renewal, claimed and verified by the backend itself.
            try await http.send(.post, "/v1/orders", json: ["orderId": "held-renewal", "userId": "su-held", "productId": "pro.monthly", "price": "9.99", "currency": "USD"])
            let renewalID = periods[1].transactionId
            var own = receipt(renewalID, product: "pro.monthly")
            own["purchaseDate"] = EventCoding.formatDate(Date(millisecondsSince1970: periods[1].purchaseDate))
            let (claimed, claim) = try await http.send(.post, "/v1/orders/held-renewal/events", json: ["type": "receipt-received", "data": own])
            #expect(claimed == .created, "\(claim)")
            // Apple's renewal, recorded on the subscription as DID_RENEW records it.
            try await SubscriptionFixture.record(services, periods, user: "su-held")
            #expect(try await scalar(db, "SELECT count(*)::int FROM subscription_periods WHERE transaction_id = \(renewalID)", as: Int.self) == 1)
            func renewalRevenue() async throws -> Decimal {
                let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
                let rows = (report["rows"] as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "subscription-renewal" }
                return rows.compactMap { Decimal(string: $0["revenue"] as? String ?? "") }.reduce(0, +)
            }
            // Claimed, not verified: the order has no money in the report yet, so the period counts its own.
            #expect(try await renewalRevenue() == Decimal(string: "9.99"))
            let (verified, _) = try await http.send(.post, "/v1/orders/held-renewal/events", json: ["type": "verified", "data": ["transactionId": renewalID, "environment": "Production"]])
            #expect(verified == .created)

            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let renewals = (report["rows"] as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "subscription-renewal" }
            let revenue = renewals.compactMap { Decimal(string: $0["revenue"] as? String ?? "") }.reduce(0, +)
            #expect(revenue == Decimal(string: "9.99"), "the order's money once: \(renewals)")
            #expect(renewals.map { $0["periods"] as? Int ?? 0 }.reduce(0, +) == 1 && renewals.map { $0["verified"] as? Int ?? 0 }.reduce(0, +) == 1, "\(renewals)")
            #expect(try await scalar(db, """
                SELECT coalesce(sum(amount), 0)::text FROM dashboards.daily_orders WHERE kind = 'subscription-renewal'
                """, as: String.self).flatMap { Decimal(string: $0) } == Decimal(string: "9.99"))
            let day = try await scalar(db, "SELECT ((purchase_date AT TIME ZONE 'America/Los_Angeles')::date)::text FROM subscription_periods WHERE transaction_id = \(renewalID)", as: String.self)
            #expect(try await scalar(db, """
                SELECT coalesce(sum(ledger_purchases), 0)::int FROM ledger_apple_sales(\(day)::date, \(day)::date) WHERE product_id = 'pro.monthly'
                """, as: Int.self) == 1, "the renewal's sale once, in the Apple comparison")
        }
    }

    @Test("Apple's refund of a renewal an order holds refunds that order and the period, and the report takes the money back once")
    func refundOfAHeldRenewal() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let services = secondServer(db)
            let periods = (0..<2).map { SubscriptionFixture.signed("9300501", period: $0) }
            try await http.send(.post, "/v1/orders", json: ["orderId": "hr-start", "userId": "su-hr", "productId": "pro.monthly", "price": "9.99", "currency": "USD"])
            let (_, started) = try await http.send(.post, "/v1/receipts", json: ["orderId": "hr-start", "signedTransaction": try await apple.sign(periods[0])])
            #expect(started["state"] as? String == "verified", "\(started)")
            // The backend's own order for the renewal, claimed and verified by the backend itself.
            try await SubscriptionFixture.heldByOwnOrder(http, "hr-renewal", user: "su-hr", renewal: periods[1])
            let renewalID = periods[1].transactionId
            try await SubscriptionFixture.record(services, periods, user: "su-hr")

            var refunded = periods[1]
            refunded.revocationDate = Date().millisecondsSince1970
            refunded.revocationType = "REFUND_FULL"
            let (status, answer) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded, environment: "Production"))
            #expect(status == .ok, "\(answer)")
            #expect(try await scalar(db, "SELECT state FROM orders WHERE order_id = 'hr-renewal'", as: String.self) == "refunded",
                    "the order the renewal paid is refunded with its period")
            #expect(try await scalar(db, "SELECT count(*)::int FROM subscription_periods WHERE transaction_id = \(renewalID) AND refunded_at IS NOT NULL", as: Int.self) == 1)
            #expect(try await scalar(db, "SELECT state FROM orders WHERE order_id = 'hr-start'", as: String.self) == "verified")

            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let renewals = (report["rows"] as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "subscription-renewal" }
            func decimal(_ value: Any?) -> Decimal { Decimal(string: value as? String ?? "") ?? -1 }
            #expect(renewals.map { decimal($0["revenue"]) }.reduce(0, +) == 0, "9.99 billed, 9.99 back: \(renewals)")
            #expect(renewals.map { decimal($0["refundedAmount"]) }.reduce(0, +) == Decimal(string: "9.99"), "\(renewals)")
            let dashboard = try await scalar(db, """
                SELECT sum(amount)::text || ' ' || sum(refunded_amount)::text FROM dashboards.daily_orders WHERE kind = 'subscription-renewal'
                """, as: String.self)
            #expect(dashboard?.split(separator: " ").map { Decimal(string: String($0)) } == [Decimal(string: "9.99"), Decimal(string: "9.99")],
                    "billed once, given back once: \(dashboard ?? "none")")

            // Apple reverses the refund: the order and the period take it back; the report counts
            // the refund once still (a reversal gives nothing back there), the dashboard none.
            let (reversed, reversal) = try await http.notifyApple(try await apple.notification("REFUND_REVERSED", transaction: periods[1], environment: "Production"))
            #expect(reversed == .ok, "\(reversal)")
            #expect(try await scalar(db, "SELECT state FROM orders WHERE order_id = 'hr-renewal'", as: String.self) == "verified")
            let (_, later) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let after = (later["rows"] as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "subscription-renewal" }
            #expect(after.map { $0["refunded"] as? Int ?? 0 }.reduce(0, +) == 1 && after.map { decimal($0["refundedAmount"]) }.reduce(0, +) == Decimal(string: "9.99"),
                    "\(after)")
            #expect(try await scalar(db, "SELECT coalesce(sum(refunded_amount), 0)::text FROM dashboards.daily_orders WHERE kind = 'subscription-renewal'", as: String.self)
                        .flatMap { Decimal(string: $0) } == 0)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("two refunds of one renewal recorded out of Apple's order: dashboards.daily_orders takes back what the report does, Apple's latest")
    func renewalRefundsOutOfOrder() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let periods = (0..<2).map { SubscriptionFixture.signed("9300601", period: $0) }
            try await SubscriptionFixture.record(secondServer(db), periods, user: "su-oo")
            // Apple's full refund at :31 came first; its 25% refund at :20, made before it, after.
            let now = Date().millisecondsSince1970
            for (revoked, type, percentage) in [(now - 60_000, "REFUND_FULL", nil), (now - 660_000, "REFUND_PRORATED", 25_000) as (Int64, String, Int?)] {
                var refunded = periods[1]
                refunded.revocationDate = revoked
                refunded.revocationType = type
                refunded.revocationPercentage = percentage
                try await http.notifyAppleTaken(try await apple.notification("REFUND", transaction: refunded, environment: "Production"))
            }
            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let renewals = (report["rows"] as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "subscription-renewal" }
            #expect(renewals.compactMap { $0["refundedAmount"] as? String }.filter { $0 != "0" } == ["9.99"], "\(renewals)")
            #expect(try await scalar(db, "SELECT sum(refunded_amount)::text FROM dashboards.daily_orders WHERE kind = 'subscription-renewal'", as: String.self) == "9.99")
        }
    }

    @Test("a renewal's refund Apple made after a reversal, arriving before that reversal, stands on its period")
    func renewalRefundBeforeTheReversal() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let periods = (0..<2).map { SubscriptionFixture.signed("9300801", period: $0) }
            try await SubscriptionFixture.record(secondServer(db), periods, user: "su-stands")
            let now = Date()
            func refund(at date: Date) async throws -> String {
                var refunded = periods[1]
                refunded.revocationDate = date.millisecondsSince1970
                refunded.revocationReason = 0
                return try await apple.notification("REFUND", transaction: refunded, environment: "Production", signedDate: date)
            }
            try await http.notifyAppleTaken(try await refund(at: now.addingTimeInterval(-300)))
            try await http.notifyAppleTaken(try await refund(at: now.addingTimeInterval(-100)))
            try await http.notifyAppleTaken(try await apple.notification(
                "REFUND_REVERSED", transaction: periods[1], environment: "Production", signedDate: now.addingTimeInterval(-200)))
            #expect(try await scalar(db, """
                SELECT count(*)::int FROM subscription_periods WHERE transaction_id = \(periods[1].transactionId) AND refunded_at IS NOT NULL
                """, as: Int.self) == 1, "the later refund stands")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a renewal's refund told by two ways (another notification carrying it, then Apple's REFUND) refunds its period once")
    func renewalRefundToldTwice() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let periods = (0..<2).map { SubscriptionFixture.signed("9300701", period: $0) }
            try await SubscriptionFixture.record(secondServer(db), periods, user: "su-twice")
            var refunded = periods[1]
            refunded.revocationDate = Date(timeIntervalSinceNow: -60).millisecondsSince1970
            refunded.revocationReason = 0
            try await http.notifyAppleTaken(try await apple.notification(
                "DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_DISABLED", transaction: refunded, environment: "Production",
                renewalInfo: TestApple.renewalInfo("9300701", environment: "Production", autoRenew: false)))
            for _ in 0..<2 { try await http.notifyAppleTaken(try await apple.notification("REFUND", transaction: refunded, environment: "Production")) }
            #expect(try await scalar(db, """
                SELECT count(*)::int FROM events WHERE stream_id = 'subscription-9300701' AND type = 'subscription-period-refunded'
                """, as: Int.self) == 1)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a renewal an order holds, refunded before the ledger knew its subscription: once the subscription is known, that period is refunded and the service ended")
    func heldRenewalRefundedBeforeItsSubscription() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let otid = "9300701", day: TimeInterval = 86_400, now = Date()
            let start = SubscriptionNotificationTests.period(otid, 0, purchased: now.addingTimeInterval(-40 * day), expires: now.addingTimeInterval(-10 * day))
            let renewal = SubscriptionNotificationTests.period(otid, 1, purchased: now.addingTimeInterval(-10 * day), expires: now.addingTimeInterval(20 * day))
            // The backend's own order for the renewal, claimed and verified by the backend itself.
            try await SubscriptionFixture.heldByOwnOrder(http, "hb-renewal", user: "su-hb", renewal: renewal, environment: "Sandbox")
            // Apple refunds the renewal; the ledger does not know its subscription yet.
            var refunded = renewal
            refunded.revocationDate = now.millisecondsSince1970
            refunded.revocationReason = 0
            #expect(try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded)).0 == .ok)
            #expect(try await scalar(db, "SELECT state FROM orders WHERE order_id = 'hb-renewal'", as: String.self) == "refunded")
            // Then the start, through its order, and Apple's DID_RENEW of the renewal.
            try await http.send(.post, "/v1/orders", json: ["orderId": "hb-start", "userId": "su-hb", "productId": "pro.monthly", "price": "4.99", "currency": "USD"])
            let (_, started) = try await http.send(.post, "/v1/receipts", json: ["orderId": "hb-start", "signedTransaction": try await apple.sign(start)])
            #expect(started["state"] as? String == "verified", "\(started)")
            let (renewed, answer) = try await http.notifyApple(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid)))
            #expect(renewed == .ok, "\(answer)")

            let (_, subscription) = try await http.send(.get, "/v1/subscriptions/\(otid)")
            #expect(subscription["status"] as? String == "revoked", "the refunded period ended the service: \(subscription)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM subscription_periods WHERE transaction_id = \(renewal.transactionId) AND refunded_at IS NOT NULL", as: Int.self) == 1)
            let (_, again) = try await http.notifyApple(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid)))
            #expect(again["applied"] as? Bool == true || again["applied"] as? Bool == false, "\(again)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = \("subscription-\(otid)") AND type = 'subscription-period-refunded'", as: Int.self) == 1,
                    "recorded once")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a renewal refunded by half, the refund reversed, then refunded in full: the report takes the whole price back once")
    func renewalRefundedAgain() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let services = secondServer(db)
            let periods = (0..<2).map { SubscriptionFixture.signed("9300601", period: $0) }
            try await SubscriptionFixture.record(services, periods, user: "su-again")
            try await SubscriptionFixture.refund(services, periods[1], percentage: 50_000)
            let reversed = SubscriptionPeriodRefundReversed(
                transactionId: TransactionID(unchecked: periods[1].transactionId), periodKey: periods[1].webOrderLineItemId ?? "", notificationUUID: UUID())
            try await services.database.transaction { tx in
                _ = try await services.subscriptions.record([(.periodRefundReversed(reversed), EventID(UUID()))], on: "9300601", metadata: Data("{}".utf8), in: tx)
            }
            try await SubscriptionFixture.refund(services, periods[1])

            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let renewals = (report["rows"] as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "subscription-renewal" }
            #expect(renewals.map { $0["refunded"] as? Int ?? 0 }.reduce(0, +) == 1, "\(renewals)")
            #expect(renewals.compactMap { Decimal(string: $0["refundedAmount"] as? String ?? "") }.reduce(0, +) == Decimal(string: "9.99"), "\(renewals)")
        }
    }

    @Test("a free trial's start pays its order with no money, its refund gives none back; the first billed renewal counts its price")
    func freeTrialStart() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let services = secondServer(db)
            try await http.send(.post, "/v1/orders", json: ["orderId": "trial", "userId": "su-trial", "productId": "pro.monthly", "price": "9.99", "currency": "USD"])
            // Apple priced the trial's period 0, the renewal after it 9.99.
            let periods = [SubscriptionFixture.signed("9300401", period: 0, price: 0), SubscriptionFixture.signed("9300401", period: 1)]
            let (_, started) = try await http.send(.post, "/v1/receipts", json: ["orderId": "trial", "signedTransaction": try await apple.sign(periods[0])])
            #expect(started["state"] as? String == "verified", "\(started)")
            try await SubscriptionFixture.record(services, periods, user: "su-trial")
            // A refund of the trial's order (Apple refunds a period it never billed as nothing).
            var revoked = periods[0]
            revoked.revocationDate = Date().millisecondsSince1970
            revoked.revocationType = "REFUND_FULL"
            let (refundStatus, _) = try await http.notifyApple(try await apple.notification("REFUND", transaction: revoked, environment: "Production"))
            #expect(refundStatus == .ok)

            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let rows = report["rows"] as? [[String: Any]] ?? []
            func decimal(_ value: Any?) -> Decimal? { Decimal(string: value as? String ?? "") }
            let starts = rows.filter { $0["kind"] as? String == "subscription-start" }
            #expect(starts.map { $0["verified"] as? Int ?? 0 }.reduce(0, +) == 1, "\(starts)")
            #expect(starts.allSatisfy { decimal($0["revenue"]) == 0 && decimal($0["refundedAmount"]) == 0 }, "\(starts)")
            let totals = report["totals"] as? [String: Any] ?? [:]
            #expect(decimal(totals["revenue"]) == Decimal(string: "9.99"), "the renewal alone: \(totals)")
            #expect(try await scalar(db, """
                SELECT coalesce(sum(amount), 0)::text FROM dashboards.daily_orders WHERE kind = 'subscription-start'
                """, as: String.self).flatMap { Decimal(string: $0) } == 0)
            #expect(try await scalar(db, """
                SELECT coalesce(sum(amount), 0)::text FROM dashboards.daily_orders WHERE kind = 'subscription-renewal'
                """, as: String.self).flatMap { Decimal(string: $0) } == Decimal(string: "9.99"))
        }
    }

    @Test("a monthly subscription's periods count in their day, currency and kind; a refund takes back its period only; the start counts once; family-shared never; the sandbox apart")
    func billedPeriods() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let services = secondServer(db)
            // Bought through an order: the start transaction verifies it.
            func bought(_ order: String, _ original: String, price: String, appleprice: Int64) async throws -> [SignedTransactionPayload] {
                try await http.send(.post, "/v1/orders", json: ["orderId": order, "userId": "su-\(order)", "productId": "pro.monthly", "price": price, "currency": "USD"])
                let periods = (0..<3).map { SubscriptionFixture.signed(original, period: $0, price: appleprice) }
                let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": order, "signedTransaction": try await apple.sign(periods[0])])
                #expect(answer["orderId"] as? String == order && answer["state"] as? String == "verified", "\(answer)")
                return periods
            }
            // Three periods: the start (kept), a renewal refunded in full, one refunded 25 %.
            let monthly = try await bought("sub-1", "9300001", price: "9.99", appleprice: 9_990)
            try await SubscriptionFixture.record(services, monthly, user: "su-sub-1")
            try await SubscriptionFixture.refund(services, monthly[1])
            try await SubscriptionFixture.refund(services, monthly[2], percentage: 25_000)
            // A second one whose start is refunded: by the order's refund, and on its subscription too.
            let refundedStart = try await bought("sub-2", "9300002", price: "4.99", appleprice: 4_990)
            try await SubscriptionFixture.record(services, [refundedStart[0]], user: "su-sub-2")
            var revoked = refundedStart[0]
            revoked.revocationDate = Date().millisecondsSince1970
            revoked.revocationType = "REFUND_FULL"
            let (refundStatus, _) = try await http.notifyApple(try await apple.notification("REFUND", transaction: revoked, environment: "Production"))
            #expect(refundStatus == .ok)
            try await SubscriptionFixture.refund(services, refundedStart[0])
            // A family member's shared subscription: never revenue.
            let shared = (0..<2).map { SubscriptionFixture.signed("9300100", period: $0, product: "pro.yearly", familyShared: true) }
            try await SubscriptionFixture.record(services, shared, user: "su-member", familyShared: true)
            // A sandbox subscription (App Review's): its periods count apart.
            let sandbox = (0..<2).map { SubscriptionFixture.signed("9300200", period: $0, environment: "Sandbox") }
            try await SubscriptionFixture.record(services, sandbox, user: "su-review")

            let (status, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            #expect(status == .ok)
            let rows = report["rows"] as? [[String: Any]] ?? []
            func kindRows(_ kind: String, _ environment: String = "Production") -> [[String: Any]] {
                rows.filter { $0["kind"] as? String == kind && $0["environment"] as? String == environment }
            }
            func decimal(_ value: Any?) -> Decimal? { Decimal(string: value as? String ?? "") }
            #expect(!rows.contains { $0["productId"] as? String == "pro.yearly" }, "family-shared is never revenue: \(rows)")
            #expect(kindRows("purchase").isEmpty, "\(rows)")

            // The start: its orders' money, on the day they were verified (today), refunded once.
            let today = String(EventCoding.formatDate(Date()).prefix(10))
            let startOrders = kindRows("subscription-start").filter { $0["day"] as? String == today }
            #expect(startOrders.count == 1, "\(rows)")
            #expect(startOrders.first?["verified"] as? Int == 2 && startOrders.first?["refunded"] as? Int == 1, "\(startOrders)")
            #expect(decimal(startOrders.first?["revenue"]) == Decimal(string: "9.99") && decimal(startOrders.first?["refundedAmount"]) == Decimal(string: "4.99"))
            let started = kindRows("subscription-start").filter { $0["day"] as? String == "2025-12-10" }
            #expect(started.count == 1 && started.first?["periods"] as? Int == 2 && decimal(started.first?["revenue"]) == 0, "\(started)")

            // The renewals: each billed in its day and currency; their refunds on the day they were recorded.
            let renewals = kindRows("subscription-renewal")
            #expect(renewals.count == 3, "\(renewals)")
            for day in ["2026-01-10", "2026-02-10"] {
                let row = renewals.first { $0["day"] as? String == day }
                #expect(row?["periods"] as? Int == 1 && row?["currency"] as? String == "USD" && decimal(row?["revenue"]) == Decimal(string: "9.99"), "\(day): \(renewals)")
            }
            let refunds = renewals.first { $0["day"] as? String == today }
            #expect(refunds?["refunded"] as? Int == 2 && refunds?["periods"] as? Int == 0, "\(renewals)")
            #expect(decimal(refunds?["refundedAmount"]) == Decimal(string: "12.4875") && decimal(refunds?["revenue"]) == Decimal(string: "-12.4875"), "9.99 + a quarter of 9.99")

            let totals = report["totals"] as? [String: Any] ?? [:]
            #expect(totals["kind"] as? String == "total" && totals["periods"] as? Int == 4 && totals["verified"] as? Int == 2 && totals["refunded"] as? Int == 3, "\(totals)")
            #expect(decimal(totals["revenue"]) == Decimal(string: "17.4825"), "9.99 + 4.99 - 4.99 + 2 × 9.99 - 12.4875: \(totals)")
            let sandboxTotals = report["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(sandboxTotals["periods"] as? Int == 2 && decimal(sandboxTotals["revenue"]) == Decimal(string: "9.99"), "\(sandboxTotals)")
            #expect(kindRows("subscription-renewal", "Sandbox").first?["day"] as? String == "2026-01-10")

            let csv = try await http.client.execute(
                uri: "/v1/reports/reconciliation?from=2000-01-01", method: .get, headers: [.authorization: "Bearer \(http.key)", .accept: "text/csv"])
            let lines = String(buffer: csv.body).split(separator: "\n")
            #expect(lines.first?.hasSuffix(",environment,bundle_id,kind,periods,revenue_by_currency,refunded_amount_by_currency") == true)
            #expect(lines.contains { $0.hasPrefix("2026-01-10,pro.monthly,USD,") && $0.hasSuffix(",subscription-renewal,1,,") }, "\(lines)")

            // The finance view, as its reader sees it.
            let connection = try await db.connect()
            try await connection.query("SET ROLE ledger_reader", logger: TestServer.logger)
            let viewRows = try await connection.query(
                """
                SELECT kind, state, environment, sum(orders)::int, sum(amount)::text, sum(refunded_amount)::text FROM dashboards.daily_orders
                 GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
                """, logger: TestServer.logger)
            var view: [String: (Int, Decimal?, Decimal?)] = [:]
            for try await (kind, state, environment, count, amount, refunded) in viewRows.decode((String, String, String, Int, String, String).self) {
                view["\(kind) \(state) \(environment)"] = (count, Decimal(string: amount), Decimal(string: refunded))
            }
            try await connection.close()
            #expect(view.count == 4, "\(view)")
            #expect(view["subscription-start verified Production"].map { $0.0 == 1 && $0.1 == Decimal(string: "9.99") } == true, "\(view)")
            #expect(view["subscription-start refunded Production"].map { $0.0 == 1 && $0.2 == Decimal(string: "4.99") } == true, "\(view)")
            #expect(view["subscription-renewal refunded Production"].map { $0.0 == 2 && $0.1 == Decimal(string: "19.98") && $0.2 == Decimal(string: "12.4875") } == true, "\(view)")
            #expect(view["subscription-renewal billed Sandbox"].map { $0.0 == 1 && $0.1 == Decimal(string: "9.99") } == true, "\(view)")
            #expect(view["subscription-start billed Sandbox"] == nil && view.keys.allSatisfy { !$0.hasPrefix("purchase") })
        }
    }
}
