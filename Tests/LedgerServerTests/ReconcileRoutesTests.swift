import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerServices
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("The reconciler over HTTP")
struct ReconcileRoutesTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    /// A signed transaction with `appTransactionId` as given (one Apple account).
    func transaction(_ id: String, product: String = "gems.100", appTransactionId: String? = nil, minutesAgo: Double = 1) async throws -> String {
        var payload = TestApple.transaction(id, product: product, purchaseDate: Date(timeIntervalSinceNow: -60 * minutesAgo))
        if let appTransactionId { payload.appTransactionId = appTransactionId }
        return try await apple.sign(payload)
    }

    @Test("an orphan is paired with its user's open order of the same product; the rule and candidates are recorded")
    func pairsAnOrphan() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-other-product", user: "u-1", product: "gems.500"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-other-user", user: "u-2"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-mine", user: "u-1"))
            try await http.send(.post, "/v1/orders/o-mine/events", json: ["type": "payment-added", "data": ["queuedAt": LedgerJSONDate.now(minus: 300)]])
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": try await transaction("5000001")])
            #expect(pooled["outcome"] as? String == "unmatched")

            let (status, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(status == .ok)
            #expect(summary["paired"] as? Int == 1 && summary["considered"] as? Int == 1)
            #expect((summary["byRule"] as? [String: Int])?["queue-order"] == 1)
            let (_, order) = try await http.send(.get, "/v1/orders/o-mine")
            #expect(order["state"] as? String == "verified" && order["transactionId"] as? String == "5000001")
            let received = (order["events"] as? [[String: Any]])?.first { $0["type"] as? String == "receipt-received" }
            #expect((received?["data"] as? [String: Any])?["matchedBy"] as? String == "reconciler")
            let (_, stream) = try await http.send(.get, "/v1/streams/transaction-5000001/events")
            let matched = (stream["events"] as? [[String: Any]])?.last?["data"] as? [String: Any]
            #expect(matched?["orderId"] as? String == "o-mine" && matched?["rule"] as? String == "queue-order" && matched?["candidates"] as? Int == 1)
            for id in ["o-other-product", "o-other-user"] {
                let (_, untouched) = try await http.send(.get, "/v1/orders/\(id)")
                #expect(untouched["state"] as? String == "created")
            }
            // The client's re-upload now finds its order.
            let (_, again) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": try await transaction("5000001")])
            #expect(again["outcome"] as? String == "matched" && again["orderId"] as? String == "o-mine")
            let (_, second) = try await http.send(.post, "/v1/reconcile")
            #expect(second["paired"] as? Int == 0)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("an orphan without a user takes the user of an earlier transaction of the same Apple account")
    func resolvesUser() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-first", user: "u-7"))
            try await http.send(.post, "/v1/receipts", json: ["orderId": "o-first", "signedTransaction": try await transaction("5000010", appTransactionId: "acct-7", minutesAgo: 3)])
            try await http.send(.post, "/v1/orders", json: newOrder("o-second", user: "u-7"))
            let (_, orphan) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await transaction("5000011", appTransactionId: "acct-7")])
            #expect(orphan["outcome"] as? String == "unmatched")
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 1 && summary["usersResolved"] as? Int == 1)
            let (_, order) = try await http.send(.get, "/v1/orders/o-second")
            #expect(order["transactionId"] as? String == "5000011")
        }
    }

    @Test("two users' orphans of one Apple account: the pass pairs one and goes on (a third user's orphan too); the other waits, then is held for support")
    func oneAccountTwoUsers() async throws {
        try await withReceiptsApplication(apple) { http, db in
            for user in ["u-ann", "u-ben", "u-cy"] { try await http.send(.post, "/v1/orders", json: newOrder("o-\(user)", user: user)) }
            for (user, id, account) in [("u-ann", "5000101", "acct-shared"), ("u-ben", "5000102", "acct-shared"), ("u-cy", "5000103", "acct-cy")] {
                let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": user, "signedTransaction": try await transaction(id, appTransactionId: account)])
                #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            }
            let (status, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(status == .ok, "\(summary)")
            #expect(summary["paired"] as? Int == 2 && summary["lostRaces"] as? Int == 1, "\(summary)")
            let (_, cy) = try await http.send(.get, "/v1/orders/o-u-cy")
            #expect(cy["state"] as? String == "verified" && cy["transactionId"] as? String == "5000103", "\(cy)")
            let paid = try await scalar(db, """
                SELECT string_agg(transaction_id || ' ' || order_id, ',') FROM apple_transactions WHERE transaction_id IN ('5000101', '5000102') AND order_id IS NOT NULL
                """, as: String.self)
            #expect(paid == "5000101 o-u-ann" || paid == "5000102 o-u-ben", "\(paid)")
            // The other is the account's other user's: the next pass holds it for support, and pairs nothing.
            let (_, next) = try await http.send(.post, "/v1/reconcile")
            #expect(next["heldForSupport"] as? Int == 1 && next["paired"] as? Int == 0 && next["lostRaces"] as? Int == 0, "\(next)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE transaction_id IN ('5000101', '5000102') AND status = 'conflict'", as: Int.self) == 1)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("two reconcilers and live receipt uploads racing on the same users never pair one transaction twice or give an order two")
    func racing() async throws {
        try await withReceiptsApplication(apple) { http, db in
            for user in 0..<4 {
                for index in 0..<6 { try await http.send(.post, "/v1/orders", json: newOrder("race-\(user)-\(index)", user: "ru-\(user)")) }
                for index in 0..<4 {
                    try await http.send(.post, "/v1/receipts", json: ["userId": "ru-\(user)", "signedTransaction": try await transaction("6\(user)0\(index)")])
                }
            }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<2 { group.addTask { try await http.send(.post, "/v1/reconcile") } }
                for user in 0..<4 {
                    group.addTask {
                        // Live uploads naming orders, some of them for transactions in the pool.
                        for index in 0..<3 {
                            try await http.send(.post, "/v1/receipts", json: [
                                "userId": "ru-\(user)", "orderId": "race-\(user)-\(index)",
                                "signedTransaction": try await transaction(index == 0 ? "6\(user)00" : "6\(user)9\(index)"),
                            ])
                        }
                    }
                }
                try await group.waitForAll()
            }
            try await http.send(.post, "/v1/reconcile")
            let perTransaction = try await scalar(db, "SELECT max(n)::int FROM (SELECT count(*) AS n FROM events WHERE type = 'receipt-received' GROUP BY data->>'transactionId') c", as: Int.self)
            let perOrder = try await scalar(db, "SELECT max(n)::int FROM (SELECT count(*) AS n FROM events WHERE type = 'receipt-received' GROUP BY stream_id) c", as: Int.self)
            #expect(perTransaction == 1 && perOrder == 1)
            // Every orphan found an order: 4 users × (4 pooled + 2 uploaded) transactions for 6 orders each.
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions", as: Int.self) == 0)
            #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE transaction_id IS NOT NULL", as: Int.self) == 24)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}

enum LedgerJSONDate {
    /// An ISO 8601 time `seconds` before now, as the API takes it.
    static func now(minus seconds: TimeInterval) -> String {
        let formatter = ISO8601DateFormatter()
        return formatter.string(from: Date(timeIntervalSinceNow: -seconds))
    }
}

extension ReconcileRoutesTests {
    @Test("a later transaction of a purchase (a restore) sent without a user is kept for its original's user, and pays none of that user's orders")
    func restoreKeptForTheOriginalsUser() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-sub-1", user: "u-8"))
            var first = TestApple.transaction("5000020", purchaseDate: Date(timeIntervalSinceNow: -180))
            first.appTransactionId = nil
            try await http.send(.post, "/v1/receipts", json: ["orderId": "o-sub-1", "signedTransaction": try await apple.sign(first)])
            try await http.send(.post, "/v1/orders", json: newOrder("o-sub-2", user: "u-8"))
            var restore = TestApple.transaction("5000021")
            restore.originalTransactionId = "5000020"
            restore.appTransactionId = nil
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await apple.sign(restore)])
            #expect(answer["outcome"] as? String == "recorded" && answer["reason"] as? String == "restore", "\(answer)")
            #expect(answer["orderId"] as? String == "o-sub-1", "\(answer)")
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 0, "\(summary)")
            let (_, order) = try await http.send(.get, "/v1/orders/o-sub-2")
            #expect(order["state"] as? String == "created" && order["transactionId"] as? String == nil, "\(order)")
            #expect(try await scalar(db, "SELECT status || ' ' || user_id FROM apple_transactions WHERE transaction_id = '5000021'", as: String.self) == "restore u-8")
            // A backend that claims it for the open order is refused: Apple signed it a restore.
            let (status, refused) = try await http.send(.post, "/v1/orders/o-sub-2/events", json: [
                "type": "receipt-received",
                "data": ["transactionId": "5000021", "productId": "gems.100", "purchaseDate": LedgerJSONDate.now(minus: 60), "receiptSha256": String(repeating: "a", count: 64), "format": "jws", "matchedBy": "applicationUsername"],
            ])
            #expect(status == .conflict && errorOf(refused)["code"] as? String == "later-transaction", "\(status) \(refused)")
            // As a ledger before restores were told apart pooled it: the reconciler leaves it all the same.
            try await db.client.query("UPDATE apple_transactions SET status = 'unmatched' WHERE transaction_id = '5000021'", logger: TestServer.logger)
            let (_, again) = try await http.send(.post, "/v1/reconcile")
            #expect(again["paired"] as? Int == 0 && again["considered"] as? Int == 0, "\(again)")
        }
    }
}

