import AppleReceipts
import Foundation
import LedgerStore
import LedgerTestSupport
import Testing

/// A backend's own `receipt-received` claims a transaction the ledger has not seen signed; when
/// Apple's signed transaction arrives and says otherwise, Apple's word decides (issue 41).
@Suite("What Apple signed against a backend's own claim")
struct BackendClaimTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    /// Order `order` of `user`, claimed by its backend for `transaction` (then `steps` more).
    func claimed(_ http: LedgerHTTP, _ order: String, user: String, transaction: String, steps: [String] = []) async throws {
        try await http.send(.post, "/v1/orders", json: newOrder(order, user: user))
        var own = receipt(transaction)
        own["purchaseDate"] = ISO8601DateFormatter().string(from: Date())
        for (type, data) in [("receipt-received", own)] + steps.map { ($0, [String: Any]()) } {
            let (status, answer) = try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": type, "data": data])
            #expect(status == .created, "\(type): \(answer)")
        }
    }

    @Test("Apple's account of another user: the claim is taken back and the transaction held for support; the order is open again and cannot be verified with it")
    func anotherUsersAccount() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-alice", user: "alice"))
            let (_, linked) = try await http.send(.post, "/v1/users/alice/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("acct-alice"))])
            #expect(linked["outcome"] as? String == "linked")
            try await claimed(http, "o-bob", user: "bob", transaction: "7900001")
            var alices = TestApple.transaction("7900001")
            alices.appTransactionId = "acct-alice"
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-bob", "signedTransaction": try await apple.sign(alices)])
            #expect(answer["outcome"] as? String == "unmatched" && answer["reason"] as? String == "account-conflict", "\(answer)")
            #expect(answer["finishTransaction"] as? Bool == false && answer["state"] as? String == "created", "\(answer)")
            let (refused, _) = try await http.send(.post, "/v1/orders/o-bob/events", json: ["type": "verified", "data": [:]])
            #expect(refused == .conflict, "bob's order holds no transaction to verify")
            #expect(try await scalar(db, """
                SELECT claimed_by || ' ' || owner_user_id FROM dashboards.apple_account_conflicts WHERE transaction_id = '7900001'
                """, as: String.self) == "bob alice")
            // Sent again: held still, nothing more.
            let events = try await eventCount(db)
            let (_, again) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-bob", "signedTransaction": try await apple.sign(alices)])
            #expect(again["reason"] as? String == "account-conflict" && again["finishTransaction"] as? Bool == false, "\(again)")
            #expect(try await eventCount(db) == events)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("Apple's product, or a purchase before the order: the claim is taken back, the transaction waits in the pool, the order fails (product) or is open again (date)")
    func appleSignedOtherwise() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await claimed(http, "o-product", user: "carol", transaction: "7900002")
            let other = try await apple.sign(TestApple.transaction("7900002", product: "gems.500"))
            let (_, product) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-product", "signedTransaction": other])
            #expect(product["outcome"] as? String == "unmatched" && product["reason"] as? String == "product-mismatch", "\(product)")
            #expect(product["state"] as? String == "failed" && product["finishTransaction"] as? Bool == false, "\(product)")

            try await claimed(http, "o-old", user: "carol", transaction: "7900003")
            let old = try await apple.sign(TestApple.transaction("7900003", purchaseDate: Date(timeIntervalSinceNow: -365 * 86_400)))
            let (_, date) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-old", "signedTransaction": old])
            #expect(date["outcome"] as? String == "unmatched" && date["reason"] as? String == "purchased-before-order", "\(date)")
            #expect(date["state"] as? String == "created" && date["finishTransaction"] as? Bool == false, "\(date)")
            let (refused, _) = try await http.send(.post, "/v1/orders/o-old/events", json: ["type": "verified", "data": [:]])
            #expect(refused == .conflict)

            // Both wait in the pool as Apple signed them, for carol, never again for their orders.
            #expect(try await scalar(db, """
                SELECT string_agg(transaction_id || ' ' || product_id || ' ' || user_id || ' ' || (verification->'undoneOrderIds'->>0), ',' ORDER BY transaction_id)
                  FROM apple_transactions WHERE order_id IS NULL AND status = 'unmatched'
                """, as: String.self) == "7900002 gems.500 carol o-product,7900003 gems.100 carol o-old")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a proof naming the order whose token Apple signed, when a backend's claim gave the transaction to another: the named order is not failed, the client keeps the transaction")
    func tokenOfAnotherOrder() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-payer", user: "dave"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            try await claimed(http, "o-claimer", user: "erin", transaction: "7900004", steps: ["verified", "delivered"])
            let signed = try await apple.sign(TestApple.transaction("7900004", appAccountToken: token))
            for body in [["orderId": "o-payer", "signedTransaction": signed], ["signedTransaction": signed]] {
                let (_, answer) = try await http.send(.post, "/v1/receipts", json: body)
                #expect(answer["outcome"] as? String == "unmatched" && answer["reason"] as? String == "held-by-another-order", "\(answer)")
                #expect(answer["finishTransaction"] as? Bool == false && answer["state"] as? String == "created", "\(answer)")
            }
            let (_, payer) = try await http.send(.get, "/v1/orders/o-payer")
            #expect(payer["state"] as? String == "created", "\(payer)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'order-o-payer'", as: Int.self) == 1)
        }
    }

    @Test("a proof naming another order, or none, of a transaction a backend claimed otherwise than Apple signed: the claim is taken back, then the proof is taken as if it had never been")
    func proofOfAnotherOrder() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await claimed(http, "o-wrong", user: "frank", transaction: "7900005")
            try await http.send(.post, "/v1/orders", json: newOrder("o-right", user: "frank", product: "gems.500"))
            let signed = try await apple.sign(TestApple.transaction("7900005", product: "gems.500"))
            let (_, right) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-right", "signedTransaction": signed])
            #expect(right["outcome"] as? String == "matched" && right["orderId"] as? String == "o-right", "\(right)")
            let (_, wrong) = try await http.send(.get, "/v1/orders/o-wrong")
            #expect(wrong["state"] as? String == "failed", "\(wrong)")
            #expect(try await scalar(db, "SELECT failure_reason FROM orders WHERE order_id = 'o-wrong'", as: String.self) == "product-mismatch")

            // Named by no order (a user alone): bought a year before the order that claimed it, it
            // waits in the pool for that user, barred from that order.
            try await claimed(http, "o-late", user: "frank", transaction: "7900006")
            let old = try await apple.sign(TestApple.transaction("7900006", purchaseDate: Date(timeIntervalSinceNow: -365 * 86_400)))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "frank", "signedTransaction": old])
            #expect(pooled["outcome"] as? String == "unmatched" && pooled["finishTransaction"] as? Bool == false, "\(pooled)")
            #expect(try await scalar(db, """
                SELECT user_id || ' ' || (verification->'undoneOrderIds'->>0) FROM apple_transactions WHERE transaction_id = '7900006' AND order_id IS NULL
                """, as: String.self) == "frank o-late")
            let (_, late) = try await http.send(.get, "/v1/orders/o-late")
            #expect(late["state"] as? String == "created", "\(late)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("Apple's notification about a claimed, unverified transaction: another product takes the claim back; a refund fails the order and the transaction leaves the pool refunded")
    func notificationsDecide() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await claimed(http, "o-gina", user: "gina", transaction: "7900007")
            let (_, charge) = try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("7900007", product: "gems.500")))
            #expect(charge["applied"] as? Bool == true, "\(charge)")
            let (_, gina) = try await http.send(.get, "/v1/orders/o-gina")
            #expect(gina["state"] as? String == "failed", "\(gina)")
            #expect(try await scalar(db, "SELECT failure_reason FROM orders WHERE order_id = 'o-gina'", as: String.self) == "product-mismatch")
            #expect(try await scalar(db, "SELECT product_id || ' ' || status FROM apple_transactions WHERE transaction_id = '7900007' AND order_id IS NULL", as: String.self)
                == "gems.500 unmatched")

            try await claimed(http, "o-hal", user: "hal", transaction: "7900008")
            var refunded = TestApple.transaction("7900008")
            refunded.revocationDate = Date().millisecondsSince1970
            refunded.revocationReason = 0
            let (_, refund) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded))
            #expect(refund["applied"] as? Bool == true && refund["streamId"] as? String == "transaction-7900008", "\(refund)")
            let (_, hal) = try await http.send(.get, "/v1/orders/o-hal")
            #expect(hal["state"] as? String == "failed", "\(hal)")
            #expect(try await scalar(db, "SELECT failure_reason FROM orders WHERE order_id = 'o-hal'", as: String.self) == "transaction-refunded")
            let (refused, _) = try await http.send(.post, "/v1/orders/o-hal/events", json: ["type": "verified", "data": [:]])
            #expect(refused == .conflict, "a refunded purchase is never verified")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '7900008' AND order_id IS NULL", as: String.self) == "refunded")
            let (_, proof) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-hal", "signedTransaction": try await apple.sign(refunded)])
            #expect(proof["outcome"] as? String == "rejected" && proof["finishTransaction"] as? Bool == true, "\(proof)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a client's proof that Apple refunded a claimed, unverified transaction: rejected, and the claim is taken back (the order fails, the transaction waits refunded); a reversal frees it")
    func refundedProof() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await claimed(http, "o-ivy", user: "ivy", transaction: "7900009")
            var refunded = TestApple.transaction("7900009")
            refunded.revocationDate = Date().millisecondsSince1970
            refunded.revocationReason = 0
            let (_, proof) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-ivy", "signedTransaction": try await apple.sign(refunded)])
            #expect(proof["outcome"] as? String == "rejected" && proof["reason"] as? String == "transaction-revoked", "\(proof)")
            #expect(try await scalar(db, "SELECT state || ' ' || failure_reason FROM orders WHERE order_id = 'o-ivy'", as: String.self) == "failed transaction-refunded")
            let (refused, _) = try await http.send(.post, "/v1/orders/o-ivy/events", json: ["type": "verified", "data": [:]])
            #expect(refused == .conflict, "a refunded purchase is never verified")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '7900009' AND order_id IS NULL", as: String.self) == "refunded")
            let (_, reversal) = try await http.notifyApple(try await apple.notification("REFUND_REVERSED", transaction: TestApple.transaction("7900009")))
            #expect(reversal["applied"] as? Bool == true, "\(reversal)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '7900009' AND order_id IS NULL", as: String.self) == "unmatched")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("Apple signed the appAccountToken of another user's order than the one a backend claimed it for, unverified: the claim is taken back and that order takes it, by its proof or by Apple's notification")
    func tokenOfAnotherUsersOrder() async throws {
        try await withReceiptsApplication(apple) { http, db in
            for (payer, claimer, id, byNotification) in [("o-jo", "o-kim", "7900010", false), ("o-lee", "o-max", "7900011", true)] {
                let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder(payer, user: "u-\(payer)"))
                let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
                try await claimed(http, claimer, user: "u-\(claimer)", transaction: id)
                let signed = TestApple.transaction(id, appAccountToken: token)
                if byNotification {
                    let (_, applied) = try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: signed))
                    #expect(applied["applied"] as? Bool == true, "\(applied)")
                } else {
                    let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": payer, "signedTransaction": try await apple.sign(signed)])
                    #expect(answer["outcome"] as? String == "matched" && answer["orderId"] as? String == payer, "\(answer)")
                }
                let (_, paid) = try await http.send(.get, "/v1/orders/\(payer)")
                #expect(paid["state"] as? String == "verified" && paid["transactionId"] as? String == id, "\(paid)")
                let (_, other) = try await http.send(.get, "/v1/orders/\(claimer)")
                #expect(other["state"] as? String == "created", "\(other)")
            }
            #expect(try await scalar(db, "SELECT count(*)::int FROM dashboards.apple_account_conflicts", as: Int.self) == 0)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a family member's shared access a backend claimed for an order, unverified: the claim is taken back, by the proof or by Apple's notification; no order is paid, no revenue counted")
    func familySharedClaim() async throws {
        try await withReceiptsApplication(apple) { http, db in
            for (order, id, byNotification) in [("o-nia", "7900012", false), ("o-oz", "7900013", true)] {
                try await claimed(http, order, user: "u-\(order)", transaction: id)
                var shared = TestApple.transaction(id)
                shared.inAppOwnershipType = "FAMILY_SHARED"
                if byNotification {
                    let (_, applied) = try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: shared))
                    #expect(applied["applied"] as? Bool == true, "\(applied)")
                } else {
                    let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": order, "signedTransaction": try await apple.sign(shared)])
                    #expect(answer["outcome"] as? String == "recorded" && answer["reason"] as? String == "family-shared", "\(answer)")
                }
                let (_, after) = try await http.send(.get, "/v1/orders/\(order)")
                #expect(after["state"] as? String == "created" && after["transactionId"] is NSNull, "\(after)")
                let (refused, _) = try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "verified", "data": [:]])
                #expect(refused == .conflict)
                #expect(try await scalar(db, "SELECT string_agg(transaction_id || ' ' || status, ',' ORDER BY transaction_id) FROM apple_transactions WHERE order_id IS NULL", as: String.self)
                    == (byNotification ? "7900012 shared,7900013 shared" : "7900012 shared"))
            }
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
    @Test("a later period of a subscription a backend claimed for an order, unverified: the claim is taken back and the period recorded on its subscription, by the proof, Apple's notification or a proof naming no order; no order is paid")
    func renewalClaim() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let now = Date()
            try await http.send(.post, "/v1/orders", json: newOrder("o-sub", user: "pat", product: "pro.monthly"))
            let start = TestApple.subscriptionPeriod("7900030", of: "7900030", purchaseDate: now, expires: now + 30 * 86_400)
            let (_, started) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-sub", "signedTransaction": try await apple.sign(start)])
            #expect(started["outcome"] as? String == "matched", "\(started)")
            for (step, (order, id)) in [("o-r1", "7900031"), ("o-r2", "7900032"), ("o-r3", "7900033"), ("o-r4", "7900034"), ("o-r5", "7900035")].enumerated() {
                try await http.send(.post, "/v1/orders", json: newOrder(order, user: "pat", product: "pro.monthly"))
                var own = receipt(id)
                own["productId"] = "pro.monthly"
                own["purchaseDate"] = ISO8601DateFormatter().string(from: Date())
                let (claimedStatus, claim) = try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "receipt-received", "data": own])
                #expect(claimedStatus == .created, "\(claim)")
                let renewal = TestApple.subscriptionPeriod(
                    id, of: "7900030", purchaseDate: Date(), expires: now + Double(60 + 30 * step) * 86_400)
                switch step {
                case 0:
                    let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": order, "signedTransaction": try await apple.sign(renewal)])
                    #expect(answer["outcome"] as? String == "recorded" && answer["reason"] as? String == "subscription-renewal", "\(answer)")
                case 1:
                    let (_, applied) = try await http.notifyApple(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo("7900030")))
                    #expect(applied["applied"] as? Bool == true, "\(applied)")
                case 3:
                    // Apple refunded it: the order is open again (it never paid it), the period refunded.
                    var refunded = renewal
                    refunded.revocationDate = Date().millisecondsSince1970
                    refunded.revocationReason = 0
                    let (_, applied) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded))
                    #expect(applied["applied"] as? Bool == true, "\(applied)")
                case 4:
                    // A client's proof that Apple revoked it: never granted, its period recorded
                    // refunded as Apple's REFUND would, and the order is open again rather than
                    // failed, as it never paid it.
                    var revoked = renewal
                    revoked.revocationDate = Date().millisecondsSince1970
                    revoked.revocationReason = 0
                    let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": order, "signedTransaction": try await apple.sign(revoked)])
                    #expect(answer["outcome"] as? String == "rejected", "\(answer)")
                default:
                    let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": "pat", "signedTransaction": try await apple.sign(renewal)])
                    #expect(answer["outcome"] as? String == "recorded" && answer["reason"] as? String == "subscription-renewal", "\(answer)")
                }
                let (_, after) = try await http.send(.get, "/v1/orders/\(order)")
                #expect(after["state"] as? String == "created" && after["transactionId"] is NSNull, "\(order): \(after)")
                let (refused, _) = try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "verified", "data": [:]])
                #expect(refused == .conflict, "\(order) holds no transaction to verify")
            }
            #expect(try await scalar(db, "SELECT string_agg(transaction_id || ' ' || status, ',' ORDER BY transaction_id) FROM apple_transactions WHERE order_id IS NULL", as: String.self)
                == "7900031 renewal,7900032 renewal,7900033 renewal,7900034 renewal,7900035 renewal")
            // A backend's claim of one the ledger holds as a renewal, without its originalTransactionId: told what it is.
            try await http.send(.post, "/v1/orders", json: newOrder("o-r6", user: "pat", product: "pro.monthly"))
            let (status, refused) = try await http.send(.post, "/v1/orders/o-r6/events", json: ["type": "receipt-received", "data": receipt("7900031", product: "pro.monthly")])
            #expect(status == .conflict && (refused["error"] as? [String: Any])?["code"] as? String == "later-transaction", "\(refused)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM subscription_periods WHERE original_transaction_id = '7900030'", as: Int.self) == 6)
            #expect(try await scalar(db, """
                SELECT string_agg(transaction_id, ',' ORDER BY transaction_id) FROM subscription_periods
                 WHERE original_transaction_id = '7900030' AND refunded_at IS NOT NULL
                """, as: String.self) == "7900034,7900035")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a backend's own verified naming another transaction than its order's receipt-received is 409 transaction-mismatch, stored nowhere; naming its own, or none, verifies")
    func verifiedNamesItsOwnTransaction() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await claimed(http, "o-one", user: "erin", transaction: "7900041")
            try await claimed(http, "o-two", user: "erin", transaction: "7900042")
            let events = try await eventCount(db)
            let (status, refused) = try await http.send(.post, "/v1/orders/o-one/events", json: ["type": "verified", "data": ["transactionId": "7900042"]])
            let error = refused["error"] as? [String: Any]
            #expect(status == .conflict && error?["code"] as? String == "transaction-mismatch" && error?["field"] as? String == "data.transactionId", "\(refused)")
            #expect(try await eventCount(db) == events)
            let (own, verified) = try await http.send(.post, "/v1/orders/o-one/events", json: ["type": "verified", "data": ["transactionId": "7900041"]])
            #expect(own == .created && verified["state"] as? String == "verified" && verified["transactionId"] as? String == "7900041", "\(verified)")
            let (none, _) = try await http.send(.post, "/v1/orders/o-two/events", json: ["type": "verified", "data": [:]])
            #expect(none == .created)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a transaction waiting in the pool for one user: another user's proof naming that user's order holds it for support; a backend's receipt-received of it is 409 user-mismatch")
    func pooledForAnotherUser() async throws {
        try await withReceiptsApplication(apple) { http, db in
            for (order, user) in [("o-b1", "bob"), ("o-b2", "bob"), ("o-a1", "alice")] {
                try await http.send(.post, "/v1/orders", json: newOrder(order, user: user))
            }
            // Alice's client sent it first, naming no order: it waits for her.
            let first = try await apple.sign(TestApple.transaction("7900041"))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": first, "userId": "alice"])
            #expect(pooled["outcome"] as? String == "unmatched" && pooled["reason"] as? String == "no-order", "\(pooled)")
            // Bob's client names his own order: support decides, as for an Apple account of another user.
            let (_, claimed) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": first, "userId": "bob", "orderId": "o-b1"])
            #expect(claimed["outcome"] as? String == "unmatched" && claimed["reason"] as? String == "account-conflict", "\(claimed)")
            #expect(claimed["finishTransaction"] as? Bool == false, "\(claimed)")
            let (_, bobs) = try await http.send(.get, "/v1/orders/o-b1")
            #expect(bobs["state"] as? String == "created", "\(bobs)")
            #expect(try await scalar(db, """
                SELECT claimed_by || ' ' || owner_user_id FROM dashboards.apple_account_conflicts WHERE transaction_id = '7900041'
                """, as: String.self) == "bob alice")

            // Bob's backend claims another that waits for Alice: refused, nothing appended.
            let second = try await apple.sign(TestApple.transaction("7900042"))
            _ = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": second, "userId": "alice"])
            let events = try await eventCount(db)
            let (status, refused) = try await http.send(.post, "/v1/orders/o-b2/events", json: ["type": "receipt-received", "data": receipt("7900042")])
            #expect(status == .conflict && errorOf(refused)["code"] as? String == "user-mismatch", "\(refused)")
            // Whatever rule the backend says it paired by.
            var token = receipt("7900042")
            token["matchedBy"] = "appAccountToken"
            let (byToken, tokenRefused) = try await http.send(.post, "/v1/orders/o-b2/events", json: ["type": "receipt-received", "data": token])
            #expect(byToken == .conflict && errorOf(tokenRefused)["code"] as? String == "user-mismatch", "\(tokenRefused)")
            #expect(try await eventCount(db) == events)
            // Bob's client naming a closed order of his: nothing changes, it still waits for alice.
            try await http.send(.post, "/v1/orders", json: newOrder("o-b3", user: "bob"))
            try await http.send(.post, "/v1/orders/o-b3/events", json: ["type": "failed", "data": ["reason": "cancelled"]])
            let (_, closed) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": second, "userId": "bob", "orderId": "o-b3"])
            #expect(closed["outcome"] as? String == "unmatched" && closed["reason"] as? String == "order-closed", "\(closed)")
            #expect(try await scalar(db, "SELECT status || ' ' || user_id FROM apple_transactions WHERE transaction_id = '7900042'", as: String.self) == "unmatched alice")
            // Alice's own order still takes it.
            let (_, own) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": second, "userId": "alice", "orderId": "o-a1"])
            #expect(own["outcome"] as? String == "matched" && own["orderId"] as? String == "o-a1", "\(own)")
            // Pooled for alice, then its Apple account linked to bob: Apple's account decides, and
            // bob's proof naming his order is matched (the pass would hold alice's entry).
            let third = try await apple.sign(TestApple.transaction("7900043"))
            _ = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": third, "userId": "alice"])
            let (_, linked) = try await http.send(.post, "/v1/users/bob/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("app-tx-7900043"))])
            #expect(linked["outcome"] as? String == "linked", "\(linked)")
            let (_, bobs2) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": third, "userId": "bob", "orderId": "o-b2"])
            #expect(bobs2["outcome"] as? String == "matched" && bobs2["orderId"] as? String == "o-b2", "\(bobs2)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a backend's own claim of a transaction the ledger does not hold, naming another product than its order's, is 409 product-mismatch, nothing appended")
    func backendClaimSaysOtherwise() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-p", user: "dave"))
            let events = try await eventCount(db)
            let (status, refused) = try await http.send(.post, "/v1/orders/o-p/events", json: ["type": "receipt-received", "data": receipt("7900051", product: "gems.999")])
            #expect(status == .conflict && errorOf(refused)["code"] as? String == "product-mismatch", "\(refused)")
            #expect(try await eventCount(db) == events)
        }
    }

    @Test("a verified naming the environment without the transaction places it on the order's transaction: answered, stored and counted alike; a retry is the same event")
    func verifiedEnvironmentWithoutTransaction() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-env", user: "erin"))
            let (claimed, _) = try await http.send(.post, "/v1/orders/o-env/events", json: ["type": "receipt-received", "data": receipt("7900061")])
            #expect(claimed == .created)
            let event: [String: Any] = ["type": "verified", "eventId": "6f1c2a10-3b7e-4c55-9d2e-0a8b1c2d3e61", "data": ["environment": "Sandbox"]]
            let (status, answer) = try await http.send(.post, "/v1/orders/o-env/events", json: event)
            #expect(status == .created && answer["environment"] as? String == "Sandbox", "\(answer)")
            let (_, read) = try await http.send(.get, "/v1/orders/o-env")
            #expect(read["environment"] as? String == "Sandbox", "\(read)")
            #expect(try await scalar(db, "SELECT environment FROM apple_transactions WHERE transaction_id = '7900061'", as: String.self) == "Sandbox")
            let events = try await eventCount(db)
            let (again, _) = try await http.send(.post, "/v1/orders/o-env/events", json: event)
            #expect(again == .ok)
            #expect(try await eventCount(db) == events)
            // A backend's own claim is no pairing support undoes: the retry keeps naming the same.
            let (undone, undo) = try await http.send(.post, "/v1/transactions/7900061/unmatch", json: ["reason": "test"])
            #expect(undone == .conflict && errorOf(undo)["code"] as? String == "not-a-pool-pairing", "\(undo)")
            // Members the event does not know are kept as written, numbers past 2^53 too.
            try await http.send(.post, "/v1/orders", json: newOrder("o-env-2", user: "erin"))
            _ = try await http.send(.post, "/v1/orders/o-env-2/events", json: ["type": "receipt-received", "data": receipt("7900062")])
            let (kept, _) = try await http.send(
                .post, "/v1/orders/o-env-2/events", raw: #"{"type":"verified","data":{"environment":"Sandbox","n":12345678901234567891}}"#)
            #expect(kept == .created)
            #expect(try await scalar(db, """
                SELECT data->>'transactionId' || ' ' || (data->'n')::text FROM events WHERE stream_id = 'order-o-env-2' AND type = 'verified'
                """, as: String.self) == "7900062 12345678901234567891")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}
