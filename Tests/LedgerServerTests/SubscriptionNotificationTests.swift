import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// What a test's signed renewal info says (Apple's JWSRenewalInfoDecodedPayload fields).
struct RenewalFields: Sendable {
    var autoRenew = true
    var autoRenewProductId = "pro.monthly"
    var expirationIntent: Int?
    /// Days from now.
    var graceDays: Double?
    var retry = false
    var priceIncreaseStatus: Int?

    func payload(_ originalTransactionId: String, now: Date) -> SignedRenewalInfoPayload {
        var info = TestApple.renewalInfo(originalTransactionId, product: autoRenewProductId, autoRenew: autoRenew)
        info.productId = "pro.monthly"
        info.expirationIntent = expirationIntent
        info.gracePeriodExpiresDate = graceDays.map { now.addingTimeInterval($0 * 86_400).millisecondsSince1970 }
        info.isInBillingRetryPeriod = retry
        info.priceIncreaseStatus = priceIncreaseStatus
        return info
    }
}

/// One notification type (and subtype) applied to a subscription bought through an order.
struct LifecycleCase: Sendable, CustomTestStringConvertible {
    /// Which transaction the notification carries.
    enum About: Sendable {
        /// The purchase that started it (the current period).
        case firstPeriod
        /// A new billed period, of `product`.
        case nextPeriod(product: String)
        /// The first period, its end moved by `days` (`RENEWAL_EXTENDED`).
        case extended(days: Double)
    }

    var type: String
    var subtype: String?
    /// The first period ended a day ago (rather than ending in 20 days).
    var lapsed = false
    /// Notifications about the first period applied before this one.
    var before: [(type: String, subtype: String?, info: RenewalFields)] = []
    var about = About.firstPeriod
    var info = RenewalFields()
    /// What the subscription must be, given the time the test started.
    var check: @Sendable (Subscription, Date) -> Void

    var testDescription: String { [type, subtype].compactMap { $0 }.joined(separator: " ") }

    static let day: TimeInterval = 86_400