extension ReconcileRoutesTests {
    @Test("a double tap: orphans wait for the settle window, then pair in queue order with the other candidates recorded")
    func settleThenQueueOrder() async throws {
        // An hour's window, and time passed by ageing the receipts: a window of seconds raced
        // against the machine's speed (the first pass must come within it).
        try await withReceiptsApplication(apple, configure: { $0.reconciler.settle = 3600 }) { http, db in
            for (id, queued) in [("tap-A", 300.0), ("tap-B", 295.0)] {
                try await http.send(.post, "/v1/orders", json: newOrder(id, user: "u-tap"))
                try await http.send(.post, "/v1/orders/\(id)/events", json: ["type": "payment-added", "data": ["queuedAt": LedgerJSONDate.now(minus: queued)]])
            }
            // The later purchase's proof arrives first; both purchases completed after both payments were queued.
            for (id, minutesAgo) in [("5000032", 3.0), ("5000031", 4.0)] {
                let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-tap", "signedTransaction": try await transaction(id, minutesAgo: minutesAgo)])
                #expect(pooled["outcome"] as? String == "unmatched")
            }
            let (_, early) = try await http.send(.post, "/v1/reconcile")
            #expect(early["paired"] as? Int == 0 && early["settling"] as? Int == 2)
            try await db.client.query(
                "UPDATE apple_transactions SET received_at = received_at - interval '61 minutes' WHERE transaction_id IN ('5000031', '5000032')",
                logger: TestServer.logger)
            let (_, settled) = try await http.send(.post, "/v1/reconcile")
            #expect(settled["paired"] as? Int == 2 && settled["ambiguous"] as? Int == 2 && settled["settling"] as? Int == 0)
            #expect((settled["byRule"] as? [String: Int])?["queue-order"] == 2)
            for (order, transaction, other) in [("tap-A", "5000031", "tap-B"), ("tap-B", "5000032", "tap-A")] {
                let (_, paired) = try await http.send(.get, "/v1/orders/\(order)")
                #expect(paired["transactionId"] as? String == transaction)
                let (_, stream) = try await http.send(.get, "/v1/streams/transaction-\(transaction)/events")
                let matched = (stream["events"] as? [[String: Any]])?.last?["data"] as? [String: Any]
                #expect(matched?["candidates"] as? Int == 2 && matched?["otherCandidates"] as? [String] == [other])
            }
        }
    }
}

