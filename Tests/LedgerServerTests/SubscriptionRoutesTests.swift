import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerCore
import LedgerJSON
@testable import LedgerServer
import LedgerServices
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Synchronization
import Testing

/// Subscriptions as the ledger's streams record them (issue 40), for the routes to read.
enum Subscriptions {
    static let monthly = "pro.monthly"
    static let group = "21000001"
    static let past = Date(timeIntervalSince1970: 1_577_836_800) // 2020-01-01
    static let future = Date(timeIntervalSince1970: 4_070_908_800) // 2099-01-01
    static let day: TimeInterval = 86_400

    /// A signed auto-renewable transaction of subscription `original`, paying the period `line`.
    static func transaction(
        _ id: String, original: String, app: String = TwoApps.alpha, purchased: Date, expires: Date, line: String,
        product: String = monthly, ownership: String = "PURCHASED"
    ) -> AppleTransaction {
        AppleTransaction(
            transactionId: TransactionID(unchecked: id), originalTransactionId: original, productId: ProductID(unchecked: product),
            purchaseDate: purchased, environment: "Production", bundleId: app, inAppOwnershipType: ownership, price: "4.99",
            currency: "USD", format: .jws, receiptSha256: sha, type: "Auto-Renewable Subscription", expiresDate: expires,
            webOrderLineItemId: line, transactionReason: id == original ? "PURCHASE" : "RENEWAL", subscriptionGroupIdentifier: group)
    }

    /// Starts subscription `start.originalTransactionId` of `user` with its first period, then records `later`.
    static func start(
        _ db: TestDatabase, _ start: AppleTransaction, user: String = "u-1", familyShared: Bool = false, later: [SubscriptionEvent] = []
    ) async throws {
        let id = try #require(start.originalTransactionId)
        try await record(db, [
            .started(SubscriptionStarted(originalTransactionId: id, transaction: start, userId: UserID(unchecked: user), familyShared: familyShared)),
            .period(SubscriptionPeriodRecorded(transaction: start, kind: .start)),
        ] + later, on: id)
    }

    /// Records `events` on subscription `id` through the services' `SubscriptionLedger`.
    static func record(_ db: TestDatabase, _ events: [SubscriptionEvent], on id: String) async throws {
        let ledger = ServiceAssembly(database: db.database).subscriptions
        let named: [(SubscriptionEvent, EventID)] = events.map { event in
            switch event {
            case .started: (event, SubscriptionLedger.startedEventID(id))
            case .period(let body): (event, SubscriptionLedger.periodEventID(id, body.transaction))
            default: (event, EventID())
            }
        }
        _ = try await db.database.transaction { tx in
            try await ledger.record(named, on: id, metadata: Data("{}".utf8), in: tx).appended.count
        }
    }

    /// What Apple's renewal info said, as a catch-up records it.
    static func renewal(_ info: RenewalInfo) -> SubscriptionEvent {
        .renewalChanged(SubscriptionRenewalChanged(notification: nil, appleStatus: nil, renewalInfo: info, expiresDate: nil))
    }

    /// A transaction that pays no order waiting on its own stream (`reason`: `family-shared` or
    /// `subscription-renewal`), as the intake records it.
    static func waiting(_ db: TestDatabase, _ transaction: AppleTransaction, user: String, reason: String) async throws {
        let body = TransactionUnmatched(transaction: transaction, userId: UserID(unchecked: user), claimedOrderId: nil, reason: reason)
        try await db.append(
            [try EventCoding.newEvent(TransactionEvent.unmatched(body), id: EventID(), metadata: Data("{}".utf8))],
            to: transaction.transactionId.streamID)
    }

    /// A non-subscription transaction of `product` (Apple's `type`).
    static func purchase(_ id: String, product: String, type: String?, ownership: String = "FAMILY_SHARED") -> AppleTransaction {
        AppleTransaction(
            transactionId: TransactionID(unchecked: id), originalTransactionId: id, productId: ProductID(unchecked: product), purchaseDate: past,
            environment: "Production", bundleId: TwoApps.alpha, inAppOwnershipType: ownership, format: .jws, receiptSha256: sha, type: type)
    }

