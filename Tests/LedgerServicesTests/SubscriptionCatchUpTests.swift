import AppStoreStandIn
import AppleReceipts
import Foundation
import LedgerCore
import LedgerJSON
import LedgerServices
import LedgerStore
import LedgerTestSupport
import Testing

/// The catch-up of one subscription from Apple (issue 40, point 6), against the stand-in: what the
/// ledger missed is recorded once, Apple's status only when it changes what the ledger holds.
@Suite("Subscription catch-up from Apple's history and Get All Subscription Statuses")
struct SubscriptionCatchUpTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    let metadata = Data(#"{"appendedBy":"test"}"#.utf8)
    let user = UserID(unchecked: "u-subscriber")
    init() throws { apple = try TestApple() }

    static let month: TimeInterval = 30 * 86_400
    /// The subscription was bought 40 days ago: its first period has ended, its renewal runs.
    static let bought = Date(timeIntervalSinceNow: -40 * 86_400)

    var verifier: AppleProofVerifier {
        get throws {
            AppleProofVerifier(
                app: .init(bundleId: TestApple.bundleId, appAppleId: TestApple.appAppleId, environment: .sandbox),
                signedData: SignedDataVerifier(rootCertificates: try AppleRootCertificates.load(paths: [apple.rootFile])), verifyReceipt: nil)
        }
    }

    func makeCatchUp(_ services: ServiceAssembly, _ base: String) throws -> SubscriptionCatchUp {
        services.subscriptionCatchUp(api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base), logger: TestServer.logger), verifier: try verifier)
    }

    func period(_ id: String, of original: String = "7200001", number: Int) -> SignedTransactionPayload {
        let start = Self.bought.addingTimeInterval(Double(number - 1) * Self.month)
        return TestApple.subscriptionPeriod(id, of: original, purchaseDate: start, expires: start.addingTimeInterval(Self.month))
    }

    /// Apple's status of subscription `original` (1 active …), its latest period `latest`.
    func status(_ original: String, latest: SignedTransactionPayload, status: Int, renewal: SignedRenewalInfoPayload) async throws
        -> [AppStoreServerAPI.SubscriptionGroupIdentifierItem] {
        [.init(subscriptionGroupIdentifier: TestApple.subscriptionGroup, lastTransactions: [
            .init(status: status, originalTransactionId: original, signedTransactionInfo: try await apple.sign(latest),
                  signedRenewalInfo: try await apple.sign(renewal)),
        ])]
    }

    /// The ledger as the intake leaves a subscription bought through an order: the order paid by
    /// the purchase, and the subscription started by it (`subscription-started` and its first
    /// period, with the ids the intake names them by).
    func boughtThroughOrder(_ services: ServiceAssembly, _ start: SignedTransactionPayload) async throws {
        let transaction = try await verifier.transaction(signed: try await apple.sign(start))
        _ = try await services.orders.create(
            OrderID(unchecked: "order-sub"), OrderCreated(userId: user, productId: ProductID(unchecked: "pro.monthly")), tokenGiven: false,
            metadata: metadata)
        let paid = try await services.receipts.apply(transaction, claim: .init(userId: user, orderId: OrderID(unchecked: "order-sub")), metadata: metadata)
        #expect(paid.outcome == .matched)
        let id = start.transactionId
        let started = SubscriptionStarted(originalTransactionId: id, transaction: transaction, userId: user, familyShared: false)
        let metadata = metadata
        try await services.database.transaction { tx in
            _ = try await services.subscriptions.record([
                (.started(started), SubscriptionLedger.startedEventID(id)),
                (.period(SubscriptionPeriodRecorded(transaction: transaction, kind: .start)), SubscriptionLedger.periodEventID(id, transaction)),
            ], on: id, metadata: metadata, in: tx)
        }
    }

    func renewalChanges(_ services: ServiceAssembly, _ id: String) async throws -> [RecordedEvent] {
        try await services.events.readStream(StreamID.subscription(id)).filter { $0.type == SubscriptionEventType.renewalChanged.rawValue }
    }

    @Test("a refresh takes in the renewal the ledger missed and records Apple's renewal status once; a repeat records nothing")
    func missedRenewalAndStatus() async throws {
        try await withTestDatabase { db in
            let services = ServiceAssembly(database: db.database, purchaseAllowance: 400 * 86_400)
            let start = period("7200001", number: 1)
            let renewal = period("7200002", number: 2)
            try await boughtThroughOrder(services, start)
            // Apple's history of the customer: the subscription's two periods and a purchase of
            // something else, which is not this catch-up's.
            var other = TestApple.transaction("7200900", product: "gems.100")
            other.purchaseDate = Self.bought.millisecondsSince1970
            await standIn.setHistory("7200001", [
                .init(revision: "r1", hasMore: true, signedTransactions: [try await apple.sign(start), try await apple.sign(other)]),
                .init(revision: "r2", hasMore: false, signedTransactions: [try await apple.sign(renewal)]),
            ])
            // The customer turned auto-renew off; the ledger missed DID_CHANGE_RENEWAL_STATUS.
            let off = TestApple.renewalInfo("7200001", autoRenew: false)
            await standIn.setSubscriptionStatuses(for: ["7200001", "7200002"], try await status("7200001", latest: renewal, status: 1, renewal: off))
            try await standIn.run { base in
                let catchUp = try makeCatchUp(services, base)
                let first = try await catchUp.refresh(
                    originalTransactionId: "7200001", bundleId: BundleID(unchecked: TestApple.bundleId), environment: .sandbox, metadata: metadata)
                #expect(first.transactions == 2 && first.known == 1 && first.ingested.values.reduce(0, +) == 1, "\(first)")
                #expect(first.appleStatus == 1 && first.status == .recorded, "\(first)")
                #expect(try await services.pool.holders(of: [TransactionID(unchecked: "7200002")]).count == 1, "the renewal is taken in")
                #expect(try await services.pool.holders(of: [TransactionID(unchecked: "7200900")]).isEmpty, "another purchase is not")
                // Apple is asked for the customer's subscriptions alone, not every purchase.
                let queries = await standIn.historyQueries
                #expect(queries.first?["productType"] == "AUTO_RENEWABLE", "\(queries)")
                let row = try #require(try await services.subscriptionStore.subscription("7200001"))
                #expect(row.autoRenew == false)
                // Apple signs milliseconds and the rows keep microseconds: the end is within a millisecond or two of the fixture's.
                #expect(row.expiresAt.map { abs($0.timeIntervalSince(Self.bought.addingTimeInterval(2 * Self.month))) < 0.002 } == true, "\(String(describing: row.expiresAt)) vs \(Self.bought.addingTimeInterval(2 * Self.month))")
                #expect(row.status(at: Date()) == .active)
                #expect(row.status(at: Self.bought.addingTimeInterval(2 * Self.month + 1)) == .expired, "auto-renew off: no retry, no grace")
                let changes = try await renewalChanges(services, "7200001")
                #expect(changes.count == 1)
                let stored = try #require(changes.first)
                guard case .subscription(.renewalChanged(let body)) = try EventCoding.body(stream: stored.streamID, type: stored.type, data: stored.data) else {
                    Issue.record("not a subscription-renewal-changed: \(stored.type)")
                    return
                }
                #expect(body.notification == nil && body.appleStatus == 1 && body.renewalInfo?.autoRenew == false)
                #expect(stored.id == EventID.named("subscription-status", "7200001", String(off.signedDate)), "named by the renewal info's signedDate")

                // Asked again, twice at once: Apple says the same; nothing more is recorded.
                async let again = catchUp.refresh(originalTransactionId: "7200001", bundleId: nil, environment: nil, metadata: metadata)
                async let alsoAgain = catchUp.refresh(originalTransactionId: "7200001", bundleId: nil, environment: nil, metadata: metadata)
                let repeats = try await [again, alsoAgain]
                #expect(repeats.allSatisfy { $0.status == .unchanged && $0.known == 2 && $0.ingested.isEmpty }, "\(repeats)")
                #expect(try await renewalChanges(services, "7200001").count == 1)

                // The customer turns auto-renew back on: Apple's new renewal info is recorded.
                let on = TestApple.renewalInfo("7200001", autoRenew: true, signedDate: Date().addingTimeInterval(1))
                await standIn.setSubscriptionStatuses(for: ["7200001"], try await status("7200001", latest: renewal, status: 1, renewal: on))
                #expect(try await catchUp.refresh(originalTransactionId: "7200001", bundleId: nil, environment: nil, metadata: metadata).status == .recorded)
                #expect(try await services.subscriptionStore.subscription("7200001")?.autoRenew == true)
                #expect(try await renewalChanges(services, "7200001").count == 2)
            }
        }
    }

    @Test("a refresh reverses the refund of the latest period whose REFUND_REVERSED the ledger missed, once; Apple's status 5 read before gives way to 1")
    func missedRefundReversal() async throws {
        try await withTestDatabase { db in
            let services = ServiceAssembly(database: db.database, purchaseAllowance: 400 * 86_400)
            let start = period("7200101", of: "7200101", number: 1)
            let renewal = period("7200102", of: "7200101", number: 2)
            try await boughtThroughOrder(services, start)
            await standIn.setHistory("7200101", [.init(revision: "r1", hasMore: false, signedTransactions: [try await apple.sign(start), try await apple.sign(renewal)])])
            let info = TestApple.renewalInfo("7200101")
            await standIn.setSubscriptionStatuses(for: ["7200101"], try await status("7200101", latest: renewal, status: 1, renewal: info))
            try await standIn.run { base in
                let catchUp = try makeCatchUp(services, base)
                _ = try await catchUp.refresh(originalTransactionId: "7200101", bundleId: nil, environment: nil, metadata: metadata)
                // Apple refunds the renewal (the ledger hears it), then reverses the refund (the ledger does not).
                let transaction = try await verifier.transaction(signed: try await apple.sign(renewal))
                let refund = NotificationReceived(
                    notificationUUID: UUID(), notificationType: "REFUND", subtype: nil, transactionId: transaction.transactionId, signedDate: Date())
                _ = try await services.notifications.apply(
                    .init(record: refund, transaction: transaction, revocation: Revocation(date: Date(), reason: 0)), metadata: metadata)
                #expect(try await services.subscriptionStore.subscription("7200101")?.status(at: Date()) == .revoked)
                // Apple's answer signed before the refund knew nothing of it: nothing is reversed.
                let stale = try await catchUp.refresh(originalTransactionId: "7200101", bundleId: nil, environment: nil, metadata: metadata)
                #expect(!stale.refundReversed, "\(stale)")
                #expect(try await services.subscriptionStore.subscription("7200101")?.status(at: Date()) == .revoked)

                let reversed = TestApple.renewalInfo("7200101", signedDate: Date().addingTimeInterval(0.5))
                await standIn.setSubscriptionStatuses(for: ["7200101"], try await status("7200101", latest: renewal, status: 1, renewal: reversed))
                let first = try await catchUp.refresh(originalTransactionId: "7200101", bundleId: nil, environment: nil, metadata: metadata)
                #expect(first.refundReversed, "\(first)")
                let row = try #require(try await services.subscriptionStore.subscription("7200101"))
                #expect(row.status(at: Date()) == .active && row.periods.allSatisfy { $0.refundedAt == nil }, "\(row)")
                let again = try await catchUp.refresh(originalTransactionId: "7200101", bundleId: nil, environment: nil, metadata: metadata)
                #expect(!again.refundReversed, "once: \(again)")

                // Apple's status 5 (revoked) read once, then 1 (active): active again.
                let later = TestApple.renewalInfo("7200101", signedDate: Date().addingTimeInterval(1))
                await standIn.setSubscriptionStatuses(for: ["7200101"], try await status("7200101", latest: renewal, status: 5, renewal: later))
                _ = try await catchUp.refresh(originalTransactionId: "7200101", bundleId: nil, environment: nil, metadata: metadata)
                #expect(try await services.subscriptionStore.subscription("7200101")?.status(at: Date()) == .revoked)
                let latest = TestApple.renewalInfo("7200101", signedDate: Date().addingTimeInterval(2))
                await standIn.setSubscriptionStatuses(for: ["7200101"], try await status("7200101", latest: renewal, status: 1, renewal: latest))
                _ = try await catchUp.refresh(originalTransactionId: "7200101", bundleId: nil, environment: nil, metadata: metadata)
                #expect(try await services.subscriptionStore.subscription("7200101")?.status(at: Date()) == .active)
            }
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("Apple's status of a subscription the ledger has not started is not recorded: subscription-unknown, nothing half-written")
    func unknownSubscription() async throws {
        try await withTestDatabase { db in
            let services = ServiceAssembly(database: db.database, purchaseAllowance: 400 * 86_400)
            await standIn.setHistory("7300001", [.init(revision: "r1", hasMore: false, signedTransactions: [])])
            await standIn.setSubscriptionStatuses(
                for: ["7300001"], try await status("7300001", latest: period("7300001", of: "7300001", number: 1), status: 2,
                                                    renewal: TestApple.renewalInfo("7300001", autoRenew: false)))
            try await standIn.run { base in
                let summary = try await makeCatchUp(services, base).refresh(originalTransactionId: "7300001", bundleId: nil, environment: nil)
                #expect(summary.status == .subscriptionUnknown && summary.appleStatus == 2)
                #expect(try await services.events.readStream(StreamID.subscription("7300001")).isEmpty)
                #expect(try await services.subscriptionStore.subscription("7300001") == nil)
            }
        }
    }

    @Test("an id Apple does not know, and an answer whose renewal info does not verify, are refused and record nothing")
    func refusals() async throws {
        try await withTestDatabase { db in
            let services = ServiceAssembly(database: db.database, purchaseAllowance: 400 * 86_400)
            let start = period("7400001", of: "7400001", number: 1)
            try await boughtThroughOrder(services, start)
            let stranger = try TestApple()
            await standIn.setHistory("7400001", [.init(revision: "r1", hasMore: false, signedTransactions: [try await apple.sign(start)])])
            await standIn.setSubscriptionStatuses(for: ["7400001"], [.init(subscriptionGroupIdentifier: TestApple.subscriptionGroup, lastTransactions: [
                .init(status: 1, originalTransactionId: "7400001", signedTransactionInfo: try await apple.sign(start),
                      signedRenewalInfo: try await stranger.sign(TestApple.renewalInfo("7400001", autoRenew: false))),
            ])])
            try await standIn.run { base in
                let catchUp = try makeCatchUp(services, base)
                do {
                    _ = try await catchUp.refresh(originalTransactionId: "7499999", bundleId: nil, environment: nil)
                    Issue.record("an id Apple does not know was refreshed")
                } catch let error as AppStoreServerAPIError {
                    #expect(error.code == "apple-api-not-found" && error.appleErrorCode == 4_040_010)
                }
                do {
                    _ = try await catchUp.refresh(originalTransactionId: "7400001", bundleId: nil, environment: nil)
                    Issue.record("forged renewal info was taken")
                } catch let error as AppleVerificationError {
                    #expect(error.code == "invalid-certificate-chain")
                }
                #expect(try await renewalChanges(services, "7400001").isEmpty)
                #expect(try await services.subscriptionStore.subscription("7400001")?.autoRenew == nil)
            }
        }
    }
}