extension ReconcileRoutesTests {
    @Test("reconcilers divide the users: a user another reconciler holds is left to it, not waited for")
    func claimedUsersAreSkipped() async throws {
        try await withReceiptsApplication(apple) { http, db in
            for user in ["u-held", "u-free"] {
                try await http.send(.post, "/v1/orders", json: newOrder("o-\(user)", user: user))
                try await http.send(.post, "/v1/receipts", json: ["userId": user, "signedTransaction": try await transaction(user == "u-held" ? "5000041" : "5000042")])
            }
            // Another reconciler's claim on u-held, held in a transaction of its own.
            try await db.database.transaction { transaction in
                try await transaction.connection.query(
                    "SELECT pg_advisory_xact_lock(\(TransactionPool.reconcilerClaimSpace), hashtext('u-held'))", logger: TestServer.logger)
                let (_, summary) = try await http.send(.post, "/v1/reconcile")
                #expect(summary["paired"] as? Int == 1 && summary["usersBusy"] as? Int == 1)
            }
            let (_, held) = try await http.send(.get, "/v1/orders/o-u-held")
            #expect(held["transactionId"] as? String == nil && held["state"] as? String == "created")
            let (_, free) = try await http.send(.get, "/v1/orders/o-u-free")
            #expect(free["transactionId"] as? String == "5000042")
            let (_, after) = try await http.send(.post, "/v1/reconcile")
            #expect(after["paired"] as? Int == 1 && after["usersBusy"] as? Int == 0)
        }
    }
}

