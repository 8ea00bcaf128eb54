import Foundation
import LedgerStore
import PostgresNIO
import Synchronization
import LedgerTestSupport
import Testing

/// Issue 41, point 2: a client that claims another user than the one the ledger knows for the
/// transaction's Apple account (its link, an earlier tie) or its appAccountToken gets no automatic
/// pairing; the transaction waits for support, with both users, in the conflicts dashboard.
@Suite("Apple-account conflicts wait for support")
struct AccountConflictTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    func signed(_ id: String, account: String?, token: UUID? = nil) async throws -> String {
        var payload = TestApple.transaction(id, appAccountToken: token)
        payload.appTransactionId = account
        return try await apple.sign(payload)
    }

    func upload(_ http: LedgerHTTP, _ jws: String, user: String?, order: String? = nil) async throws -> [String: Any] {
        var body: [String: Any] = ["signedTransaction": jws]
        if let user { body["userId"] = user }
        if let order { body["orderId"] = order }
        let (status, answer) = try await http.send(.post, "/v1/receipts", json: body)
        #expect(status == .ok, "\(answer)")
        return answer
    }

    @Test("issue 41's story: Alice's account, uploaded by Bob, pays none of Bob's orders by any path; support decides with a reason")
    func anotherUsersAccount() async throws {
        try await withReceiptsApplication(apple) { http, db in
            // Alice's first purchase ties her Apple account to her.
            try await http.send(.post, "/v1/orders", json: newOrder("o-alice", user: "u-alice"))
            let first = try await upload(http, try await signed("4200001", account: "acct-alice"), user: "u-alice", order: "o-alice")
            #expect(first["outcome"] as? String == "matched")
            // Her second purchase, uploaded by Bob with his user id: held, not pooled under Bob.
            try await http.send(.post, "/v1/orders", json: newOrder("o-bob", user: "u-bob"))
            let second = try await signed("4200002", account: "acct-alice")
            let held = try await upload(http, second, user: "u-bob")
            #expect(held["outcome"] as? String == "unmatched" && held["reason"] as? String == "account-conflict", "\(held)")
            #expect(held["finishTransaction"] as? Bool == false)
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 0, "\(summary)")
            // Named with Bob's order id, the same: the order is left as it is.
            let named = try await upload(http, second, user: "u-bob", order: "o-bob")
            #expect(named["outcome"] as? String == "unmatched" && named["reason"] as? String == "account-conflict", "\(named)")
            let (_, bobs) = try await http.send(.get, "/v1/orders/o-bob")
            #expect(bobs["state"] as? String == "created")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '4200002'", as: String.self) == "conflict")

            // The accounts' conflicts dashboard shows both users.
            let rows = try await db.client.query("""
                SELECT claimed_by, owner_user_id, app_transaction_id, source FROM dashboards.apple_account_conflicts
                 WHERE transaction_id = '4200002'
                """, logger: TestServer.logger)
            var shown: [[String]] = []
            for try await (claimed, owner, account, source) in rows.decode((String, String, String, String).self) {
                shown.append([claimed, owner, account, source])
            }
            #expect(shown == [["u-bob", "u-alice", "acct-alice", "transaction"]])
            // Support finds it in the pool, with both users; the report counts it as paid and not delivered.
            let (_, found) = try await http.send(.get, "/v1/transactions/unmatched?userId=u-bob")
            let pooled = found["transactions"] as? [[String: Any]] ?? []
            #expect(pooled.map { $0["transactionId"] as? String } == ["4200002"], "\(found)")
            #expect(pooled.first?["status"] as? String == "conflict")
            #expect((pooled.first?["verification"] as? [String: Any])?["knownUserId"] as? String == "u-alice", "\(pooled)")
            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation")
            #expect((report["unmatched"] as? [String: Any])?["count"] as? Int == 1, "\(report)")
            #expect(try await scalar(db, "SELECT status FROM dashboards.unmatched_transactions WHERE transaction_id = '4200002'", as: String.self) == "conflict")

            // Support decides, with a reason.
            let (refused, refusal) = try await http.send(.post, "/v1/transactions/4200002/match", json: ["orderId": "o-bob"])
            #expect(refused == .badRequest && (refusal["error"] as? [String: Any])?["code"] as? String == "reason-required", "\(refusal)")
            let reason = "Bob and Alice share one Apple ID; Alice confirmed the purchase was Bob's (ticket 7)"
            let (status, paired) = try await http.send(.post, "/v1/transactions/4200002/match", json: ["orderId": "o-bob", "reason": reason])
            #expect(status == .ok && paired["state"] as? String == "verified", "\(paired)")
            let rule = try await scalar(db, """
                SELECT data->>'rule' FROM events WHERE stream_id = 'transaction-4200002' AND type = 'transaction-matched'
                """, as: String.self)
            #expect(rule == "support-conflict: \(reason)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM dashboards.apple_account_conflicts WHERE transaction_id = '4200002'", as: Int.self) == 0)
            let (_, after) = try await http.send(.get, "/v1/transactions/unmatched?userId=u-bob")
            #expect((after["transactions"] as? [[String: Any]])?.isEmpty == true, "\(after)")

            // Support undoes it: held for support again at once, with both users, not free.
            let (undone, undo) = try await http.send(.post, "/v1/transactions/4200002/unmatch", json: ["reason": "wrong call"])
            #expect(undone == .ok, "\(undo)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '4200002'", as: String.self) == "conflict")
            #expect(try await scalar(db, """
                SELECT claimed_by || ' ' || owner_user_id FROM dashboards.apple_account_conflicts WHERE transaction_id = '4200002'
                """, as: String.self) == "u-bob u-alice")

            // Forced to a third user's order: the rule says it was a conflict, and that support forced it.
            try await http.send(.post, "/v1/orders", json: newOrder("o-carol", user: "u-carol"))
            let (forced, forcedOrder) = try await http.send(.post, "/v1/transactions/4200002/match", json: ["orderId": "o-carol", "force": true, "reason": "ticket 9"])
            #expect(forced == .ok, "\(forcedOrder)")
            #expect(try await scalar(db, """
                SELECT data->>'rule' FROM events WHERE stream_id = 'transaction-4200002' AND type = 'transaction-matched' ORDER BY stream_version DESC LIMIT 1
                """, as: String.self) == "support-forced-conflict: ticket 9")
        }
    }

    @Test("a purchase pooled for Bob before Alice linked its Apple account is held for support at the next reconciler pass, not left where no one looks")
    func pooledThenLinked() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let pooled = try await upload(http, try await signed("4200031", account: "acct-late"), user: "u-bob")
            #expect(pooled["outcome"] as? String == "unmatched" && pooled["reason"] as? String == "no-order", "\(pooled)")
            let (linked, _) = try await http.send(
                .post, "/v1/users/u-alice/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("acct-late"))])
            #expect(linked == .ok)
            try await http.send(.post, "/v1/orders", json: newOrder("o-bob-late", user: "u-bob"))
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 0 && summary["heldForSupport"] as? Int == 1, "\(summary)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '4200031'", as: String.self) == "conflict")
            #expect(try await scalar(db, "SELECT owner_user_id FROM dashboards.apple_account_conflicts WHERE transaction_id = '4200031'", as: String.self) == "u-alice")
            let (_, again) = try await http.send(.post, "/v1/reconcile")
            #expect(again["heldForSupport"] as? Int == 0, "\(again)")
            #expect(try await http.send(.get, "/v1/orders/o-bob-late").1["state"] as? String == "created")
        }
    }

    @Test("a held transaction refunded by Apple, then its refund reversed, is held for support again: no automatic path pairs it")
    func heldRefundReversed() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-alice", user: "u-alice"))
            #expect(try await upload(http, try await signed("4200011", account: "acct-alice"), user: "u-alice", order: "o-alice")["outcome"] as? String == "matched")
            try await http.send(.post, "/v1/orders", json: newOrder("o-bob", user: "u-bob"))
            var second = TestApple.transaction("4200012")
            second.appTransactionId = "acct-alice"
            let held = try await upload(http, try await apple.sign(second), user: "u-bob")
            #expect(held["reason"] as? String == "account-conflict", "\(held)")

            func status() async throws -> String? {
                try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '4200012'", as: String.self)
            }
            var refunded = second
            refunded.revocationDate = Date().millisecondsSince1970
            refunded.revocationReason = 1
            let (refundStatus, _) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded))
            #expect(refundStatus == .ok)
            #expect(try await status() == "refunded")
            let (reversedStatus, _) = try await http.notifyApple(try await apple.notification("REFUND_REVERSED", transaction: second))
            #expect(reversedStatus == .ok)
            #expect(try await status() == "conflict", "back where it was before the refund: held for support")

            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 0, "\(summary)")
            let (_, bobs) = try await http.send(.get, "/v1/orders/o-bob")
            #expect(bobs["state"] as? String == "created")
            #expect(try await scalar(db, "SELECT count(*)::int FROM dashboards.apple_account_conflicts WHERE transaction_id = '4200012'", as: Int.self) == 1)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
            #expect(try await statusAfterMigration029(db, transaction: "4200012") == "conflict", "an earlier ledger's row, as a rebuild sets it")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a linked account's purchase named with another user's order id is held, though it came the fast way; with no claimed user it resolves to its owner")
    func linkedAccount() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            let (linked, _) = try await http.send(.post, "/v1/users/u-carol/app-transaction", json: [
                "signedAppTransaction": try await apple.sign(TestApple.appTransaction("acct-carol")),
            ])
            #expect(linked == .ok)
            try await http.send(.post, "/v1/orders", json: newOrder("o-dave", user: "u-dave"))
            let held = try await upload(http, try await signed("4200011", account: "acct-carol"), user: nil, order: "o-dave")
            #expect(held["outcome"] as? String == "unmatched" && held["reason"] as? String == "account-conflict", "\(held)")
            let (_, daves) = try await http.send(.get, "/v1/orders/o-dave")
            #expect(daves["state"] as? String == "created")

            // No user claimed: the account's owner, as before.
            try await http.send(.post, "/v1/orders", json: newOrder("o-carol", user: "u-carol"))
            let pooled = try await upload(http, try await signed("4200012", account: "acct-carol"), user: nil)
            #expect(pooled["outcome"] as? String == "unmatched" && pooled["reason"] as? String == "no-order", "\(pooled)")
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 1, "\(summary)")
            let (_, carols) = try await http.send(.get, "/v1/orders/o-carol")
            #expect(carols["transactionId"] as? String == "4200012")
        }
    }

    @Test("a token that names one user's order is held when another user's order id comes with it, with or without that user's id")
    func anotherUsersTokenWithAnOrderID() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-ivy", user: "u-ivy"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            try await http.send(.post, "/v1/orders", json: newOrder("o-jack", user: "u-jack"))
            let jws = try await signed("4200031", account: nil, token: token)
            for user in ["u-jack", nil] as [String?] {
                let held = try await upload(http, jws, user: user, order: "o-jack")
                #expect(held["outcome"] as? String == "unmatched" && held["reason"] as? String == "account-conflict", "\(held)")
            }
            let (_, jacks) = try await http.send(.get, "/v1/orders/o-jack")
            #expect(jacks["state"] as? String == "created")
            // The order the token names takes it, as ever (from support's hand now, or Ivy's own upload).
            let (_, ivys) = try await http.send(.get, "/v1/orders/o-ivy")
            #expect(ivys["state"] as? String == "created")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '4200031'", as: String.self) == "conflict")
        }
    }

    @Test("a transaction pooled first with no user, then claimed by another user than its account's, is held from then on; the reconciler pairs neither it nor the account's earlier claims")
    func pooledFirstThenClaimed() async throws {
        try await withReceiptsApplication(apple) { http, db in
            // Kate's claim on an account no one is known for yet: pooled under her.
            try await http.send(.post, "/v1/orders", json: newOrder("o-kate", user: "u-kate", product: "gems.500"))
            let early = try await upload(http, try await signed("4200041", account: "acct-leo"), user: "u-kate")
            #expect(early["reason"] as? String == "no-order")
            // Then Leo links the account, and a purchase of it arrives with no user.
            let (linked, _) = try await http.send(.post, "/v1/users/u-leo/app-transaction", json: [
                "signedAppTransaction": try await apple.sign(TestApple.appTransaction("acct-leo")),
            ])
            #expect(linked == .ok)
            let jws = try await signed("4200042", account: "acct-leo")
            let pooled = try await upload(http, jws, user: nil)
            #expect(pooled["reason"] as? String == "no-order")
            // Kate claims it with her order: held, not an error, and not paid.
            let held = try await upload(http, jws, user: "u-kate", order: "o-kate")
            #expect(held["outcome"] as? String == "unmatched" && held["reason"] as? String == "account-conflict", "\(held)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '4200042'", as: String.self) == "conflict")
            #expect(try await scalar(db, """
                SELECT owner_user_id FROM dashboards.apple_account_conflicts WHERE transaction_id = '4200042'
                """, as: String.self) == "u-leo")
            // The reconciler runs (and does not fail): Kate's earlier claim on Leo's account is not paired either.
            try await http.send(.post, "/v1/orders", json: newOrder("o-kate-2", user: "u-kate"))
            let (status, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(status == .ok && summary["paired"] as? Int == 0, "\(summary)")
            let (_, kates) = try await http.send(.get, "/v1/orders/o-kate-2")
            #expect(kates["state"] as? String == "created")
        }
    }

    @Test("a token that names one user's order, sent by another user, is held for support")
    func anotherUsersToken() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-erin", user: "u-erin"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            try await http.send(.post, "/v1/orders", json: newOrder("o-frank", user: "u-frank"))
            let held = try await upload(http, try await signed("4200021", account: nil, token: token), user: "u-frank")
            #expect(held["outcome"] as? String == "unmatched" && held["reason"] as? String == "account-conflict", "\(held)")
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["paired"] as? Int == 0, "\(summary)")
            let (_, franks) = try await http.send(.get, "/v1/orders/o-frank")
            #expect(franks["state"] as? String == "created")
        }
    }

    @Test("a tie of a transaction waits while a writer holds its Apple account's stream (a link in flight), so the account check sees what it wrote")
    func tieWaitsForTheAccount() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-race", user: "u-bob"))
            let jws = try await signed("4200090", account: "acct-race")
            // A writer of acct-race's stream in flight: its lock held in an open transaction.
            let connection = try await db.connect()
            try await connection.query("BEGIN", logger: TestServer.logger)
            try await connection.query("SELECT pg_advisory_xact_lock(hashtextextended('apple-account-acct-race', 0))", logger: TestServer.logger)
            let finished = Finished()
            let tie = Task {
                defer { finished.set() }
                return try await upload(http, jws, user: "u-bob", order: "o-race")["outcome"] as? String
            }
            // Until the upload has ended, or waits for a lock of this database.
            var waited = false
            while !finished.value {
                let waiting = try await scalar(db, """
                    SELECT count(*)::int FROM pg_locks
                     WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    """, as: Int.self)
                if waiting ?? 0 > 0 {
                    waited = true
                    break
                }
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(waited, "the tie went through while the account's stream was held")
            try await connection.query("ROLLBACK", logger: TestServer.logger)
            #expect(try await tie.value == "matched")
            try await connection.close()
        }
    }
}

/// Set once a task has ended.
private final class Finished: Sendable {
    private let state = Mutex(false)
    var value: Bool { state.withLock { $0 } }
    func set() { state.withLock { $0 = true } }
}
