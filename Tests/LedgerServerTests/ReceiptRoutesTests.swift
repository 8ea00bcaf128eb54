import AppStoreStandIn
import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// A live ledger that trusts `apple`'s root, for the test app in the sandbox (`configure` may
/// set other environments, and then the app id production needs).
func withReceiptsApplication(
    _ apple: TestApple, production: String? = nil, sandbox: String? = nil,
    configure: @Sendable @escaping (inout LedgerConfiguration) -> Void = { _ in },
    _ test: @Sendable @escaping (LedgerHTTP, TestDatabase) async throws -> Void
) async throws {
    try await withLiveApplication(configure: { configuration in
        // The reconciler pairs what it finds at once (tests of the settle window set their own).
        configuration.reconciler.settle = 0
        configuration.apple.environments = [.sandbox]
        configure(&configuration)
        configuration.apple.rootCertificateFiles = [apple.rootFile]
        configuration.apple.bundleID = TestApple.bundleId
        if let production { configuration.apple.verifyReceiptURL = production }
        if let sandbox { configuration.apple.verifyReceiptSandboxURL = sandbox }
    }, test)
}

/// For tests whose purchases are dated long before the orders they pay (a subscription bought
/// months ago, through an order the test can only create now): the purchase-date guard's
/// allowance, the reconciler's clock skew, a year and more.
@Sendable func olderPurchases(_ configuration: inout LedgerConfiguration) {
    configuration.reconciler.clockSkew = olderPurchasesAllowance
}

/// The allowance `olderPurchases` sets.
let olderPurchasesAllowance: TimeInterval = 400 * 86_400

/// `withReceiptsApplication` with the App Store Server API at `standIn` (its key in a file for
/// the run); `test` also gets the stand-in's base URL.
func withAppleAPIApplication(
    _ apple: TestApple, _ standIn: AppStoreServerStandIn, configure: @Sendable @escaping (inout LedgerConfiguration) -> Void = { _ in },
    _ test: @Sendable @escaping (LedgerHTTP, TestDatabase, _ standInURL: String) async throws -> Void
) async throws {
    let keyFile = NSTemporaryDirectory() + "iap-key-\(UUID()).p8"
    try standIn.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
    defer { try? FileManager.default.removeItem(atPath: keyFile) }
    try await standIn.run { base in
        try await withReceiptsApplication(apple, configure: { configuration in
            configuration.apple.apiKeyID = AppStoreServerStandIn.keyID
            configuration.apple.apiIssuerID = AppStoreServerStandIn.issuerID
            configuration.apple.apiPrivateKeyFile = keyFile
            configuration.apple.apiURL = base
            configuration.recoveryInterval = 0
            // Background work that asks Apple is the business of the tests that turn it on.
            configuration.backfillNotificationsAtStart = false
            configuration.refundCatchUpInterval = 0
            configure(&configuration)
        }, { http, db in try await test(http, db, base) })
    }
}

/// A pool row as a ledger before migration 029 left it after a reversed refund (`unmatched`),
/// then the migration applied again: what it makes of the row.
func statusAfterMigration029(_ db: TestDatabase, transaction: String) async throws -> String? {
    try await db.client.query("UPDATE apple_transactions SET status = 'unmatched' WHERE transaction_id = \(transaction)", logger: TestServer.logger)
    try await db.client.query("DELETE FROM schema_migrations WHERE name = '029_reversed_refunds_keep_holds.sql'", logger: TestServer.logger)
    #expect(try await Migrator(logger: TestServer.logger).migrate(db.client) == ["029_reversed_refunds_keep_holds.sql"])
    return try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = \(transaction)", as: String.self)
}

/// One value of a query's first row.
func scalar<T: PostgresDecodable & Sendable>(_ db: TestDatabase, _ query: PostgresQuery, as _: T.Type = T.self) async throws -> T? {
    for try await value in try await db.client.query(query, logger: TestServer.logger).decode(T.self) { return value }
    return nil
}