    static let all: [LifecycleCase] = [
        LifecycleCase(type: "SUBSCRIBED", subtype: "INITIAL_BUY") { s, now in
            #expect(s.autoRenew == true && s.autoRenewProductId == "pro.monthly" && s.periods.count == 1 && s.status(at: now) == .active)
        },
        LifecycleCase(
            type: "SUBSCRIBED", subtype: "RESUBSCRIBE", lapsed: true,
            before: [("EXPIRED", "VOLUNTARY", RenewalFields(autoRenew: false, expirationIntent: 1))], about: .nextPeriod(product: "pro.monthly")
        ) { s, now in
            #expect(s.periods.count == 2 && !s.expired && s.autoRenew == true && s.status(at: now) == .active)
        },
        LifecycleCase(type: "DID_RENEW", about: .nextPeriod(product: "pro.monthly")) { s, now in
            #expect(s.periods.map(\.kind) == [.start, .renewal])
            #expect(s.expiresAt.map { $0 > now.addingTimeInterval(45 * day) } == true && s.status(at: now.addingTimeInterval(30 * day)) == .active)
        },
        LifecycleCase(
            type: "DID_RENEW", subtype: "BILLING_RECOVERY", lapsed: true, before: [("DID_FAIL_TO_RENEW", nil, RenewalFields(retry: true))],
            about: .nextPeriod(product: "pro.monthly")
        ) { s, now in
            #expect(s.periods.count == 2 && !s.inBillingRetry && s.status(at: now) == .active)
        },
        LifecycleCase(
            type: "OFFER_REDEEMED", subtype: "RESUBSCRIBE", lapsed: true,
            before: [("EXPIRED", "VOLUNTARY", RenewalFields(autoRenew: false, expirationIntent: 1))], about: .nextPeriod(product: "pro.monthly")
        ) { s, now in
            #expect(s.periods.count == 2 && !s.expired && s.status(at: now) == .active)
        },
        LifecycleCase(type: "DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_DISABLED", info: RenewalFields(autoRenew: false)) { s, now in
            #expect(s.autoRenew == false && s.status(at: now) == .active)
        },
        LifecycleCase(
            type: "DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_ENABLED",
            before: [("DID_CHANGE_RENEWAL_STATUS", "AUTO_RENEW_DISABLED", RenewalFields(autoRenew: false))]
        ) { s, now in
            #expect(s.autoRenew == true && s.status(at: now) == .active)
        },
        LifecycleCase(
            type: "DID_CHANGE_RENEWAL_PREF", subtype: "UPGRADE", about: .nextPeriod(product: "pro.yearly"),
            info: RenewalFields(autoRenewProductId: "pro.yearly")
        ) { s, now in
            #expect(s.productId.rawValue == "pro.yearly" && s.autoRenewProductId == "pro.yearly" && s.periods.count == 2)
        },
        LifecycleCase(type: "DID_CHANGE_RENEWAL_PREF", subtype: "DOWNGRADE", info: RenewalFields(autoRenewProductId: "pro.basic")) { s, now in
            #expect(s.productId.rawValue == "pro.monthly" && s.autoRenewProductId == "pro.basic" && s.status(at: now) == .active)
        },
        LifecycleCase(type: "DID_FAIL_TO_RENEW", lapsed: true, info: RenewalFields(expirationIntent: 2, retry: true)) { s, now in
            #expect(s.inBillingRetry && s.status(at: now) == .billingRetry)
        },
        LifecycleCase(type: "DID_FAIL_TO_RENEW", subtype: "GRACE_PERIOD", lapsed: true, info: RenewalFields(graceDays: 15, retry: true)) { s, now in
            #expect(s.status(at: now) == .gracePeriod && s.status(at: now.addingTimeInterval(16 * day)) == .billingRetry)
        },
        LifecycleCase(
            type: "GRACE_PERIOD_EXPIRED", lapsed: true, before: [("DID_FAIL_TO_RENEW", "GRACE_PERIOD", RenewalFields(graceDays: 15, retry: true))],
            info: RenewalFields(retry: true)
        ) { s, now in
            #expect(s.gracePeriodExpiresAt == nil && s.status(at: now) == .billingRetry)
        },
        LifecycleCase(type: "EXPIRED", subtype: "VOLUNTARY", lapsed: true, info: RenewalFields(autoRenew: false, expirationIntent: 1)) { s, now in
            #expect(s.expired && s.expirationIntent == 1 && s.status(at: now) == .expired)
        },
        LifecycleCase(
            type: "EXPIRED", subtype: "BILLING_RETRY", lapsed: true, before: [("DID_FAIL_TO_RENEW", nil, RenewalFields(retry: true))],
            info: RenewalFields(expirationIntent: 2)
        ) { s, now in
            #expect(s.expired && !s.inBillingRetry && s.expirationIntent == 2 && s.status(at: now) == .expired)
        },
        LifecycleCase(type: "EXPIRED", subtype: "PRICE_INCREASE", lapsed: true, info: RenewalFields(autoRenew: false, expirationIntent: 3)) { s, now in
            #expect(s.expired && s.expirationIntent == 3 && s.status(at: now) == .expired)
        },
        LifecycleCase(type: "EXPIRED", subtype: "PRODUCT_NOT_FOR_SALE", lapsed: true, info: RenewalFields(expirationIntent: 4)) { s, now in
            #expect(s.expired && s.expirationIntent == 4 && s.status(at: now) == .expired)
        },
        LifecycleCase(type: "RENEWAL_EXTENDED", about: .extended(days: 7)) { s, now in
            #expect(s.expiresAt.map { abs($0.timeIntervalSince(now.addingTimeInterval(27 * day))) < 60 } == true)
            #expect(s.periods.count == 1 && s.status(at: now.addingTimeInterval(25 * day)) == .active)
        },
        LifecycleCase(type: "PRICE_INCREASE", subtype: "PENDING", info: RenewalFields(priceIncreaseStatus: 0)) { s, now in
            #expect(s.status(at: now) == .active)
        },
        LifecycleCase(type: "PRICE_INCREASE", subtype: "ACCEPTED", info: RenewalFields(priceIncreaseStatus: 1)) { s, now in
            #expect(s.status(at: now) == .active)
        },
    ]
}

