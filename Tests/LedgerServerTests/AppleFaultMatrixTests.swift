import AppleReceipts
import AppStoreStandIn
import Foundation
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore
import LedgerTestSupport
import NIOCore
import PostgresNIO
import Testing

/// Each call #25 makes to Apple, against each kind of fault the stand-in plays: nothing applied
/// twice, nothing lost, Apple's `Retry-After` honoured.
@Suite("Every call of the refund defence against each fault: 429 with Retry-After, 500, slow, malformed")
struct AppleFaultMatrixTests {
    enum Call: String, CaseIterable, Sendable {
        case consumption, finish, setToken, notificationHistory, refundHistory
    }

    enum Fault: String, CaseIterable, Sendable {
        case rateLimited, serverError, slow, malformed

        var played: AppStoreServerStandIn.Fault {
            switch self {
            case .rateLimited: .tooManyRequests(after: .seconds(1))
            case .serverError: .serverError
            // Held past the client's time-out (`timeout`): the first try is abandoned.
            case .slow: .held
            case .malformed: .malformed
            }
        }

        /// The client's time-out: one the held try outlasts, and the retry's answer comes well
        /// within on a loaded machine; else generous.
        var timeout: TimeAmount { self == .slow ? .seconds(10) : .seconds(30) }
    }

    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    @Test("each call, each fault", arguments: Call.allCases, Fault.allCases)
    func callUnderFault(_ call: Call, _ fault: Fault) async throws {
        try await withAppleAPIApplication(apple, standIn, configure: { configuration in
            configuration.appleCallsInterval = 0
            configuration.backfillNotificationsAtStart = false
            configuration.refundCatchUpInterval = 0
        }) { http, db, base in
            try await http.send(.post, "/v1/orders", json: newOrder("m-1", user: "u-m"))
            let sold = TestApple.transaction("8800001")
            let (_, verified) = try await http.send(.post, "/v1/receipts", json: ["orderId": "m-1", "signedTransaction": try await apple.sign(sold)])
            #expect(verified["state"] as? String == "verified")
            let started = ContinuousClock.now
            switch call {
            case .consumption, .finish, .setToken:
                try await write(call, fault, http, db, base)
            case .notificationHistory:
                try await backfillNotifications(fault, db, base, sold: sold)
            case .refundHistory:
                try await catchUpRefunds(fault, http, db, base, sold: sold)
            }
            if fault == .rateLimited {
                #expect(ContinuousClock.now - started >= .seconds(1), "Apple's Retry-After honoured")
            }
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    /// A write Apple applies as a whole: the client waits out a 429, retries a 500 and an
    /// abandoned slow try, and takes any 2xx (a malformed body included) as done. Made and
    /// recorded once.
    func write(_ call: Call, _ fault: Fault, _ http: LedgerHTTP, _ db: TestDatabase, _ base: String) async throws {
        var switches = AppleCallQueue.Switches()
        let kind: String
        let recorded: PostgresQuery
        switch call {
        case .consumption:
            switches.consumption = true
            kind = "consumption"
            let notification = try await apple.notification("CONSUMPTION_REQUEST", transaction: TestApple.transaction("8800001"))
            try await http.notifyApple(notification)
            recorded = "SELECT count(*)::int FROM events WHERE stream_id = 'order-m-1' AND type = 'consumption-answer' AND data->>'outcome' = 'sent'"
        case .finish:
            switches.finishAfterDelivery = true
            kind = "finish"
            try await http.send(.post, "/v1/orders/m-1/events", json: ["type": "delivered", "data": [:]])
            recorded = "SELECT count(*)::int FROM events WHERE stream_id = 'apple-calls-8800001' AND data->>'outcome' = 'sent'"
        default:
            switches.setTokenAfterPairing = true
            kind = "set-token"
            try await http.send(.post, "/v1/orders", json: newOrder("m-2", user: "u-m"))
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-m", "signedTransaction": try await apple.sign(TestApple.transaction("8800002"))])
            let (_, pass) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(pass["paired"] as? Int == 1)
            recorded = "SELECT count(*)::int FROM events WHERE stream_id = 'apple-calls-8800002' AND data->>'outcome' = 'sent'"
        }
        await standIn.queue([fault.played])
        let calls = appleCalls(standIn, base, db, switches: switches, timeout: fault.timeout)
        let summary = try await drain(calls, db)
        #expect(summary.calls == ["\(kind) sent": 1], "\(summary)")
        #expect(try await scalar(db, recorded, as: Int.self) == 1)
        #expect(try await drain(calls, db).calls.isEmpty, "nothing made twice")
        #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) == 0, "nothing left")
    }

    /// Get Notification History: a malformed page stops the backfill before it; the next one
    /// resumes. The missed notification is applied once.
    func backfillNotifications(_ fault: Fault, _ db: TestDatabase, _ base: String, sold: SignedTransactionPayload) async throws {
        var refunded = sold
        refunded.revocationDate = Date().millisecondsSince1970
        await standIn.setNotifications([.init(revision: "end", hasMore: false, signedTransactions: [
            try await apple.notification("REFUND", transaction: refunded),
        ])])
        let backfill = secondServer(db).notificationBackfill(
            api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base, timeout: fault.timeout), logger: TestServer.logger),
            verifier: try trusting(apple).apple.verifier(logger: TestServer.logger))
        await standIn.queue([fault.played])
        var applied = 0
        do {
            applied += try await backfill.run(since: Date(timeIntervalSinceNow: -3600)).applied
            #expect(fault != .malformed)
        } catch let error as AppStoreServerAPIError {
            #expect(fault == .malformed && error.code == "apple-api-answer-malformed", "\(error)")
            let resumed = try await backfill.run()
            applied += resumed.applied
        }
        #expect(applied == 1)
        let events = try await eventCount(db)
        let again = try await backfill.run(since: Date(timeIntervalSinceNow: -3600))
        let after = try await eventCount(db)
        #expect(again.applied == 0 && again.repeated == 1 && after == events, "nothing applied twice")
        #expect(try await scalar(db, "SELECT state FROM orders WHERE order_id = 'm-1'", as: String.self) == "refunded")
    }

    /// Get Refund History: a malformed page fails the account and keeps its cursor; the next
    /// pass applies the refund, once.
    func catchUpRefunds(_ fault: Fault, _ http: LedgerHTTP, _ db: TestDatabase, _ base: String, sold: SignedTransactionPayload) async throws {
        var refunded = sold
        refunded.revocationDate = Date().millisecondsSince1970
        await standIn.setRefunds("8800001", [.init(revision: "r1", hasMore: false, signedTransactions: [try await apple.sign(refunded)])])
        let configuration = trusting(apple)
        let catchUp = configuration.refundCatchUp(
            secondServer(db), api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base, timeout: fault.timeout), logger: TestServer.logger),
            verifier: try configuration.apple.verifier(logger: TestServer.logger))
        await standIn.queue([fault.played])
        let first = try await catchUp.run()
        var applied = first.applied
        if fault == .malformed {
            #expect(first.failed == 1 && first.failures == ["apple-api-answer-malformed": 1] && applied == 0, "\(first)")
            applied += try await catchUp.run().applied
        }
        #expect(applied == 1)
        let events = try await eventCount(db)
        let again = try await catchUp.run(all: true)
        let after = try await eventCount(db)
        #expect(again.applied == 0 && after == events, "nothing applied twice")
        let (_, order) = try await http.send(.get, "/v1/orders/m-1")
        #expect(order["state"] as? String == "refunded")
    }
}