extension ReconcileRoutesTests {
    @Test("support undoes a reconciler's pairing before delivery; the order reopens, the transaction returns to the pool and goes elsewhere")
    func undoPairing() async throws {
        try await withReceiptsApplication(apple) { http, db in
            // Two open orders: the later-queued one fits the purchase better and takes it.
            for (id, queued) in [("undo-A", 300.0), ("undo-B", 250.0)] {
                try await http.send(.post, "/v1/orders", json: newOrder(id, user: "u-undo"))
                try await http.send(.post, "/v1/orders/\(id)/events", json: ["type": "payment-added", "data": ["queuedAt": LedgerJSONDate.now(minus: queued)]])
            }
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-undo", "signedTransaction": try await transaction("5000051", minutesAgo: 4)])
            let (_, first) = try await http.send(.post, "/v1/reconcile")
            #expect(first["paired"] as? Int == 1)
            let (_, paired) = try await http.send(.get, "/v1/orders/undo-B")
            #expect(paired["state"] as? String == "verified" && paired["transactionId"] as? String == "5000051")

            // Bad requests first: nothing changes.
            let (blank, blankError) = try await http.send(.post, "/v1/transactions/5000051/unmatch", json: ["reason": "  "])
            #expect(blank == .badRequest && errorOf(blankError)["code"] as? String == "reason-required")
            let (missing, _) = try await http.send(.post, "/v1/transactions/5000051/unmatch", json: [:])
            #expect(missing == .badRequest)
            let (unknown, unknownError) = try await http.send(.post, "/v1/transactions/5999999/unmatch", json: ["reason": "x"])
            #expect(unknown == .notFound && errorOf(unknownError)["code"] as? String == "transaction-not-found")

            let (status, order) = try await http.send(.post, "/v1/transactions/5000051/unmatch", json: ["reason": "wrong character"])
            #expect(status == .ok)
            #expect(order["state"] as? String == "payment-added" && order["transactionId"] as? String == nil)
            let (_, read) = try await http.send(.get, "/v1/orders/undo-B")
            let undone = (read["events"] as? [[String: Any]])?.last
            #expect(undone?["type"] as? String == "pairing-undone")
            #expect((undone?["data"] as? [String: Any])?["fromState"] as? String == "verified")
            #expect((undone?["metadata"] as? [String: Any])?["appendedBy"] != nil)
            let (_, pool) = try await http.send(.get, "/v1/transactions/unmatched?transactionId=5000051")
            let entry = (pool["transactions"] as? [[String: Any]])?.first
            let verification = entry?["verification"] as? [String: Any]
            #expect(verification?["reason"] as? String == "undone: wrong character")
            #expect(verification?["undoneOrderIds"] as? [String] == ["undo-B"])
            // Undone twice is refused: it is in the pool now.
            let (again, againError) = try await http.send(.post, "/v1/transactions/5000051/unmatch", json: ["reason": "again"])
            #expect(again == .conflict && errorOf(againError)["code"] as? String == "transaction-not-paired")

            // The next pass never gives it back to undo-B: undo-A takes it.
            let (_, second) = try await http.send(.post, "/v1/reconcile")
            #expect(second["paired"] as? Int == 1)
            let (_, reopened) = try await http.send(.get, "/v1/orders/undo-B")
            #expect(reopened["state"] as? String == "payment-added")
            let (_, taken) = try await http.send(.get, "/v1/orders/undo-A")
            #expect(taken["transactionId"] as? String == "5000051")
            let (_, stream) = try await http.send(.get, "/v1/streams/transaction-5000051/events")
            let matched = (stream["events"] as? [[String: Any]])?.last?["data"] as? [String: Any]
            #expect(matched?["orderId"] as? String == "undo-A" && matched?["candidates"] as? Int == 1)

            // Once delivered, the pairing stands.
            try await http.send(.post, "/v1/orders/undo-A/events", json: ["type": "delivered", "data": [:]])
            let (late, lateError) = try await http.send(.post, "/v1/transactions/5000051/unmatch", json: ["reason": "too late"])
            #expect(late == .conflict && errorOf(lateError)["code"] as? String == "order-delivered")
            #expect((errorOf(lateError)["message"] as? String ?? "").contains("delivered"))

            // The report counts the undo, and the purchase once: one verified sale, its revenue once.
            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let totals = report["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["undonePairings"] as? Int == 1 && totals["verified"] as? Int == 1 && totals["revenue"] as? String == "0.99", "\(totals)")
            // A rebuild folds undo-A's stream before undo-B's, and still leaves the transaction with undo-A.
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("support may pair a transaction again, by hand, with the order it undid the pairing with, and again after a second undo")
    func pairAgainAfterUndo() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("again-A", user: "u-again"))
            try await http.send(.post, "/v1/orders/again-A/events", json: ["type": "payment-added", "data": ["queuedAt": LedgerJSONDate.now(minus: 300)]])
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-again", "signedTransaction": try await transaction("5000061", minutesAgo: 4)])
            #expect(try await http.send(.post, "/v1/reconcile").1["paired"] as? Int == 1)
            for round in 1...2 {
                let (undone, _) = try await http.send(.post, "/v1/transactions/5000061/unmatch", json: ["reason": "checking, round \(round)"])
                #expect(undone == .ok)
                #expect(try await http.send(.post, "/v1/reconcile").1["paired"] as? Int == 0, "the reconciler never pairs them again")
                let (status, order) = try await http.send(.post, "/v1/transactions/5000061/match", json: ["orderId": "again-A"])
                #expect(status == .ok, "round \(round): \(order)")
                #expect(order["state"] as? String == "verified" && order["transactionId"] as? String == "5000061", "\(order)")
            }
            let (_, stream) = try await http.send(.get, "/v1/streams/transaction-5000061/events")
            let types = (stream["events"] as? [[String: Any]] ?? []).map { $0["type"] as? String ?? "?" }
            #expect(types == ["transaction-unmatched", "transaction-matched", "transaction-unmatched", "transaction-matched",
                              "transaction-unmatched", "transaction-matched"], "\(types)")