func eventCount(_ db: TestDatabase) async throws -> Int {
    try await scalar(db, "SELECT count(*)::int FROM events", as: Int.self) ?? -1
}

@Suite("POST /v1/receipts: signed transactions tied to orders, pooled, or refused")
struct ReceiptRoutesTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("a proof naming its order: receipt-received and verified appended, the transaction claimed; re-sending it appends nothing")
    func matchedByOrderID() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            let jws = try await apple.sign(TestApple.transaction("1000001"))
            let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "orderId": "o-1", "signedTransaction": jws])
            #expect(status == .ok)
            #expect(answer["outcome"] as? String == "matched")
            #expect(answer["orderId"] as? String == "o-1")
            #expect(answer["state"] as? String == "verified")
            #expect(answer["finishTransaction"] as? Bool == false)
            let (_, order) = try await http.send(.get, "/v1/orders/o-1")
            let events = order["events"] as? [[String: Any]] ?? []
            #expect(events.map { $0["type"] as? String } == ["created", "receipt-received", "verified"])
            let received = events[1]["data"] as? [String: Any] ?? [:]
            #expect(received["matchedBy"] as? String == "applicationUsername")
            #expect(received["format"] as? String == "jws")
            #expect(order["transactionId"] as? String == "1000001")
            let count = try await eventCount(db)
            for _ in 0..<5 {
                let (_, again) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "orderId": "o-1", "signedTransaction": jws])
                #expect(again["outcome"] as? String == "matched" && again["state"] as? String == "verified")
            }
            #expect(try await eventCount(db) == count)
            // Delivered: now the client may finish the StoreKit transaction.
            try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "delivered", "data": [:]])
            let (_, delivered) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-1", "signedTransaction": jws])
            #expect(delivered["state"] as? String == "delivered" && delivered["finishTransaction"] as? Bool == true)
        }
    }

    @Test("a proof with no order id finds its order by appAccountToken")
    func matchedByToken() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-token"))
            let token = try #require(UUID(uuidString: created["appAccountToken"] as? String ?? ""))
            let jws = try await apple.sign(TestApple.transaction("1000002", appAccountToken: token))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": jws])
            #expect(answer["outcome"] as? String == "matched" && answer["orderId"] as? String == "o-token")
            let (_, order) = try await http.send(.get, "/v1/orders/o-token")
            let events = order["events"] as? [[String: Any]] ?? []
            #expect((events[1]["data"] as? [String: Any])?["matchedBy"] as? String == "appAccountToken")
        }
    }

    @Test("a proof with no usable order enters the pool, stays there on re-sends, and leaves it for its order")
    func pooledThenMatched() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let jws = try await apple.sign(TestApple.transaction("1000003"))
            let (_, first) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-9", "signedTransaction": jws])
            #expect(first["outcome"] as? String == "unmatched" && first["finishTransaction"] as? Bool == false)
            #expect(first["reason"] as? String == "no-order")
            let (_, unknown) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-9", "orderId": "nope", "signedTransaction": jws])
            #expect(unknown["outcome"] as? String == "unmatched")
            #expect(try await scalar(db, "SELECT user_id FROM unmatched_transactions WHERE transaction_id = '1000003'", as: String.self) == "u-9")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'transaction-1000003'", as: Int.self) == 1)
            try await http.send(.post, "/v1/orders", json: newOrder("o-later", user: "u-9"))
            let (_, matched) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-9", "orderId": "o-later", "signedTransaction": jws])
            #expect(matched["outcome"] as? String == "matched" && matched["orderId"] as? String == "o-later")
            let (_, stream) = try await http.send(.get, "/v1/streams/transaction-1000003/events")
            #expect((stream["events"] as? [[String: Any]])?.map { $0["type"] as? String } == ["transaction-unmatched", "transaction-matched"])
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions", as: Int.self) == 0)
        }
    }

    @Test("a proof whose userId is not the order's never changes that order")
    func otherUsersOrder() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-victim", user: "u-victim"))
            let jws = try await apple.sign(TestApple.transaction("1000004"))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-attacker", "orderId": "o-victim", "signedTransaction": jws])
            #expect(answer["outcome"] as? String == "unmatched" && answer["reason"] as? String == "user-mismatch")
            #expect(answer["orderId"] is NSNull)
            let (_, order) = try await http.send(.get, "/v1/orders/o-victim")
            #expect(order["state"] as? String == "created" && order["version"] as? Int == 0)
        }
    }

    @Test("Apple sold another quantity than the order asks: the order fails with quantity-mismatch; the reconciler and support pair the purchase only with an order of as many units")
    func quantityMismatch() async throws {
        try await withReceiptsApplication(apple) { http, db in
            for (order, quantity) in [("o-three", 3), ("o-three-more", 3)] {
                let (created, _) = try await http.send(.post, "/v1/orders", json: newOrder(order, user: "u-q").merging(["quantity": quantity]) { $1 })
                #expect(created == .created)
            }
            let one = try await apple.sign(TestApple.transaction("1000031"))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-three", "signedTransaction": one])
            #expect(answer["outcome"] as? String == "unmatched" && answer["reason"] as? String == "quantity-mismatch", "\(answer)")
            #expect(answer["state"] as? String == "failed" && answer["finishTransaction"] as? Bool == false, "\(answer)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '1000031'", as: String.self) == "unmatched")

            // Support: an order of three units is refused without force.
            let (refused, refusal) = try await http.send(.post, "/v1/transactions/1000031/match", json: ["orderId": "o-three-more"])
            #expect(refused == .conflict && errorOf(refusal)["code"] as? String == "quantity-mismatch", "\(refusal)")
            // The reconciler: the other order of three units is no candidate; an order of one unit is.
            let (_, none) = try await http.send(.post, "/v1/reconcile")
            #expect(none["considered"] as? Int == 1 && none["paired"] as? Int == 0, "\(none)")
            try await http.send(.post, "/v1/orders", json: newOrder("o-one", user: "u-q"))
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 1, "\(summary)")
            let (_, paid) = try await http.send(.get, "/v1/orders/o-one")
            #expect(paid["state"] as? String == "verified" && paid["transactionId"] as? String == "1000031", "\(paid)")
            #expect(try await http.send(.get, "/v1/orders/o-three-more").1["state"] as? String == "created")

            // Three units bought for the order of three: matched.
            var three = TestApple.transaction("1000032")
            three.quantity = 3
            let (_, matched) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-three-more", "signedTransaction": try await apple.sign(three)])
            #expect(matched["outcome"] as? String == "matched" && matched["state"] as? String == "verified", "\(matched)")
        }
    }

    @Test("a backend's own receipt-received of a pooled purchase is refused for an order of another product or quantity than Apple signed; one of a later transaction (a renewal) for any order")
    func backendClaimOfPooledPurchase() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-claim", "signedTransaction": try await apple.sign(TestApple.transaction("1000041"))])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            try await http.send(.post, "/v1/orders", json: newOrder("o-claim-other", user: "u-claim", product: "gems.500"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-claim-two", user: "u-claim").merging(["quantity": 2]) { $1 })
            try await http.send(.post, "/v1/orders", json: newOrder("o-claim", user: "u-claim"))
            for (order, product, code) in [("o-claim-other", "gems.500", "product-mismatch"), ("o-claim-two", "gems.100", "quantity-mismatch")] {
                let (status, refusal) = try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "receipt-received", "data": receipt("1000041", product: product)])
                #expect(status == .conflict && errorOf(refusal)["code"] as? String == code, "\(order): \(refusal)")
                #expect(try await http.send(.get, "/v1/orders/\(order)").1["state"] as? String == "created")
            }
            // One that names another original transaction is a later transaction of a purchase (a renewal): never an order's.
            var renewal = receipt("1000042")
            renewal["originalTransactionId"] = "1000040"
            let (later, laterError) = try await http.send(.post, "/v1/orders/o-claim/events", json: ["type": "receipt-received", "data": renewal])
            #expect(later == .conflict && errorOf(laterError)["code"] as? String == "later-transaction", "\(laterError)")
            let (taken, _) = try await http.send(.post, "/v1/orders/o-claim/events", json: ["type": "receipt-received", "data": receipt("1000041")])
            #expect(taken == .created)
            #expect(try await scalar(db, "SELECT order_id FROM apple_transactions WHERE transaction_id = '1000041'", as: String.self) == "o-claim")
        }
    }

    @Test("Apple's product differs from the order's: the order fails with product-mismatch, the transaction waits in the pool")
    func productMismatch() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-gems", product: "gems.100"))
            let jws = try await apple.sign(TestApple.transaction("1000005", product: "gems.5000"))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-gems", "signedTransaction": jws])
            #expect(answer["outcome"] as? String == "unmatched" && answer["reason"] as? String == "product-mismatch")
            #expect(answer["state"] as? String == "failed")
            let (_, order) = try await http.send(.get, "/v1/orders/o-gems")
            let last = (order["events"] as? [[String: Any]])?.last
            #expect(last?["type"] as? String == "failed")
            #expect((last?["data"] as? [String: Any])?["reason"] as? String == "product-mismatch")
            #expect(try await scalar(db, "SELECT product_id FROM unmatched_transactions WHERE transaction_id = '1000005'", as: String.self) == "gems.5000")
            let count = try await eventCount(db)
            let (_, again) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-gems", "signedTransaction": jws])
            #expect(again["outcome"] as? String == "unmatched" && again["state"] as? String == "failed")
            #expect(try await eventCount(db) == count)
        }
    }

    @Test("a transaction already granted: the second order fails with duplicate-transaction, once")
    func duplicate() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-a"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-b"))
            let jws = try await apple.sign(TestApple.transaction("1000006"))
            try await http.send(.post, "/v1/receipts", json: ["orderId": "o-a", "signedTransaction": jws])
            let (_, second) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-b", "signedTransaction": jws])
            #expect(second["outcome"] as? String == "duplicate" && second["orderId"] as? String == "o-b")
            #expect(second["state"] as? String == "failed")
            let count = try await eventCount(db)
            let (_, again) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-b", "signedTransaction": jws])
            #expect(again["outcome"] as? String == "duplicate")
            #expect(try await eventCount(db) == count)
            let (_, a) = try await http.send(.get, "/v1/orders/o-a")
            #expect(a["state"] as? String == "verified" && a["transactionId"] as? String == "1000006")
        }
    }

    @Test("20 concurrent uploads of one transaction for 20 orders: exactly one order gets it, the others are duplicates")
    func concurrentUploads() async throws {
        try await withReceiptsApplication(apple) { http, db in
            for index in 0..<20 { try await http.send(.post, "/v1/orders", json: newOrder("race-\(index)")) }
            let jws = try await apple.sign(TestApple.transaction("1000007"))
            let outcomes = try await withThrowingTaskGroup(of: String.self) { group in
                for index in 0..<20 {
                    group.addTask {
                        let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "race-\(index)", "signedTransaction": jws])
                        return answer["outcome"] as? String ?? "?"
                    }
                }
                return try await group.reduce(into: [String]()) { $0.append($1) }
            }
            #expect(outcomes.filter { $0 == "matched" }.count == 1, "\(outcomes)")
            #expect(outcomes.filter { $0 == "duplicate" }.count == 19, "\(outcomes)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE transaction_id = '1000007'", as: Int.self) == 1)
            #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE failure_reason = 'duplicate-transaction'", as: Int.self) == 19)
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE type = 'receipt-received'", as: Int.self) == 1)
        }
    }

    @Test("a signed transaction Apple has revoked is never granted: rejected, no order changed, recorded for audit")
    func revoked() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-revoked"))
            let token = UUID(uuidString: created["appAccountToken"] as? String ?? "")
            var refunded = TestApple.transaction("1000018", appAccountToken: token)
            refunded.revocationDate = Date().millisecondsSince1970
            refunded.revocationReason = 1
            let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-revoked", "signedTransaction": try await apple.sign(refunded)])
            #expect(status == .ok)
            #expect(answer["outcome"] as? String == "rejected" && answer["reason"] as? String == "transaction-revoked", "\(answer)")
            #expect(answer["finishTransaction"] as? Bool == true)
            let (_, order) = try await http.send(.get, "/v1/orders/o-revoked")
            #expect(order["state"] as? String == "created" && order["version"] as? Int == 0)
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE transaction_id = '1000018'", as: Int.self) == 0)
            #expect(try await scalar(db, "SELECT reason FROM dashboards.rejected_proofs", as: String.self) == "transaction-revoked")
        }
    }

    @Test("a client's proof that Apple revoked a transaction the ledger granted or pooled records the refund, once")
    func revokedAfterGranted() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let granted = TestApple.transaction("1000031")
            try await http.deliveredOrder("o-granted", paidWith: granted, apple: apple)
            try await http.send(.post, "/v1/orders", json: newOrder("o-open"))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": try await apple.sign(TestApple.transaction("1000032"))])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")

            for id in ["1000031", "1000032"] {
                var refunded = TestApple.transaction(id)
                refunded.revocationDate = Date().millisecondsSince1970
                refunded.revocationReason = 1
                let jws = try await apple.sign(refunded)
                for _ in 0..<2 {
                    let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": jws])
                    #expect(answer["outcome"] as? String == "rejected" && answer["reason"] as? String == "transaction-revoked", "\(answer)")
                }
            }
            let (_, order) = try await http.send(.get, "/v1/orders/o-granted")
            #expect(order["state"] as? String == "refunded", "\(order)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'order-o-granted' AND type = 'refunded'", as: Int.self) == 1)
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '1000032'", as: String.self) == "refunded")
            let (_, reconciled) = try await http.send(.post, "/v1/reconcile")
            #expect(reconciled["paired"] as? Int == 0, "a refunded pooled transaction pays no open order: \(reconciled)")
            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation")
            let totals = report["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["refundsCaughtUp"] as? Int == 1 && totals["refunded"] as? Int == 1, "\(totals)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a proof of a refund Apple reversed refunds nothing again; a refund Apple made after the reversal refunds again, once")
    func revokedProofsAroundAReversal() async throws {
        try await withReceiptsApplication(apple) { http, db in
            func revoked(_ id: String, at date: Date) async throws -> String {
                var refunded = TestApple.transaction(id)
                refunded.revocationDate = date.millisecondsSince1970
                refunded.revocationReason = 0
                return try await apple.sign(refunded)
            }
            func refunds(_ order: String) async throws -> Int? {
                try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = \("order-" + order) AND type = 'refunded'", as: Int.self)
            }
            // The backend forwards Apple's refund (to the second) and its reversal; the client then
            // sends its old revoked transaction again.
            try await http.deliveredOrder("o-fwd", paidWith: TestApple.transaction("1000041"), apple: apple)
            let first = Date(millisecondsSince1970: Date().millisecondsSince1970 / 1000 * 1000 - 60_000 + 123)
            try await http.send(.post, "/v1/orders/o-fwd/events", json: ["type": "refunded", "data": ["revocationDate": ISO8601DateFormatter().string(from: first)]])
            try await http.send(.post, "/v1/orders/o-fwd/events", json: ["type": "refund-reversed", "data": [:]])
            try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await revoked("1000041", at: first)])
            #expect(try await http.send(.get, "/v1/orders/o-fwd").1["state"] as? String == "delivered")
            #expect(try await refunds("o-fwd") == 1)

            // Apple refunds, reverses, then refunds again: each refund seen in a proof counts.
            try await http.deliveredOrder("o-again", paidWith: TestApple.transaction("1000042"), apple: apple)
            try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await revoked("1000042", at: first)])
            try await http.notifyAppleTaken(try await apple.notification("REFUND_REVERSED", transaction: TestApple.transaction("1000042"), signedDate: first.addingTimeInterval(10)))
            #expect(try await http.send(.get, "/v1/orders/o-again").1["state"] as? String == "delivered")
            let second = first.addingTimeInterval(30)
            for _ in 0..<2 { try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await revoked("1000042", at: second)]) }
            #expect(try await http.send(.get, "/v1/orders/o-again").1["state"] as? String == "refunded")
            #expect(try await refunds("o-again") == 2)

            // A pooled one: refunded, reversed, refunded again, never paired.
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-9", "signedTransaction": try await apple.sign(TestApple.transaction("1000043"))])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await revoked("1000043", at: first)])
            try await http.notifyAppleTaken(try await apple.notification("REFUND_REVERSED", transaction: TestApple.transaction("1000043"), signedDate: first.addingTimeInterval(10)))
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '1000043'", as: String.self) == "unmatched")
            try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await revoked("1000043", at: second)])
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '1000043'", as: String.self) == "refunded")
            try await http.send(.post, "/v1/orders", json: newOrder("o-9", user: "u-9"))
            #expect(try await http.send(.post, "/v1/reconcile").1["paired"] as? Int == 0)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a forged proof changes no order, is recorded for audit once, and is answered rejected with the reason")
    func forged() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-forged"))
            let forger = try TestApple()
            let jws = try await forger.sign(TestApple.transaction("1000008"))
            // The same proof sent again, also with other fields (found by schemathesis: a 409 once).
            let bodies: [[String: Any]] = [
                ["orderId": "o-forged", "signedTransaction": jws], ["orderId": "o-forged", "signedTransaction": jws],
                ["orderId": "o-forged", "signedTransaction": jws, "userId": "u-other"],
                ["orderId": "o-forged", "signedTransaction": jws, "transactionId": "t-other"],
            ]
            for body in bodies {
                let (status, answer) = try await http.send(.post, "/v1/receipts", json: body)
                #expect(status == .ok)
                #expect(answer["outcome"] as? String == "rejected" && answer["reason"] as? String == "invalid-certificate-chain")
                #expect(answer["finishTransaction"] as? Bool == true)
            }
            let (_, order) = try await http.send(.get, "/v1/orders/o-forged")
            #expect(order["state"] as? String == "created" && order["version"] as? Int == 0)
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE type = 'proof-rejected'", as: Int.self) == 1)
            #expect(try await scalar(db, "SELECT reason FROM dashboards.rejected_proofs", as: String.self) == "invalid-certificate-chain")
        }
    }

    @Test("a proof or a notification signed with a date outside the years 1970 to 9999 is refused by name, never a 500")
    func datesOutOfRange() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-year-10000"))
            var transaction = TestApple.transaction("1000070")
            transaction.purchaseDate = 253_402_300_800_000
            let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-year-10000", "signedTransaction": try await apple.sign(transaction)])
            #expect(status == .ok && answer["outcome"] as? String == "rejected" && answer["reason"] as? String == "malformed-token", "\(answer)")
            #expect((answer["message"] as? String)?.contains("purchaseDate") == true, "\(answer)")
            var refunded = TestApple.transaction("1000071")
            refunded.revocationDate = -1
            let (noteStatus, refusal) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded))
            #expect(noteStatus == .badRequest && errorOf(refusal)["code"] as? String == "malformed-token", "\(refusal)")
            #expect((errorOf(refusal)["message"] as? String)?.contains("revocationDate") == true, "\(refusal)")
            let (_, order) = try await http.send(.get, "/v1/orders/o-year-10000")
            #expect(order["state"] as? String == "created", "\(order)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions", as: Int.self) == 0)
        }
    }

    @Test("a proof or a notification whose signed strings hold a NUL or an id Apple never writes is refused by name, never a 500")
    func nulInSignedStrings() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-nul"))
            var nul = TestApple.transaction("1000072")
            nul.appTransactionId = "AT\u{0}X"
            var escaped = TestApple.transaction("1000073")
            escaped.appTransactionId = "AT\\u0000X"
            var long = TestApple.transaction("1000074")
            long.originalTransactionId = String(repeating: "7", count: 129)
            for (transaction, named) in [(nul, "NUL"), (long, "originalTransactionId")] {
                let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-nul", "signedTransaction": try await apple.sign(transaction)])
                #expect(status == .ok && answer["outcome"] as? String == "rejected" && answer["reason"] as? String == "malformed-token", "\(answer)")
                #expect((answer["message"] as? String)?.contains(named) == true, "\(answer)")
                let (noteStatus, refusal) = try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: transaction))
                #expect(noteStatus == .badRequest && errorOf(refusal)["code"] as? String == "malformed-token", "\(refusal)")
            }
            // A backslash before "u0000" is text, not a NUL: taken.
            let (_, taken) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-nul", "signedTransaction": try await apple.sign(escaped)])
            #expect(taken["outcome"] as? String == "matched", "\(taken)")
            #expect(try await scalar(db, "SELECT string_agg(transaction_id, ',') FROM apple_transactions", as: String.self) == "1000073")
        }
    }

    @Test("with no Apple root configured: retry-later with Retry-After, nothing recorded")
    func noRootsConfigured() async throws {
        try await withLiveApplication { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-wait"))
            let count = try await eventCount(db)
            let jws = try await apple.sign(TestApple.transaction("1000009"))
            let response = try await http.client.execute(
                uri: "/v1/receipts", method: .post,
                headers: [.authorization: "Bearer \(http.key)", .contentType: "application/json"],
                body: ByteBuffer(bytes: try JSONSerialization.data(withJSONObject: ["orderId": "o-wait", "signedTransaction": jws])))
            #expect(response.status == .ok)
            #expect(response.headers[.retryAfter] == "60")
            let answer = json(response.body)
            #expect(answer["outcome"] as? String == "retry-later" && answer["finishTransaction"] as? Bool == false)
            #expect(try await eventCount(db) == count)
        }
    }

    @Test("bad requests are 400s naming the problem", arguments: [
        (["orderId": "o"], "signedTransaction"),
        (["signedTransaction": "a", "receiptData": "b"], "receiptData"),
        (["userId": "", "signedTransaction": "a"], "userId"),
        (["orderId": String(repeating: "x", count: 129), "signedTransaction": "a"], "orderId"),
        (["signedTransaction": 42], "signedTransaction"),
    ] as [([String: any Sendable], String)])
    func badRequests(body: [String: any Sendable], field: String) async throws {
        try await withReceiptsApplication(apple) { http, _ in
            let (status, answer) = try await http.send(.post, "/v1/receipts", json: body)
            #expect(status == .badRequest)
            #expect((errorOf(answer)["message"] as? String ?? "").contains(field), "\(answer)")
        }
    }
}

extension ReceiptRoutesTests {
    @Test("a backend's own receipt-received for a pooled transaction takes it out of the pool with transaction-matched (promise 8)")
    func handAppendedClaimLeavesThePoolByAnEvent() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": try await apple.sign(TestApple.transaction("1000020"))])
            try await http.send(.post, "/v1/orders", json: newOrder("o-by-hand"))
            let (status, body) = try await http.send(.post, "/v1/orders/o-by-hand/events", json: ["type": "receipt-received", "data": receipt("1000020")])
            #expect(status == .created, "\(body)")
            let (_, stream) = try await http.send(.get, "/v1/streams/transaction-1000020/events")
            let events = stream["events"] as? [[String: Any]] ?? []
            #expect(events.map { $0["type"] as? String } == ["transaction-unmatched", "transaction-matched"])
            #expect((events.last?["data"] as? [String: Any])?["orderId"] as? String == "o-by-hand")
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions", as: Int.self) == 0)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}
