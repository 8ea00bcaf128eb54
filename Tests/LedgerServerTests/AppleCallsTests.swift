import AppStoreStandIn
import AppleReceipts
import Foundation
import HTTPTypes
import LedgerCore
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Testing

/// Finish at Apple after delivery and the account token after a pairing, against the stand-in.
@Suite("Calls to Apple after delivery and pairing")
struct AppleCallsTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    /// The receipts application with the API at the stand-in and the switches as given; `test`
    /// gets a pass of the calls it can run when it wants (the server's own runs every 10 s).
    func withCalls(
        finish: Bool, setToken: Bool, _ test: @Sendable @escaping (LedgerHTTP, TestDatabase, AppleCalls) async throws -> Void
    ) async throws {
        try await withAppleAPIApplication(apple, standIn, configure: { configuration in
            configuration.finishAfterDelivery = finish
            configuration.setTokenAfterPairing = setToken
        }) { http, db, base in
            var calls = AppleCalls(
                api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base), logger: TestServer.logger),
                writer: LedgerWriter(database: Database(client: db.client, logger: TestServer.logger)))
            calls.backoff = 0
            try await test(http, db, calls)
        }
    }

    /// Creates an order, proves its purchase with its token, and delivers it.
    func deliver(_ http: LedgerHTTP, order: String, transaction: String) async throws {
        let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder(order, user: "u-\(order)"))
        let token = UUID(uuidString: created["appAccountToken"] as? String ?? "")
        let jws = try await apple.sign(TestApple.transaction(transaction, appAccountToken: token))
        let (_, proof) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": jws])
        #expect(proof["outcome"] as? String == "matched")
        let (status, _) = try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "delivered", "data": [:] as [String: Any]])
        #expect(status == .ok || status == .created)
    }

    @Test("a delivered order's transaction is finished at Apple once, after a 500 storm is waited out; recorded on its stream")
    func finishAfterDelivery() async throws {
        try await withCalls(finish: true, setToken: false) { http, db, calls in
            try await deliver(http, order: "o-fin", transaction: "7900001")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls WHERE kind = 'finish'", as: Int.self) == 1)
            await standIn.queue(Array(repeating: .serverError, count: 4))
            #expect(try await calls.run() == ["retrying": 1])
            #expect(try await scalar(db, "SELECT attempts FROM apple_calls", as: Int.self) == 1)
            #expect(try await calls.run() == ["done": 1])
            #expect(try await calls.run() == [:], "nothing left to call")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9: the queue's triggers change no projection")
            let finished = await standIn.writes.filter { $0.method == "POST" && $0.path == "/inApps/v1/transactions/7900001/finish" }
            #expect(finished.count == 1)
            #expect(try await scalar(db, "SELECT data->>'outcome' FROM events WHERE stream_id = 'apple-calls-7900001' AND type = 'apple-transaction-finished'", as: String.self) == "done")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) == 0)
        }
    }

    @Test("switched off (the default), a delivery queues no call to Apple")
    func offByDefault() async throws {
        try await withCalls(finish: false, setToken: false) { http, db, calls in
            try await deliver(http, order: "o-off", transaction: "7900002")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) == 0)
            #expect(try await calls.run() == [:])
            #expect(await standIn.writes.isEmpty)
        }
    }

    @Test("a reconciler's pairing sets the order's token at Apple; Apple's refusal of a family-shared one is recorded, not retried")
    func tokenAfterPairing() async throws {
        try await withCalls(finish: false, setToken: true) { http, db, calls in
            for (order, transaction) in [("o-tok", "7900003"), ("o-fam", "7900004")] {
                let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder(order, user: "u-\(order)"))
                #expect(created["orderId"] as? String == order)
                let jws = try await apple.sign(TestApple.transaction(transaction))
                let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-\(order)", "signedTransaction": jws])
                #expect(pooled["outcome"] as? String == "unmatched")
            }
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) == 0, "pooling queues nothing")
            let (_, pass) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(pass["paired"] as? Int == 2)
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls WHERE kind = 'set-token'", as: Int.self) == 2)
            await standIn.refuseAccountToken("7900004", errorCode: 4_000_185)
            #expect(try await calls.run() == ["done": 1, "refused": 1])
            let token = try #require(try await scalar(db, "SELECT app_account_token::text FROM orders WHERE order_id = 'o-tok'", as: String.self))
            let set = await standIn.writes.filter { $0.path == "/inApps/v1/transactions/7900003/appAccountToken" }
            #expect(set.count == 1 && set.first?.body == #"{"appAccountToken":"\#(token)"}"#)
            #expect(try await scalar(db, "SELECT data->>'appleErrorCode' FROM events WHERE stream_id = 'apple-calls-7900004'", as: String.self) == "4000185")
            #expect(try await calls.run() == [:], "a refusal is not tried again")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9: the queue's triggers change no projection")
        }
    }
}