            // Undone again, then held for support when another user claims it (its Apple account is
            // u-again's by another purchase): support still pairs it with again-A, with a reason.
            try await http.send(.post, "/v1/orders", json: newOrder("again-B", user: "u-again"))
            let sibling = try await transaction("5000062", appTransactionId: "app-tx-5000061", minutesAgo: 1)
            #expect(try await http.send(.post, "/v1/receipts", json: ["orderId": "again-B", "signedTransaction": sibling]).1["outcome"] as? String == "matched")
            #expect(try await http.send(.post, "/v1/transactions/5000061/unmatch", json: ["reason": "round 3"]).0 == .ok)
            let (_, claimed) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-other", "signedTransaction": try await transaction("5000061", minutesAgo: 4)])
            #expect(claimed["reason"] as? String == "account-conflict", "\(claimed)")
            let (held, heldOrder) = try await http.send(.post, "/v1/transactions/5000061/match", json: ["orderId": "again-A", "reason": "the account's owner"])
            #expect(held == .ok && heldOrder["state"] as? String == "verified", "\(heldOrder)")

            // Undone once more: held for support again at once (u-other claimed it), so that the
            // order's backend cannot claim it itself; support pairs it again.
            #expect(try await http.send(.post, "/v1/transactions/5000061/unmatch", json: ["reason": "round 4"]).0 == .ok)
            let received: [String: Any] = [
                "transactionId": "5000061", "productId": "gems.100", "purchaseDate": LedgerJSONDate.now(minus: 240),
                "receiptSha256": String(repeating: "a", count: 64), "format": "jws", "matchedBy": "applicationUsername",
            ]
            let (claimedByBackend, refusal) = try await http.send(.post, "/v1/orders/again-A/events", json: ["type": "receipt-received", "data": received])
            #expect(claimedByBackend == .conflict && errorOf(refusal)["code"] as? String == "account-conflict", "\(refusal)")
            let (again, order) = try await http.send(.post, "/v1/transactions/5000061/match", json: ["orderId": "again-A", "reason": "the account's owner, again"])
            #expect(again == .ok && order["state"] as? String == "verified", "\(order)")
            let (_, proof) = try await http.send(.post, "/v1/receipts", json: ["orderId": "again-A", "signedTransaction": try await transaction("5000061", minutesAgo: 4)])
            #expect(proof["outcome"] as? String == "matched" && proof["state"] as? String == "verified", "the answer is the order's: \(proof)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a pairing its proof made at upload is not undone by support")
    func undoRefusesDirectMatches() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("direct-1", user: "u-direct"))
            let (_, matched) = try await http.send(.post, "/v1/receipts", json: ["orderId": "direct-1", "signedTransaction": try await transaction("5000061")])
            #expect(matched["outcome"] as? String == "matched")
            let (status, error) = try await http.send(.post, "/v1/transactions/5000061/unmatch", json: ["reason": "x"])
            #expect(status == .conflict && errorOf(error)["code"] as? String == "not-a-pool-pairing")
            let (_, order) = try await http.send(.get, "/v1/orders/direct-1")
            #expect(order["state"] as? String == "verified")
        }
    }
}