    /// An order of `user` in app alpha taken to `state` by client events (`transaction`: its receipt's).
    static func order(_ http: LedgerHTTP, _ id: String, product: String, transaction: String, through steps: [String]) async throws {
        var created = newOrder(id, product: product)
        created["bundleId"] = TwoApps.alpha
        let (status, answer) = try await http.send(.post, "/v1/orders", json: created)
        #expect(status == .created, "\(answer)")
        let data: [String: [String: Any]] = ["receipt-received": receipt(transaction, product: product), "verified": ["environment": "Production"]]
        for step in steps {
            let (appended, order) = try await http.send(.post, "/v1/orders/\(id)/events", json: ["type": step, "data": data[step] ?? [:]])
            #expect(appended == .created, "\(step): \(order)")
        }
    }
}

@Suite("Subscriptions and entitlements over HTTP")
struct SubscriptionRoutesTests {
    /// Items of `key` in `json`, by `by`.
    func items(_ json: [String: Any], _ key: String, by: String = "originalTransactionId") -> [String: [String: Any]] {
        Dictionary((json[key] as? [[String: Any]] ?? []).map { ($0[by] as? String ?? "?", $0) }, uniquingKeysWith: { first, _ in first })
    }

    @Test("a user's subscriptions: status from the facts and the time of the request, the order that bought each, own and family-shared")
    func userSubscriptions() async throws {
        try await withLiveApplication { http, db in
            try await TwoApps.add(db)
            let t = Subscriptions.self
            // Bought through order o-1, paid until 2099.
            try await t.order(http, "o-1", product: t.monthly, transaction: "5000001", through: ["receipt-received", "verified", "delivered"])
            try await t.start(db, t.transaction("5000001", original: "5000001", purchased: t.past, expires: t.future, line: "91"))
            // Its period ended in 2020 and Apple's EXPIRED never came: expired by the time alone.
            try await t.start(db, t.transaction("5000101", original: "5000101", purchased: t.past, expires: t.past + 30 * t.day, line: "92"))
            // Failed to renew: in its grace period until 2099, and in billing retry with no grace.
            try await t.start(db, t.transaction("5000201", original: "5000201", purchased: t.past, expires: t.past + 30 * t.day, line: "93"),
                              later: [t.renewal(RenewalInfo(autoRenew: true, gracePeriodExpiresDate: t.future, isInBillingRetryPeriod: true))])
            try await t.start(db, t.transaction("5000301", original: "5000301", purchased: t.past, expires: t.past + 30 * t.day, line: "94"),
                              later: [t.renewal(RenewalInfo(autoRenew: false, isInBillingRetryPeriod: true))])
            // A family member's access to another's subscription: no order bought it.
            try await t.start(db, t.transaction("5000401", original: "5000401", purchased: t.past, expires: t.future, line: "95", ownership: "FAMILY_SHARED"),
                              familyShared: true)
            // Another user's, and the same user id in another app (another user).
            try await t.start(db, t.transaction("5000501", original: "5000501", purchased: t.past, expires: t.future, line: "96"), user: "u-2")
            try await t.start(db, t.transaction("6000001", original: "6000001", app: TwoApps.beta, purchased: t.past, expires: t.future, line: "97"))

            let (status, json) = try await http.send(.get, "/v1/users/u-1/subscriptions?bundleId=\(TwoApps.alpha)")
            #expect(status == .ok, "\(json)")
            let found = items(json, "subscriptions")
            #expect(Set(found.keys) == ["5000001", "5000101", "5000201", "5000301", "5000401"])
            #expect(found.mapValues { $0["status"] as? String } == [
                "5000001": "active", "5000101": "expired", "5000201": "grace-period", "5000301": "billing-retry", "5000401": "active",
            ])
            let bought = try #require(found["5000001"])
            #expect(bought["orderId"] as? String == "o-1" && bought["productId"] as? String == t.monthly)
            #expect(bought["bundleId"] as? String == TwoApps.alpha && bought["environment"] as? String == "Production")
            #expect(bought["familyShared"] as? Bool == false && bought["expiresDate"] is String && bought["periods"] == nil)
            #expect(found["5000201"]?["gracePeriodExpiresDate"] is String && found["5000201"]?["autoRenew"] as? Bool == true)
            #expect(found["5000301"]?["autoRenew"] as? Bool == false)
            #expect(found["5000401"]?["familyShared"] as? Bool == true && found["5000401"]?["orderId"] is NSNull)
            let (beta, betaJSON) = try await http.send(.get, "/v1/users/u-1/subscriptions?bundleId=\(TwoApps.beta)")
            #expect(beta == .ok && Set(items(betaJSON, "subscriptions").keys) == ["6000001"])
            let (none, noneJSON) = try await http.send(.get, "/v1/users/u-9/subscriptions?bundleId=\(TwoApps.alpha)")
            #expect(none == .ok && (noneJSON["subscriptions"] as? [Any])?.isEmpty == true)
        }
    }

    @Test("entitlements: subscriptions active or in their grace period now, and the non-consumables bought or shared")
    func userEntitlements() async throws {
        try await withLiveApplication { http, db in
            try await TwoApps.add(db)
            let t = Subscriptions.self
            for (product, type) in [("lifetime", "non-consumable"), ("gems.100", "consumable"), ("lifetime.open", "non-consumable")] {
                let (set, answer) = try await http.send(.put, "/v1/products/\(product)", json: ["type": type, "bundleId": TwoApps.alpha])
                #expect(set == .ok, "\(answer)")
            }
            try await t.start(db, t.transaction("5100001", original: "5100001", purchased: t.past, expires: t.future, line: "81"))
            try await t.start(db, t.transaction("5100101", original: "5100101", purchased: t.past, expires: t.past + 30 * t.day, line: "82"))
            try await t.start(db, t.transaction("5100201", original: "5100201", purchased: t.past, expires: t.past + 30 * t.day, line: "83"),
                              later: [t.renewal(RenewalInfo(gracePeriodExpiresDate: t.future, isInBillingRetryPeriod: true))])
            // Apple still tries to bill, past any grace: not paid for, so no entitlement.
            try await t.start(db, t.transaction("5100301", original: "5100301", purchased: t.past, expires: t.past + 30 * t.day, line: "85"),
                              later: [t.renewal(RenewalInfo(isInBillingRetryPeriod: true))])
            // Owned: delivered (and finished) orders of non-consumables; not a consumable, not an order still open.
            try await t.order(http, "o-life", product: "lifetime", transaction: "7100001", through: ["receipt-received", "verified", "delivered", "finished"])
            try await t.order(http, "o-gems", product: "gems.100", transaction: "7100002", through: ["receipt-received", "verified", "delivered"])
            try await t.order(http, "o-open", product: "lifetime.open", transaction: "7100003", through: ["receipt-received"])
            // Shared by a family member: a non-consumable by Apple's signed type (the catalog is
            // silent), one whose share Apple revoked, and a shared subscription's transaction (the
            // member's subscription, listed there).
            try await t.waiting(db, t.purchase("7200001", product: "album", type: "Non-Consumable"), user: "u-1", reason: "family-shared")
            try await t.waiting(db, t.purchase("7200002", product: "album.two", type: "Non-Consumable"), user: "u-1", reason: "family-shared")
            let revoked = FamilyShareRevoked(
                transactionId: TransactionID(unchecked: "7200002"), orderId: nil, inAppOwnershipType: "FAMILY_SHARED",
                revocation: Revocation(date: t.past + t.day, type: .familyRevoke), notificationType: "REVOKE", notificationUUID: UUID())
            try await db.append([try EventCoding.newEvent(TransactionEvent.familyShareRevoked(revoked), id: EventID(), metadata: Data("{}".utf8))],
                                to: TransactionID(unchecked: "7200002").streamID)
            try await t.waiting(db, t.transaction("7200003", original: "7200003", purchased: t.past, expires: t.future, line: "84", ownership: "FAMILY_SHARED"),
                                user: "u-1", reason: "family-shared")

            let (status, json) = try await http.send(.get, "/v1/users/u-1/entitlements?bundleId=\(TwoApps.alpha)")
            #expect(status == .ok, "\(json)")
            #expect(json["userId"] as? String == "u-1")
            let subscriptions = items(json, "subscriptions")
            #expect(subscriptions.mapValues { $0["status"] as? String } == ["5100001": "active", "5100201": "grace-period"])
            let held = items(json, "nonConsumables", by: "transactionId")
            #expect(Set(held.keys) == ["7100001", "7200001"], "\(json)")
            #expect(held["7100001"]?["source"] as? String == "purchase" && held["7100001"]?["orderId"] as? String == "o-life")
            #expect(held["7100001"]?["productId"] as? String == "lifetime")
            #expect(held["7200001"]?["source"] as? String == "family-shared" && held["7200001"]?["orderId"] is NSNull)
            #expect(held["7200001"]?["productId"] as? String == "album" && held["7200001"]?["bundleId"] as? String == TwoApps.alpha)
            // Another app's view of the same user id holds none of it.
            let (beta, betaJSON) = try await http.send(.get, "/v1/users/u-1/entitlements?bundleId=\(TwoApps.beta)")
            #expect(beta == .ok && (betaJSON["subscriptions"] as? [Any])?.isEmpty == true && (betaJSON["nonConsumables"] as? [Any])?.isEmpty == true)
        }
    }

    @Test("one subscription with its history; another app's or an unknown one is 404; refresh must be true or false")
    func oneSubscription() async throws {
        try await withLiveApplication { http, db in
            try await TwoApps.add(db)
            let t = Subscriptions.self
            let renewal = t.transaction("5200002", original: "5200001", purchased: t.past + 30 * t.day, expires: t.future, line: "72")
            try await t.start(db, t.transaction("5200001", original: "5200001", purchased: t.past, expires: t.past + 30 * t.day, line: "71"), later: [
                .period(SubscriptionPeriodRecorded(transaction: renewal, kind: .renewal)),
                .periodRefunded(SubscriptionPeriodRefunded(
                    transactionId: TransactionID(unchecked: "5200001"), periodKey: "71", revocation: Revocation(date: t.past + t.day),
                    notificationType: "REFUND", notificationUUID: UUID())),
            ])
            let (status, json) = try await http.send(.get, "/v1/subscriptions/5200001")
            #expect(status == .ok, "\(json)")
            #expect(json["status"] as? String == "active" && json["userId"] as? String == "u-1" && json["orderId"] is NSNull)
            let periods = try #require(json["periods"] as? [[String: Any]])
            #expect(periods.map { $0["periodKey"] as? String } == ["71", "72"])
            #expect(periods.map { $0["kind"] as? String } == ["subscription-start", "subscription-renewal"])
            #expect(periods.map { $0["transactionId"] as? String } == ["5200001", "5200002"])
            #expect(periods[0]["refundedAt"] is String && periods[1]["refundedAt"] is NSNull)
            #expect(periods[1]["price"] as? String == "4.99" && periods[1]["currency"] as? String == "USD" && periods[1]["expiresDate"] is String)
            let (asFalse, _) = try await http.send(.get, "/v1/subscriptions/5200001?refresh=false")
            #expect(asFalse == .ok)

            let (unknown, unknownJSON) = try await http.send(.get, "/v1/subscriptions/5299999")
            #expect(unknown == .notFound && errorOf(unknownJSON)["code"] as? String == "subscription-not-found")
            let (unknownRefresh, unknownRefreshJSON) = try await http.send(.get, "/v1/subscriptions/5299999?refresh=true")
            #expect(unknownRefresh == .notFound && errorOf(unknownRefreshJSON)["code"] as? String == "subscription-not-found")
            for bad in ["yes", "1", "TRUE", ""] {
                let (refused, refusedJSON) = try await http.send(.get, "/v1/subscriptions/5200001?refresh=\(bad)")
                #expect(refused == .badRequest && errorOf(refusedJSON)["field"] as? String == "refresh", "\(bad): \(refusedJSON)")
            }
            // A server that cannot ask Apple says so, and still answers without refresh.
            let (unavailable, unavailableJSON) = try await http.send(.get, "/v1/subscriptions/5200001?refresh=true")
            #expect(unavailable == .serviceUnavailable && errorOf(unavailableJSON)["code"] as? String == "subscription-refresh-unavailable")

            // Keys are scoped to apps: another app's subscription does not exist for it.
            let keys = APIKeyStore(database: db.database)
            let alpha = try await keys.create(name: "alpha-reader", scopes: [.read], apps: [try BundleID(TwoApps.alpha)])
            let beta = try await keys.create(name: "beta-reader", scopes: [.read], apps: [try BundleID(TwoApps.beta)])
            let (seen, _) = try await http.send(.get, "/v1/subscriptions/5200001", key: .some(alpha))
            #expect(seen == .ok)
            for uri in ["/v1/subscriptions/5200001", "/v1/subscriptions/5200001?refresh=true"] {
                let (hidden, hiddenJSON) = try await http.send(.get, uri, key: .some(beta))
                #expect(hidden == .notFound && errorOf(hiddenJSON)["code"] as? String == "subscription-not-found", "\(uri)")
            }
        }
    }

    @Test("user routes: a key sees its apps' rows alone; bundleId names a held app the key reaches, and is needed where several could be meant")
    func appScoping() async throws {
        try await withLiveApplication { http, db in
            try await TwoApps.add(db)
            let t = Subscriptions.self
            try await t.start(db, t.transaction("5300001", original: "5300001", purchased: t.past, expires: t.future, line: "61"))
            try await t.start(db, t.transaction("6300001", original: "6300001", app: TwoApps.beta, purchased: t.past, expires: t.future, line: "62"))
            let keys = APIKeyStore(database: db.database)
            let alpha = try await keys.create(name: "alpha-reader", scopes: [.read], apps: [try BundleID(TwoApps.alpha)])
            let both = try await keys.create(name: "studio", scopes: [.read], apps: [try BundleID(TwoApps.alpha), try BundleID(TwoApps.beta)])
            for route in ["subscriptions", "entitlements"] {
                let (own, ownJSON) = try await http.send(.get, "/v1/users/u-1/\(route)", key: .some(alpha))
                #expect(own == .ok && Set(items(ownJSON, "subscriptions").keys) == ["5300001"], "\(route): \(ownJSON)")
                let (named, namedJSON) = try await http.send(.get, "/v1/users/u-1/\(route)?bundleId=COM.example.alpha", key: .some(alpha))
                #expect(named == .ok && Set(items(namedJSON, "subscriptions").keys) == ["5300001"], "\(route): \(namedJSON)")
                let (other, otherJSON) = try await http.send(.get, "/v1/users/u-1/\(route)?bundleId=\(TwoApps.beta)", key: .some(alpha))
                #expect(other == .forbidden && errorOf(otherJSON)["code"] as? String == "app-not-allowed", "\(route): \(otherJSON)")
                // The ledger holds two apps: a key of every app, or of both, names one.
                for key in [http.key, both] {
                    let (ambiguous, ambiguousJSON) = try await http.send(.get, "/v1/users/u-1/\(route)", key: .some(key))
                    #expect(ambiguous == .badRequest && errorOf(ambiguousJSON)["code"] as? String == "bundle-id-required", "\(route): \(ambiguousJSON)")
                }
                let (malformed, malformedJSON) = try await http.send(.get, "/v1/users/u-1/\(route)?bundleId=com%20example")
                #expect(malformed == .badRequest && errorOf(malformedJSON)["field"] as? String == "bundleId", "\(route): \(malformedJSON)")
                let (unknown, unknownJSON) = try await http.send(.get, "/v1/users/u-1/\(route)?bundleId=com.example.gamma")
                #expect(unknown == .badRequest && errorOf(unknownJSON)["code"] as? String == "unknown-app", "\(route): \(unknownJSON)")
            }
            let (writer, _) = try await http.send(.get, "/v1/users/u-1/subscriptions?bundleId=\(TwoApps.alpha)",
                                                  key: .some(try await keys.create(name: "appender", scopes: [.append])))
            #expect(writer == .forbidden)
        }
    }

    @Test("in a ledger of one app, bundleId may be left out")
    func oneApp() async throws {
        try await withLiveApplication { http, db in
            _ = try await AppCatalog(database: db.database).add(try BundleID(TwoApps.alpha), AppChanges())
            let t = Subscriptions.self
            try await t.start(db, t.transaction("5400001", original: "5400001", purchased: t.past, expires: t.future, line: "51"))
            let (status, json) = try await http.send(.get, "/v1/users/u-1/subscriptions")
            #expect(status == .ok && Set(items(json, "subscriptions").keys) == ["5400001"], "\(json)")
        }
    }

    @Test("refresh=true asks the catch-up in the subscription's app and environment before reading, also for one known only by a waiting renewal")
    func refreshSeam() async throws {
        try await withTestDatabase { db in
            try await TwoApps.add(db)
            let t = Subscriptions.self
            let asked = AskedRefreshes()
            let start = t.transaction("5500001", original: "5500001", purchased: t.past, expires: t.past + 30 * t.day, line: "41")
            let missed = t.transaction("5500002", original: "5500001", purchased: t.past + 30 * t.day, expires: t.future, line: "42")
            try await t.start(db, start)
            // A renewal whose start the ledger never saw: it waits, and the catch-up finds the start.
            let lateStart = t.transaction("5600001", original: "5600001", app: TwoApps.beta, purchased: t.past, expires: t.past + 30 * t.day, line: "43")
            let waiting = t.transaction("5600002", original: "5600001", app: TwoApps.beta, purchased: t.past + 30 * t.day, expires: t.future, line: "44")
            try await t.waiting(db, waiting, user: "u-1", reason: AppleTransactionRecord.subscriptionRenewalReason)
            // The catch-up stands in for Apple's answer: what the ledger missed, recorded.
            let refresh: SubscriptionRefresh = { id, app, environment in
                asked.add("\(id) \(app?.rawValue ?? "-") \(environment ?? "-")")
                if id == "5500001" { try await Subscriptions.record(db, [.period(SubscriptionPeriodRecorded(transaction: missed, kind: .renewal))], on: id) }
                if id == "5600001" {
                    try await Subscriptions.start(db, lateStart, later: [.period(SubscriptionPeriodRecorded(transaction: waiting, kind: .renewal))])
                }
            }
            let services = ServiceAssembly(database: db.database)
            let verifier = try LedgerConfiguration().apple.verifier(logger: TestServer.logger)
            let router = buildRouter(
                services: services, migrator: Migrator(logger: TestServer.logger), apple: verifier,
                appStoreServerAPI: LazyAppStoreServerAPI(catalog: AppCatalog(database: db.database), hosts: LedgerConfiguration().apple.appStoreServerAPIHosts(),
                                                         logger: TestServer.logger),
                configuration: LedgerConfiguration(), health: nil, metrics: LedgerMetrics(), subscriptionRefresh: refresh)
            let key = try await APIKeyStore(database: db.database).create(name: "reader", scopes: [.read])
            try await withLiveServer(Application(router: router, logger: TestServer.logger)) { client in
                let http = LedgerHTTP(client: client, key: key)
                let (before, beforeJSON) = try await http.send(.get, "/v1/subscriptions/5500001")
                #expect(before == .ok && beforeJSON["status"] as? String == "expired" && asked.all.isEmpty)
                let (after, afterJSON) = try await http.send(.get, "/v1/subscriptions/5500001?refresh=true")
                #expect(after == .ok && afterJSON["status"] as? String == "active", "\(afterJSON)")
                #expect((afterJSON["periods"] as? [[String: Any]])?.map { $0["periodKey"] as? String } == ["41", "42"])
                let (late, lateJSON) = try await http.send(.get, "/v1/subscriptions/5600001?refresh=true")
                #expect(late == .ok && lateJSON["bundleId"] as? String == TwoApps.beta && lateJSON["status"] as? String == "active", "\(lateJSON)")
                #expect(asked.all == ["5500001 \(TwoApps.alpha) Production", "5600001 \(TwoApps.beta) Production"])
            }
        }
    }

    @Test("the catalog holds each product's type and an auto-renewable product's group; bad values are 400s naming the field")
    func productTypes() async throws {
        try await withLiveApplication { http, _ in
            let (set, product) = try await http.send(.put, "/v1/products/\(Subscriptions.monthly)", json: [
                "type": "auto-renewable", "subscriptionGroup": Subscriptions.group, "price": "4.99", "currency": "USD",
            ])
            #expect(set == .ok && product["type"] as? String == "auto-renewable" && product["subscriptionGroup"] as? String == Subscriptions.group)
            try await http.send(.put, "/v1/products/lifetime", json: ["type": "non-consumable"])
            try await http.send(.put, "/v1/products/gems.100", json: ["price": "0.99", "currency": "USD"])
            let (_, list) = try await http.send(.get, "/v1/products")
            let listed = Dictionary(uniqueKeysWithValues: (list["products"] as? [[String: Any]] ?? []).map { ($0["productId"] as? String ?? "?", $0) })
            #expect(listed[Subscriptions.monthly]?["subscriptionGroup"] as? String == Subscriptions.group)
            #expect(listed["lifetime"]?["type"] as? String == "non-consumable" && listed["lifetime"]?["subscriptionGroup"] is NSNull)
            #expect(listed["gems.100"]?["type"] is NSNull, "the catalog is silent: Apple's signed type decides")
            let refused: [([String: Any], String)] = [
                (["type": "subscription"], "type"),
                (["type": "Auto-Renewable Subscription"], "type"),
                (["type": "non-consumable", "subscriptionGroup": "21000001"], "subscriptionGroup"),
                (["subscriptionGroup": "21000001"], "subscriptionGroup"),
                (["type": "auto-renewable", "subscriptionGroup": ""], "subscriptionGroup"),
            ]
            for (body, field) in refused {
                let (status, error) = try await http.send(.put, "/v1/products/\(Subscriptions.monthly)", json: body)
                #expect(status == .badRequest && errorOf(error)["field"] as? String == field, "\(body): \(error)")
            }
            let (_, kept) = try await http.send(.get, "/v1/products")
            let still = (kept["products"] as? [[String: Any]])?.first { $0["productId"] as? String == Subscriptions.monthly }
            #expect(still?["type"] as? String == "auto-renewable", "nothing refused was stored")
        }
    }

    @Test("dashboards.subscriptions shows support each subscription with its status now and the order that bought it")
    func dashboard() async throws {
        try await withLiveApplication { http, db in
            try await TwoApps.add(db)
            let t = Subscriptions.self
            try await t.order(http, "o-1", product: t.monthly, transaction: "5700001", through: ["receipt-received", "verified"])
            try await t.start(db, t.transaction("5700001", original: "5700001", purchased: t.past, expires: t.future, line: "31"))
            try await t.start(db, t.transaction("5700101", original: "5700101", purchased: t.past, expires: t.past + 30 * t.day, line: "32"))
            let connection = try await db.connect()
            try await connection.query("SET ROLE ledger_reader", logger: TestServer.logger)
            let rows = try await connection.query(
                "SELECT original_transaction_id, status, order_id, periods FROM dashboards.subscriptions ORDER BY original_transaction_id",
                logger: TestServer.logger)
            var seen: [String] = []
            for try await (id, status, order, periods) in rows.decode((String, String, String?, Int64).self) {
                seen.append("\(id):\(status):\(order ?? "-"):\(periods)")
            }
            #expect(seen == ["5700001:active:o-1:1", "5700101:expired:-:1"])
            try await connection.close()
        }
    }
}

/// What the catch-up was asked, in order.
final class AskedRefreshes: Sendable {
    private let asked = Mutex<[String]>([])
    func add(_ text: String) { asked.withLock { $0.append(text) } }
    var all: [String] { asked.withLock { $0 } }
}