@Suite("Apple's notifications drive a subscription's lifecycle, over HTTP")
struct SubscriptionNotificationTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    static let day: TimeInterval = 86_400
    let otid = "7000001"

    /// Period `n` of subscription `otid` (0: the purchase that started it), as Apple signs it.
    static func period(
        _ otid: String, _ n: Int, product: String = "pro.monthly", purchased: Date, expires: Date, ownership: String = "PURCHASED"
    ) -> SignedTransactionPayload {
        SignedTransactionPayload(
            transactionId: n == 0 ? otid : "\(otid)\(n)", originalTransactionId: otid, bundleId: TestApple.bundleId, productId: product,
            purchaseDate: purchased.millisecondsSince1970, signedDate: Date().millisecondsSince1970, environment: "Sandbox",
            type: "Auto-Renewable Subscription", appTransactionId: "app-tx-\(otid)", inAppOwnershipType: ownership, price: 4990,
            currency: "USD", expiresDate: expires.millisecondsSince1970, webOrderLineItemId: "\(otid)-w\(n)",
            transactionReason: n == 0 ? "PURCHASE" : "RENEWAL", subscriptionGroupIdentifier: "g-pro")
    }

    /// The transaction the ledger verifies from `payload`.
    static func verified(_ payload: SignedTransactionPayload) -> AppleTransaction {
        AppleTransaction(
            transactionId: TransactionID(unchecked: payload.transactionId), originalTransactionId: payload.originalTransactionId,
            productId: ProductID(unchecked: payload.productId), purchaseDate: Date(millisecondsSince1970: payload.purchaseDate),
            environment: payload.environment, bundleId: payload.bundleId, appTransactionId: payload.appTransactionId,
            inAppOwnershipType: payload.inAppOwnershipType, price: "4.99", currency: payload.currency, format: .jws,
            receiptSha256: String(repeating: "0", count: 64), type: payload.type, expiresDate: payload.expiresDate.map(Date.init(millisecondsSince1970:)),
            webOrderLineItemId: payload.webOrderLineItemId, transactionReason: payload.transactionReason,
            subscriptionGroupIdentifier: payload.subscriptionGroupIdentifier)
    }

    /// `subscription-started` and its first period, as the intake of the purchase records them
    /// (named ids: nothing is recorded where the intake already did).
    static func started(_ db: TestDatabase, _ payload: SignedTransactionPayload, user: String, familyShared: Bool = false) async throws {
        let ledger = SubscriptionLedger(writer: db.writer, events: db.store, store: SubscriptionStore(database: db.database))
        let transaction = verified(payload)
        let id = payload.originalTransactionId ?? payload.transactionId
        let events: [(SubscriptionEvent, EventID)] = [
            (.started(SubscriptionStarted(originalTransactionId: id, transaction: transaction, userId: UserID(unchecked: user), familyShared: familyShared)),
             SubscriptionLedger.startedEventID(id)),
            (.period(SubscriptionPeriodRecorded(transaction: transaction, kind: .start)), SubscriptionLedger.periodEventID(id, transaction)),
        ]
        _ = try await db.database.transaction { tx in try await ledger.record(events, on: id, metadata: Data("{}".utf8), in: tx) }
    }

    /// A monthly subscription bought through order `o-sub` (delivered), its first period ending at `end`.
    func subscribe(_ http: LedgerHTTP, _ db: TestDatabase, end: Date) async throws -> SignedTransactionPayload {
        try await http.send(.post, "/v1/orders", json: newOrder("o-sub", product: "pro.monthly"))
        let start = Self.period(otid, 0, purchased: end.addingTimeInterval(-30 * Self.day), expires: end)
        let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-sub", "signedTransaction": try await apple.sign(start)])
        #expect(answer["outcome"] as? String == "matched")
        try await http.send(.post, "/v1/orders/o-sub/events", json: ["type": "delivered", "data": [:]])
        try await Self.started(db, start, user: "u-1")
        return start
    }

    func subscription(_ db: TestDatabase, _ id: String? = nil) async throws -> Subscription {
        try #require(try await SubscriptionStore(database: db.database).subscription(id ?? otid))
    }

    /// `transaction` as Apple signs it once refunded or revoked.
    static func revoked(_ transaction: SignedTransactionPayload, type: String? = nil) -> SignedTransactionPayload {
        var revoked = transaction
        revoked.revocationDate = Date().millisecondsSince1970
        revoked.revocationReason = type == "FAMILY_REVOKE" ? 0 : 1
        revoked.revocationType = type
        return revoked
    }

    @Test("each lifecycle notification becomes subscription-renewal-changed on its subscription, once", arguments: LifecycleCase.all)
    func lifecycle(_ c: LifecycleCase) async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            let end = now.addingTimeInterval(c.lapsed ? -Self.day : 20 * Self.day)
            let start = try await subscribe(http, db, end: end)
            for earlier in c.before {
                let signed = try await apple.notification(
                    earlier.type, subtype: earlier.subtype, transaction: start, renewalInfo: earlier.info.payload(otid, now: now))
                #expect(try await http.notifyApple(signed).0 == .ok)
            }
            let transaction = switch c.about {
            case .firstPeriod: start
            case .nextPeriod(let product):
                Self.period(otid, 1, product: product, purchased: min(end, now), expires: max(end, now).addingTimeInterval(30 * Self.day))
            case .extended(let days):
                Self.period(otid, 0, purchased: end.addingTimeInterval(-30 * Self.day), expires: end.addingTimeInterval(days * Self.day))
            }
            let signed = try await apple.notification(c.type, subtype: c.subtype, transaction: transaction, renewalInfo: c.info.payload(otid, now: now))
            let (status, answer) = try await http.notifyApple(signed)
            #expect(status == .ok && answer["applied"] as? Bool == true)
            #expect(answer["streamId"] as? String == "subscription-\(otid)")
            #expect(answer["type"] as? String == "subscription-renewal-changed")
            let count = try await eventCount(db)
            let (again, repeated) = try await http.notifyApple(signed)
            #expect(again == .ok && repeated["applied"] as? Bool == false, "Apple's retry of the same notification")
            #expect(try await eventCount(db) == count)

            c.check(try await subscription(db), now)
            let recorded = try await scalar(db, """
                SELECT (data -> 'notification' ->> 'notificationType') || '/' || coalesce(data -> 'notification' ->> 'subtype', '') || '/' ||
                       coalesce(data -> 'renewalInfo' ->> 'priceIncreaseStatus', '')
                  FROM events WHERE stream_id = \("subscription-\(otid)") ORDER BY stream_version DESC LIMIT 1
                """, as: String.self)
            #expect(recorded == "\(c.type)/\(c.subtype ?? "")/\(c.info.priceIncreaseStatus.map(String.init) ?? "")")
            let (_, order) = try await http.send(.get, "/v1/orders/o-sub")
            #expect(order["state"] as? String == "delivered", "a subscription's lifecycle changes no order")
        }
    }

    /// The subscription `subscribe` starts, ended yesterday, and its renewal (`DID_RENEW`), which pays for now.
    func renewed(_ http: LedgerHTTP, _ db: TestDatabase, now: Date) async throws -> (start: SignedTransactionPayload, renewal: SignedTransactionPayload) {
        let end = now.addingTimeInterval(-Self.day)
        let start = try await subscribe(http, db, end: end)
        let renewal = Self.period(otid, 1, purchased: end, expires: now.addingTimeInterval(29 * Self.day))
        #expect(try await http.notifyApple(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid))).0 == .ok)
        return (start, renewal)
    }

    /// The subscription once nothing stands taken back: no period refunded, its order delivered,
    /// and the projections as a rebuild makes them.
    func nothingTakenBack(_ http: LedgerHTTP, _ db: TestDatabase) async throws -> Subscription {
        let s = try await subscription(db)
        #expect(s.periods.allSatisfy { $0.refundedAt == nil })
        let (_, order) = try await http.send(.get, "/v1/orders/o-sub")
        #expect(order["state"] as? String == "delivered")
        #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        return s
    }

    @Test("REFUND or REVOKE of a renewal takes back that period only; of the start, its order's refund too; REFUND_REVERSED undoes each")
    func periodRefunds() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            let (start, renewal) = try await renewed(http, db, now: now)

            for type in ["REFUND", "REVOKE"] {
                let refund = try await apple.notification(type, transaction: Self.revoked(renewal))
                let (_, answer) = try await http.notifyApple(refund)
                #expect(answer["streamId"] as? String == "subscription-\(otid)" && answer["type"] as? String == "subscription-period-refunded")
                let count = try await eventCount(db)
                #expect(try await http.notifyApple(refund).1["applied"] as? Bool == false)
                #expect(try await eventCount(db) == count)
                var s = try await subscription(db)
                #expect(s.periods.map { $0.refundedAt != nil } == [false, true], "\(type): the renewal's period alone")
                #expect(s.status(at: now) == .revoked)
                let (_, order) = try await http.send(.get, "/v1/orders/o-sub")
                #expect(order["state"] as? String == "delivered", "\(type) of a renewal: no order paid for it")

                let (_, reversed) = try await http.notifyApple(try await apple.notification("REFUND_REVERSED", transaction: renewal))
                #expect(reversed["type"] as? String == "subscription-period-refund-reversed")
                s = try await subscription(db)
                #expect(s.periods.allSatisfy { $0.refundedAt == nil } && s.status(at: now) == .active)
            }

            let (_, refunded) = try await http.notifyApple(try await apple.notification("REFUND", transaction: Self.revoked(start)))
            #expect(refunded["streamId"] as? String == "order-o-sub" && refunded["type"] as? String == "refunded")
            let s = try await subscription(db)
            #expect(s.periods.map { $0.refundedAt != nil } == [true, false], "the start's period alone")
            #expect(s.status(at: now) == .active, "the renewal still pays for now")
            let (_, order) = try await http.send(.get, "/v1/orders/o-sub")
            #expect(order["state"] as? String == "refunded")

            let (_, reversed) = try await http.notifyApple(try await apple.notification("REFUND_REVERSED", transaction: start))
            #expect(reversed["type"] as? String == "refund-reversed")
            _ = try await nothingTakenBack(http, db)
        }
    }

    @Test("a REFUND of a renewal or of the start that arrives after the REFUND_REVERSED Apple signed later takes back no period and refunds no order")
    func refundAfterItsReversal() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            let (start, renewal) = try await renewed(http, db, now: now)

            for (transaction, stream) in [(renewal, "transaction-\(renewal.transactionId)"), (start, "order-o-sub")] {
                var refunded = transaction
                refunded.revocationDate = now.addingTimeInterval(-7200).millisecondsSince1970
                refunded.revocationReason = 1
                #expect(try await http.notifyApple(
                    try await apple.notification("REFUND_REVERSED", transaction: transaction, signedDate: now.addingTimeInterval(-3600))).0 == .ok)
                let (_, late) = try await http.notifyApple(
                    try await apple.notification("REFUND", transaction: refunded, signedDate: now.addingTimeInterval(-7190)))
                #expect(late["type"] as? String == "notification-received" && late["streamId"] as? String == stream,
                        "\(transaction.transactionId): \(late)")
            }
            let s = try await nothingTakenBack(http, db)
            #expect(s.periods.count == 2)
            #expect(s.status(at: now) == .active)
        }
    }

    @Test("renewal info Apple signed before the one held, arriving later, changes no renewal field; newer info does")
    func olderRenewalInfo() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            let start = try await subscribe(http, db, end: now.addingTimeInterval(-Self.day))
            var expired = TestApple.renewalInfo(otid, autoRenew: false, signedDate: now.addingTimeInterval(-3600))
            expired.expirationIntent = 1
            #expect(try await http.notifyApple(try await apple.notification(
                "EXPIRED", subtype: "VOLUNTARY", transaction: start, signedDate: now.addingTimeInterval(-3600), renewalInfo: expired)).0 == .ok)
            // Sent before the EXPIRED, delivered after it: what it says of renewal is older.
            let stale = TestApple.renewalInfo(otid, autoRenew: true, signedDate: now.addingTimeInterval(-2 * Self.day))
            let (_, late) = try await http.notifyApple(try await apple.notification(
                "DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_ENABLED", transaction: start,
                signedDate: now.addingTimeInterval(-2 * Self.day), renewalInfo: stale))
            #expect(late["type"] as? String == "subscription-renewal-changed", "\(late)")
            var s = try await subscription(db)
            #expect(s.autoRenew == false && s.expirationIntent == 1 && s.status(at: now) == .expired, "\(s)")

            let newer = TestApple.renewalInfo(otid, autoRenew: true, signedDate: now)
            #expect(try await http.notifyApple(try await apple.notification(
                "DID_CHANGE_RENEWAL_STATUS", subtype: "AUTO_RENEW_ENABLED", transaction: start, signedDate: now, renewalInfo: newer)).0 == .ok)
            s = try await subscription(db)
            #expect(s.autoRenew == true, "\(s)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("REVOKE with FAMILY_REVOKE ends a family member's shared subscription only; the purchaser's and its order stay")
    func familyRevoke() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            _ = try await subscribe(http, db, end: now.addingTimeInterval(20 * Self.day))
            let shared = Self.period(
                "8000001", 0, purchased: now.addingTimeInterval(-10 * Self.day), expires: now.addingTimeInterval(20 * Self.day), ownership: "FAMILY_SHARED")
            try await Self.started(db, shared, user: "u-member", familyShared: true)

            let revoke = try await apple.notification("REVOKE", transaction: Self.revoked(shared, type: "FAMILY_REVOKE"))
            let (status, answer) = try await http.notifyApple(revoke)
            #expect(status == .ok && answer["streamId"] as? String == "subscription-8000001")
            #expect(answer["type"] as? String == "subscription-family-share-revoked")
            let count = try await eventCount(db)
            #expect(try await http.notifyApple(revoke).1["applied"] as? Bool == false)
            #expect(try await eventCount(db) == count)

            #expect(try await subscription(db, "8000001").status(at: now) == .revoked)
            #expect(try await subscription(db).status(at: now) == .active)
            let (_, order) = try await http.send(.get, "/v1/orders/o-sub")
            #expect(order["state"] as? String == "delivered")

            // Apple's notifications of family shares come in no set order: the revocation of a
            // later period, then that period's DID_RENEW, sent before it, leaves access ended.
            let renewed = Self.period(
                "8000001", 1, purchased: now.addingTimeInterval(-Self.day), expires: now.addingTimeInterval(29 * Self.day), ownership: "FAMILY_SHARED")
            let (_, later) = try await http.notifyApple(try await apple.notification("REVOKE", transaction: Self.revoked(renewed, type: "FAMILY_REVOKE")))
            #expect(later["type"] as? String == "subscription-family-share-revoked", "\(later)")
            let (_, late) = try await http.notifyApple(try await apple.notification("DID_RENEW", transaction: renewed, renewalInfo: TestApple.renewalInfo("8000001")))
            #expect(late["applied"] as? Bool == true, "\(late)")
            let member = try await subscription(db, "8000001")
            #expect(member.status(at: now) == .revoked && member.revokedAt != nil, "\(member)")
            #expect(member.periods.count == 2)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a notification about a subscription the ledger does not know stays on the transaction's stream; no subscription is made up")
    func unknownSubscription() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            let renewal = Self.period("9000001", 1, purchased: now, expires: now.addingTimeInterval(30 * Self.day))
            for type in ["DID_RENEW", "DID_CHANGE_RENEWAL_STATUS"] {
                let signed = try await apple.notification(type, transaction: renewal, renewalInfo: TestApple.renewalInfo("9000001"))
                let (status, answer) = try await http.notifyApple(signed)
                #expect(status == .ok && answer["applied"] as? Bool == true)
                #expect(answer["streamId"] as? String == "transaction-90000011" && answer["type"] as? String == "notification-received")
            }
            #expect(try await scalar(db, "SELECT count(*)::int FROM subscriptions", as: Int.self) == 0)
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id LIKE 'subscription-%'", as: Int.self) == 0)
        }
    }

    @Test("renewals of many subscriptions at once, each notification sent twice and each renewal uploaded meanwhile, are one period each; the rebuild agrees")
    func renewalsAtOnce() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            let ids = (11...22).map { "7100\($0)" }
            var notifications: [String] = []
            var uploads: [(user: String, signed: String)] = []
            for id in ids {
                let start = Self.period(id, 0, purchased: now.addingTimeInterval(-31 * Self.day), expires: now.addingTimeInterval(-Self.day))
                try await Self.started(db, start, user: "u-\(id)")
                let renewal = Self.period(id, 1, purchased: now.addingTimeInterval(-Self.day), expires: now.addingTimeInterval(29 * Self.day))
                notifications.append(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(id)))
                uploads.append(("u-\(id)", try await apple.sign(renewal)))
            }
            // And one about a subscription the ledger does not know, which waits on its transaction's stream.
            let stranger = Self.period("7199999", 1, purchased: now, expires: now.addingTimeInterval(30 * Self.day))
            notifications.append(try await apple.notification("DID_RENEW", transaction: stranger, renewalInfo: TestApple.renewalInfo("7199999")))

            let answers = try await withThrowingTaskGroup(of: (index: Int, status: HTTPResponse.Status, applied: Bool?, stream: String?).self) { group in
                for (index, signed) in notifications.enumerated() {
                    for _ in 0..<2 {
                        group.addTask {
                            let (status, answer) = try await http.notifyApple(signed)
                            return (index, status, answer["applied"] as? Bool, answer["streamId"] as? String)
                        }
                    }
                }
                for (user, signed) in uploads {
                    group.addTask {
                        let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": user, "signedTransaction": signed])
                        return (-1, status, nil, answer["outcome"] as? String)
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(answers.count == notifications.count * 2 + uploads.count)
            #expect(answers.allSatisfy { $0.status == .ok })
            for index in notifications.indices {
                let mine = answers.filter { $0.index == index }
                #expect(mine.compactMap(\.applied).sorted { !$0 && $1 } == [false, true], "notification \(index) applied once")
                let stream = index < ids.count ? "subscription-\(ids[index])" : "transaction-71999991"
                #expect(mine.allSatisfy { $0.stream == stream })
            }
            #expect(answers.filter { $0.index == -1 }.map(\.stream) == Array(repeating: "recorded", count: uploads.count))

            for id in ids {
                let s = try await subscription(db, id)
                #expect(s.periods.map(\.kind) == [.start, .renewal] && s.status(at: now) == .active, "\(id)")
                let types = try await scalar(
                    db, "SELECT string_agg(type, ',' ORDER BY stream_version) FROM events WHERE stream_id = \("subscription-\(id)")", as: String.self)
                #expect(types == "subscription-started,subscription-period,subscription-period,subscription-renewal-changed", "\(id)")
            }
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE status = 'renewal'", as: Int.self) == ids.count + 1)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("renewal info about another subscription, or with no transaction, or a transaction of another environment than its notification's, is a 400 that records nothing")
    func badRenewalInfo() async throws {
        try await withReceiptsApplication(apple, configure: { olderPurchases(&$0); bothEnvironments(&$0) }) { http, db in
            let now = Date()
            let start = try await subscribe(http, db, end: now.addingTimeInterval(20 * Self.day))
            let count = try await eventCount(db)
            let other = try await apple.notification("DID_CHANGE_RENEWAL_STATUS", transaction: start, renewalInfo: TestApple.renewalInfo("7999999"))
            let (mismatch, refused) = try await http.notifyApple(other)
            #expect(mismatch == .badRequest && errorOf(refused)["code"] as? String == "renewal-info-mismatch")
            let alone = try await apple.notification("DID_CHANGE_RENEWAL_STATUS", transaction: nil, renewalInfo: TestApple.renewalInfo(otid))
            let (lonely, answer) = try await http.notifyApple(alone)
            #expect(lonely == .badRequest && errorOf(answer)["code"] as? String == "renewal-info-without-transaction")
            // A notification of one environment carrying a transaction of the other: the checks made
            // for the notification's (the Apple id's, on Production) would not be the transaction's.
            let production = TestApple.transaction("7999001", environment: "Production")
            let crossed = try await apple.notification("ONE_TIME_CHARGE", transaction: production, environment: "Sandbox")
            let (wrong, why) = try await http.notifyApple(crossed)
            #expect(wrong == .badRequest && errorOf(why)["code"] as? String == "wrong-environment", "\(why)")
            #expect(try await eventCount(db) == count)
        }
    }

    @Test("a billing retry Apple never ends is billing-retry for 60 days, in Swift and in subscription_status alike")
    func billingRetryLimit() async throws {
        try await withReceiptsApplication(apple, configure: olderPurchases) { http, db in
            let now = Date()
            let start = try await subscribe(http, db, end: now.addingTimeInterval(-Self.day))
            let failed = try await apple.notification(
                "DID_FAIL_TO_RENEW", transaction: start, renewalInfo: RenewalFields(retry: true).payload(otid, now: now))
            #expect(try await http.notifyApple(failed).0 == .ok)
            let s = try await subscription(db)
            for days in [0.0, 58, 60] {
                let at = now.addingTimeInterval(days * Self.day)
                let sql = try await scalar(db, "SELECT subscription_status(s, \(at)) FROM subscriptions s WHERE original_transaction_id = \(otid)", as: String.self)
                #expect(sql == s.status(at: at).rawValue, "\(days) days on")
            }
            #expect(s.status(at: now.addingTimeInterval(58 * Self.day)) == .billingRetry)
            #expect(s.status(at: now.addingTimeInterval(60 * Self.day)) == .expired)
        }
    }
}