extension ReconcileRoutesTests {
    @Test("a client cannot append pairing-undone: refused, naming who records it, and nothing is stored")
    func clientsCannotUndo() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("undo-by-client", user: "u-client"))
            let before = try await eventCount(db)
            let (status, error) = try await http.send(
                .post, "/v1/orders/undo-by-client/events", json: ["type": "pairing-undone", "data": ["transactionId": "1", "reason": "x", "fromState": "verified"]])
            #expect(status == .badRequest && errorOf(error)["code"] as? String == "unknown-event-type")
            #expect((errorOf(error)["message"] as? String ?? "").contains("/unmatch"))
            #expect(try await eventCount(db) == before)
        }
    }

    @Test("a pass over many batches, two at once, pairs each orphan once and leaves projections a rebuild reproduces")
    func manyBatches() async throws {
        try await withReceiptsApplication(apple, configure: { configuration in
            configuration.reconcileInterval = 0
        }) { http, db in
            for user in 0..<12 {
                try await http.send(.post, "/v1/orders", json: newOrder("batch-\(user)", user: "u-batch-\(user)"))
                try await http.send(.post, "/v1/receipts", json: ["userId": "u-batch-\(user)", "signedTransaction": try await transaction("71000\(user + 10)")])
            }
            var pass = ServiceAssembly(database: db.database).reconcilerPass(settings: .init(settle: 0))
            pass.orphansPerBatch = 2
            let summary = try await pass.run()
            #expect(summary.paired == 12 && summary.considered == 12 && summary.lostRaces == 0)
            #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE order_id LIKE 'batch-%' AND transaction_id IS NOT NULL", as: Int.self) == 12)
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions", as: Int.self) == 0)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}

extension ReconcileRoutesTests {
    @Test("an orphan a pass leaves over, because pairing it would cross the pass's other pairing, is not paired across it by the next pass")
    func leftOverStaysAcrossPasses() async throws {
        // No clock skew: a purchase is a candidate for the orders created up to its date.
        try await withReceiptsApplication(apple, configure: { $0.reconciler.clockSkew = 0 }) { http, _ in
            let formatter = ISO8601DateFormatter()
            formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
            func created(_ id: String) async throws -> Date {
                let (_, order) = try await http.send(.post, "/v1/orders", json: newOrder(id, user: "u-x"))
                return try #require(formatter.date(from: order["createdAt"] as? String ?? ""), "\(order)")
            }
            let b = try await created("o-b")
            try await Task.sleep(for: .milliseconds(20))
            let a = try await created("o-a")
            #expect(a > b)
            // A is queued first, B after: StoreKit pays A first.
            for (id, queued) in [("o-a", a.addingTimeInterval(1)), ("o-b", a.addingTimeInterval(10))] {
                try await http.send(.post, "/v1/orders/\(id)/events", json: ["type": "payment-added", "data": ["queuedAt": formatter.string(from: queued)]])
            }
            // X, bought before A existed, can only be B's; Y, bought after A was queued, A's or B's.
            // X → B beside Y → A crosses (the earlier purchase would take the later-queued order).
            for (id, purchased) in [("5000031", b), ("5000032", a.addingTimeInterval(2))] {
                var transaction = TestApple.transaction(id, purchaseDate: purchased)
                transaction.appTransactionId = nil
                try await http.send(.post, "/v1/receipts", json: ["userId": "u-x", "signedTransaction": try await apple.sign(transaction)])
            }
            let (_, first) = try await http.send(.post, "/v1/reconcile")
            #expect(first["paired"] as? Int == 1, "\(first)")
            let (_, paidA) = try await http.send(.get, "/v1/orders/o-a")
            #expect(paidA["transactionId"] as? String == "5000032", "\(paidA)")
            let (_, second) = try await http.send(.post, "/v1/reconcile")
            #expect(second["paired"] as? Int == 0, "\(second)")
            let (_, openB) = try await http.send(.get, "/v1/orders/o-b")
            #expect(openB["transactionId"] as? String == nil && openB["state"] as? String == "payment-added", "\(openB)")
        }
    }
}
