import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("Support: searching the pool and pairing by hand")
struct SupportRoutesTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    func pool(_ http: LedgerHTTP, _ id: String, user: String?, product: String = "gems.100", signed: String? = nil, as sender: String? = nil) async throws {
        let jws = if let signed { signed } else { try await apple.sign(TestApple.transaction(id, product: product)) }
        var body: [String: Any] = ["signedTransaction": jws]
        if let user = user ?? sender { body["userId"] = user }
        let (_, answer) = try await http.send(.post, "/v1/receipts", json: body)
        #expect(answer["outcome"] as? String == "unmatched")
    }

    @Test("the pool is searchable by user, product, time and transaction id, and pages")
    func search() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            try await pool(http, "7000001", user: "s-1")
            try await pool(http, "7000002", user: "s-1", product: "gems.500")
            try await pool(http, "7000003", user: "s-2")
            try await pool(http, "7000004", user: nil)
            let (status, all) = try await http.send(.get, "/v1/transactions/unmatched")
            #expect(status == .ok && (all["transactions"] as? [[String: Any]])?.count == 4)
            let (_, mine) = try await http.send(.get, "/v1/transactions/unmatched?userId=s-1&productId=gems.500")
            let rows = mine["transactions"] as? [[String: Any]] ?? []
            #expect(rows.map { $0["transactionId"] as? String } == ["7000002"])
            #expect((rows.first?["verification"] as? [String: Any])?["reason"] as? String == "no-order")
            let (_, one) = try await http.send(.get, "/v1/transactions/unmatched?transactionId=7000004")
            #expect((one["transactions"] as? [[String: Any]])?.first?["userId"] is NSNull)
            let (_, future) = try await http.send(.get, "/v1/transactions/unmatched?from=2100-01-01T00:00:00Z")
            #expect((future["transactions"] as? [[String: Any]])?.isEmpty == true)
            let (_, page) = try await http.send(.get, "/v1/transactions/unmatched?limit=3")
            #expect(page["next"] as? String == "7000003")
            // Empty pieces of a query (a leading, doubled or trailing `&`) name nothing.
            let (loose, same) = try await http.send(.get, "/v1/transactions/unmatched?&limit=3&&")
            #expect(loose == .ok && same["next"] as? String == "7000003", "\(same)")
            let (_, rest) = try await http.send(.get, "/v1/transactions/unmatched?limit=3&after=7000003")
            #expect((rest["transactions"] as? [[String: Any]])?.map { $0["transactionId"] as? String } == ["7000004"])
            let (bad, error) = try await http.send(.get, "/v1/transactions/unmatched?from=yesterday")
            #expect(bad == .badRequest && errorOf(error)["field"] as? String == "from")
            // A misspelt or repeated parameter is refused by name, never ignored: the whole pool,
            // or the default 30 days of a report, would look like an answer.
            let refusals = [
                ("/v1/transactions/unmatched?userID=s-1", "userID", "is not a query parameter of GET /v1/transactions/unmatched; use userId, productId"),
                ("/v1/transactions/unmatched?userId=s-1&userId=s-2", "userId", "is given more than once"),
                ("/v1/reports/reconciliation?frm=2020-01-01", "frm", "use from, to"),
                // The router ignores empty segments; so does the check.
                ("//v1//reports/reconciliation/?frm=2020-01-01", "frm", "use from, to"),
                ("/v1/orders/s-1?bundleId=com.example.game", "bundleId", "this route takes no query parameters"),
            ]
            for (path, field, message) in refusals {
                let (status, refused) = try await http.send(.get, path)
                #expect(status == .badRequest && errorOf(refused)["code"] as? String == "invalid-input", "\(path)")
                #expect(errorOf(refused)["field"] as? String == field && (errorOf(refused)["message"] as? String ?? "").contains(message), "\(path): \(refused)")
            }
            // A value that is not percent-encoded UTF-8 is refused, never read as U+FFFD or as written.
            for query in ["userId=%FF", "userId=%zz", "user%FFId=1"] {
                let (status, refused) = try await http.send(.get, "/v1/transactions/unmatched?\(query)")
                #expect(status == .badRequest && (errorOf(refused)["message"] as? String ?? "").contains("percent-encoding"), "\(query): \(refused)")
            }
            let (unknownRoute, _) = try await http.send(.get, "/v1/nowhere?x=1")
            #expect(unknownRoute == .notFound)
        }
    }

    @Test("a pooled purchase of no user whose Apple account the ledger knows for a user: support pairs it with another user's order only with force and a reason")
    func matchAgainstTheKnownUser() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            // s-1 owns the Apple account; its purchase arrives with no user.
            let (linked, _) = try await http.send(
                .post, "/v1/users/s-1/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("app-tx-7000020"))])
            #expect(linked == .ok)
            var purchase = TestApple.transaction("7000020")
            purchase.appTransactionId = "app-tx-7000020"
            try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await apple.sign(purchase)])
            try await http.send(.post, "/v1/orders", json: newOrder("k-other", user: "s-2"))
            let (refused, error) = try await http.send(.post, "/v1/transactions/7000020/match", json: ["orderId": "k-other"])
            #expect(refused == .conflict && errorOf(error)["code"] as? String == "user-mismatch", "\(refused) \(error)")
            let (_, order) = try await http.send(.get, "/v1/orders/k-other")
            #expect(order["state"] as? String == "created")
            // The reason is recorded on the order's event: at most 1000 characters, as an undo's.
            let (long, tooLong) = try await http.send(.post, "/v1/transactions/7000020/match", json: ["orderId": "k-other", "force": true, "reason": String(repeating: "r", count: 1_001)])
            #expect(long == .badRequest && errorOf(tooLong)["code"] as? String == "reason-too-long", "\(tooLong)")
            let (forced, _) = try await http.send(.post, "/v1/transactions/7000020/match", json: ["orderId": "k-other", "force": true, "reason": "ticket 7: the account was sold with the device"])
            #expect(forced == .ok)
        }
    }

    @Test("a purchase pooled for one user, of an Apple account linked since to another, is a conflict to support before any pass holds it: a reason, and one of the two users")
    func matchPooledAgainstALaterLink() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            var purchase = TestApple.transaction("7000030")
            purchase.appTransactionId = "app-tx-7000030"
            try await pool(http, "7000030", user: nil, product: "gems.100", signed: try await apple.sign(purchase), as: "s-bob")
            let (linked, _) = try await http.send(
                .post, "/v1/users/s-alice/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("app-tx-7000030"))])
            #expect(linked == .ok)
            try await http.send(.post, "/v1/orders", json: newOrder("c-bob", user: "s-bob"))
            try await http.send(.post, "/v1/orders", json: newOrder("c-carol", user: "s-carol"))
            let (noReason, why) = try await http.send(.post, "/v1/transactions/7000030/match", json: ["orderId": "c-bob"])
            #expect(noReason == .badRequest && errorOf(why)["code"] as? String == "reason-required", "\(noReason) \(why)")
            let (third, thirdWhy) = try await http.send(.post, "/v1/transactions/7000030/match", json: ["orderId": "c-carol", "reason": "ticket 9"])
            #expect(third == .conflict && errorOf(thirdWhy)["code"] as? String == "user-mismatch", "\(third) \(thirdWhy)")
            let (paired, order) = try await http.send(.post, "/v1/transactions/7000030/match", json: ["orderId": "c-bob", "reason": "ticket 9: Alice gave Bob the device"])
            #expect(paired == .ok && order["state"] as? String == "verified", "\(order)")
        }
    }

    @Test("a subscription's start support pairs with another user's order is that user's, and the undo gives it back; a purchase pooled for no one goes back to no one")
    func supportMovesWhatItPairs() async throws {
        try await withReceiptsApplication(apple) { http, db in
            func subscriptions(_ user: String) async throws -> [String] {
                let (_, answer) = try await http.send(.get, "/v1/users/\(user)/subscriptions")
                return (answer["subscriptions"] as? [[String: Any]] ?? []).map { "\($0["originalTransactionId"] ?? "") \($0["orderId"] ?? "-")" }
            }
            // Its client named ss-1: started, and ss-1's.
            try await pool(http, "7100001", user: "ss-1", signed: try await apple.sign(SubscriptionIntakeTests.subscription("7100001")))
            #expect(try await subscriptions("ss-1").count == 1)
            try await http.send(.post, "/v1/orders", json: newOrder("ss-o2", user: "ss-2", product: "monthly"))
            let (forced, paired) = try await http.send(
                .post, "/v1/transactions/7100001/match", json: ["orderId": "ss-o2", "force": true, "reason": "ticket 7: ss-2 is the customer's account"])
            #expect(forced == .ok && paired["state"] as? String == "verified", "\(paired)")
            let (toOrder, fromPool) = (try await subscriptions("ss-2"), try await subscriptions("ss-1"))
            #expect(toOrder == ["7100001 ss-o2"] && fromPool.isEmpty, "the order's user paid for it: \(toOrder), \(fromPool)")
            let (undone, _) = try await http.send(.post, "/v1/transactions/7100001/unmatch", json: ["reason": "wrong account after all"])
            #expect(undone == .ok)
            let (pooledAgain, orderUser) = (try await subscriptions("ss-1"), try await subscriptions("ss-2"))
            #expect(pooledAgain.count == 1 && orderUser.isEmpty, "back with the user it was pooled for: \(pooledAgain), \(orderUser)")

            // A start pooled for no one, paired by support with ss-5's order, undone: no one's again; then
            // the buyer's client sends it with the buyer's order: the buyer's.
            var start = SubscriptionIntakeTests.subscription("7100003")
            start.purchaseDate = Date(timeIntervalSinceNow: -60).millisecondsSince1970
            let signedStart = try await apple.sign(start)
            try await pool(http, "7100003", user: nil, signed: signedStart)
            try await http.send(.post, "/v1/orders", json: newOrder("ss-o5", user: "ss-5", product: "monthly"))
            try await http.send(.post, "/v1/orders", json: newOrder("ss-o6", user: "ss-6", product: "monthly"))
            #expect(try await http.send(.post, "/v1/transactions/7100003/match", json: ["orderId": "ss-o5"]).0 == .ok)
            #expect(try await subscriptions("ss-5") == ["7100003 ss-o5"])
            #expect(try await http.send(.post, "/v1/transactions/7100003/unmatch", json: ["reason": "ss-5 did not buy it"]).0 == .ok)
            #expect(try await subscriptions("ss-5").isEmpty, "no one's while its start pays no order")
            let (_, bought) = try await http.send(.post, "/v1/receipts", json: ["orderId": "ss-o6", "signedTransaction": signedStart])
            #expect(bought["outcome"] as? String == "matched", "\(bought)")
            let (buyer, guessed) = (try await subscriptions("ss-6"), try await subscriptions("ss-5"))
            #expect(buyer == ["7100003 ss-o6"] && guessed.isEmpty, "\(buyer), \(guessed)")

            // A start held for an Apple-account conflict (claimed by ss-a, the account ss-k's): support
            // pairs it with ss-k's order, then undoes that: held again, the subscription no one's.
            try await http.send(.post, "/v1/users/ss-k/app-transaction", json: ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("acct-ssk"))])
            var conflict = SubscriptionIntakeTests.subscription("7100004")
            conflict.purchaseDate = Date(timeIntervalSinceNow: -60).millisecondsSince1970
            conflict.appTransactionId = "acct-ssk"
            let (_, held) = try await http.send(.post, "/v1/receipts", json: ["userId": "ss-a", "signedTransaction": try await apple.sign(conflict)])
            #expect(held["reason"] as? String == "account-conflict", "\(held)")
            try await http.send(.post, "/v1/orders", json: newOrder("ss-ok", user: "ss-k", product: "monthly"))
            #expect(try await http.send(.post, "/v1/transactions/7100004/match", json: ["orderId": "ss-ok", "reason": "ss-k owns the account"]).0 == .ok)
            #expect(try await subscriptions("ss-k") == ["7100004 ss-ok"])
            #expect(try await http.send(.post, "/v1/transactions/7100004/unmatch", json: ["reason": "not settled after all"]).0 == .ok)
            let (owner, claimant) = (try await subscriptions("ss-k"), try await subscriptions("ss-a"))
            #expect(owner.isEmpty && claimant.isEmpty, "no one's until support decides: \(owner), \(claimant)")

            // Pooled for no one, paired by support with ss-3's order twice and undone twice: no one's again, the order avoided once.
            try await pool(http, "7100002", user: nil)
            try await http.send(.post, "/v1/orders", json: newOrder("ss-o3", user: "ss-3"))
            for _ in 0..<2 {
                #expect(try await http.send(.post, "/v1/transactions/7100002/match", json: ["orderId": "ss-o3"]).0 == .ok)
                #expect(try await http.send(.post, "/v1/transactions/7100002/unmatch", json: ["reason": "not ss-3's"]).0 == .ok)
            }
            #expect(try await scalar(db, "SELECT user_id FROM apple_transactions WHERE transaction_id = '7100002'", as: String?.self) == .some(nil))
            let undoneIds = try await scalar(
                db, "SELECT data->'undoneOrderIds' #>> '{}' FROM events WHERE stream_id = 'transaction-7100002' ORDER BY stream_version DESC LIMIT 1", as: String.self)
            #expect(undoneIds == #"["ss-o3"]"#, "\(String(describing: undoneIds))")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a backend's claim of a subscription's start that waits for another user, for its own user's order, is refused: the subscription stays with the user it was started for")
    func unverifiedClaimTakesNoSubscription() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            var start = SubscriptionIntakeTests.subscription("7100010")
            start.purchaseDate = Date(timeIntervalSinceNow: -60).millisecondsSince1970
            let signed = try await apple.sign(start)
            try await pool(http, "7100010", user: "uc-a", signed: signed)
            try await http.send(.post, "/v1/orders", json: newOrder("uc-ob", user: "uc-b", product: "monthly"))
            var claim = receipt("7100010", product: "monthly")
            claim["purchaseDate"] = ISO8601DateFormatter().string(from: Date(timeIntervalSinceNow: -60))
            // It waits for uc-a: a backend's claim for another user's order is refused, as support's
            // match without force is.
            let (claimed, answer) = try await http.send(.post, "/v1/orders/uc-ob/events", json: ["type": "receipt-received", "data": claim])
            #expect(claimed == .conflict && errorOf(answer)["code"] as? String == "user-mismatch", "\(answer)")
            // uc-a's client sends its proof again.
            try await http.send(.post, "/v1/receipts", json: ["userId": "uc-a", "signedTransaction": signed])
            let (_, own) = try await http.send(.get, "/v1/users/uc-a/subscriptions")
            let (_, other) = try await http.send(.get, "/v1/users/uc-b/subscriptions")
            #expect((own["subscriptions"] as? [Any])?.count == 1 && (other["subscriptions"] as? [Any])?.isEmpty == true, "\(own) \(other)")
        }
    }

    @Test("support pairs by hand; another user's or product's order needs force and a reason; who did it is recorded")
    func matchByHand() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await pool(http, "7000010", user: "s-1")
            try await pool(http, "7000011", user: nil, product: "gems.500")
            try await http.send(.post, "/v1/orders", json: newOrder("s-own", user: "s-1"))
            try await http.send(.post, "/v1/orders", json: newOrder("s-other", user: "s-2"))
            try await http.send(.post, "/v1/orders", json: newOrder("s-gems", user: "s-3", product: "gems.100"))

            let (refused, error) = try await http.send(.post, "/v1/transactions/7000010/match", json: ["orderId": "s-other"])
            #expect(refused == .conflict && errorOf(error)["code"] as? String == "user-mismatch")
            let (noReason, _) = try await http.send(.post, "/v1/transactions/7000010/match", json: ["orderId": "s-other", "force": true])
            #expect(noReason == .badRequest)
            for blank in ["", "   ", "\u{FEFF}\t"] {
                let (blankReason, why) = try await http.send(.post, "/v1/transactions/7000010/match", json: ["orderId": "s-other", "force": true, "reason": blank])
                #expect(blankReason == .badRequest && errorOf(why)["code"] as? String == "reason-required", "\(blank.unicodeScalars.map(\.value)): \(why)")
            }
            for force: Any in ["yes", 1, ["on"]] {
                let (notBoolean, why) = try await http.send(.post, "/v1/transactions/7000010/match", json: ["orderId": "s-own", "force": force, "reason": "r"])
                #expect(notBoolean == .badRequest && (errorOf(why)["message"] as? String ?? "").contains("force"), "force: \(force)")
            }
            let (status, order) = try await http.send(.post, "/v1/transactions/7000010/match", json: ["orderId": "s-own"])
            #expect(status == .ok && order["state"] as? String == "verified" && order["transactionId"] as? String == "7000010")
            let (again, twice) = try await http.send(.post, "/v1/transactions/7000010/match", json: ["orderId": "s-own"])
            #expect(again == .conflict && errorOf(twice)["code"] as? String == "transaction-not-unmatched")

            let (product, productError) = try await http.send(.post, "/v1/transactions/7000011/match", json: ["orderId": "s-gems"])
            #expect(product == .conflict && errorOf(productError)["code"] as? String == "product-mismatch")
            let (forced, _) = try await http.send(.post, "/v1/transactions/7000011/match", json: ["orderId": "s-gems", "force": true, "reason": "ticket 42: app v1 sold gems.500 as gems.100"])
            #expect(forced == .ok)
            let (_, stream) = try await http.send(.get, "/v1/streams/transaction-7000011/events")
            let matched = (stream["events"] as? [[String: Any]])?.last
            #expect((matched?["data"] as? [String: Any])?["matchedBy"] as? String == "support")
            #expect(((matched?["data"] as? [String: Any])?["rule"] as? String ?? "").contains("ticket 42"))
            #expect((matched?["metadata"] as? [String: Any])?["appendedBy"] as? String == "test-admin")
            let (missing, _) = try await http.send(.post, "/v1/transactions/0000/match", json: ["orderId": "s-own"])
            #expect(missing == .notFound)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}

@Suite("The product catalog and recovery orders")
struct ProductRoutesTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("products are set by admins and read by anyone with a key; bad values are 400s")
    func catalog() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let (status, product) = try await http.send(.put, "/v1/products/gems.100", json: ["price": "0.99", "currency": "USD"])
            #expect(status == .ok && product["status"] as? String == "active" && product["price"] as? String == "0.99")
            try await http.send(.put, "/v1/products/gems.old", json: ["status": "retired"])
            let (_, list) = try await http.send(.get, "/v1/products")
            #expect((list["products"] as? [[String: Any]])?.map { $0["productId"] as? String } == ["gems.100", "gems.old"])
            let (bad, error) = try await http.send(.put, "/v1/products/gems.100", json: ["status": "gone"])
            #expect(bad == .badRequest && errorOf(error)["field"] as? String == "status")
            let (badPrice, _) = try await http.send(.put, "/v1/products/gems.100", json: ["price": "-1"])
            #expect(badPrice == .badRequest)
            let reader = try await APIKeyStore(database: db.database).create(name: "reader", scopes: [.read])
            let (forbidden, _) = try await http.send(.put, "/v1/products/gems.100", json: ["status": "retired"], key: .some(reader))
            #expect(forbidden == .forbidden)
            let (allowed, _) = try await http.send(.get, "/v1/products", key: .some(reader))
            #expect(allowed == .ok)
        }
    }

    @Test("with the recovery policy on, an orphan with no candidate gets an order of its own, never for a retired or unknown product")
    func recoveryOrders() async throws {
        try await withReceiptsApplication(apple, configure: { $0.recoveryOrders = true }) { http, db in
            try await http.send(.put, "/v1/products/gems.100", json: ["price": "0.99", "currency": "USD"])
            try await http.send(.put, "/v1/products/gems.old", json: ["status": "retired"])
            for (id, product) in [("8000001", "gems.100"), ("8000002", "gems.old"), ("8000003", "gems.unknown")] {
                try await http.send(.post, "/v1/receipts", json: ["userId": "r-1", "signedTransaction": try await apple.sign(TestApple.transaction(id, product: product))])
            }
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["recoveryOrders"] as? Int == 1 && summary["notRecovered"] as? Int == 2)
            let (_, order) = try await http.send(.get, "/v1/orders/recovery-8000001")
            #expect(order["state"] as? String == "verified" && order["userId"] as? String == "r-1" && order["price"] as? String == "0.99")
            let (_, pool) = try await http.send(.get, "/v1/transactions/unmatched")
            #expect(Set((pool["transactions"] as? [[String: Any]] ?? []).compactMap { $0["transactionId"] as? String }) == ["8000002", "8000003"])
            // Support undoes the recovery: the orphan waits for support, counted as not recovered
            // at every pass, never as a race lost to another writer.
            let (undone, _) = try await http.send(.post, "/v1/transactions/8000001/unmatch", json: ["reason": "not this user's"])
            #expect(undone == .ok)
            let (_, next) = try await http.send(.post, "/v1/reconcile")
            #expect(next["recoveryOrders"] as? Int == 0 && next["lostRaces"] as? Int == 0 && next["notRecovered"] as? Int == 3, "\(next)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("with the recovery policy on, a retired app's orphan gets no order (the pass goes on); its open orders are still paired")
    func noRecoveryForARetiredApp() async throws {
        try await withReceiptsApplication(apple, configure: { $0.recoveryOrders = true }) { http, db in
            try await http.send(.put, "/v1/products/gems.100", json: ["price": "0.99", "currency": "USD"])
            try await http.send(.post, "/v1/orders", json: newOrder("o-r-8", user: "r-8"))
            let (retired, _) = try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["retired": true])
            #expect(retired == .ok)
            for (id, user) in [("8000021", "r-8"), ("8000022", "r-9")] {
                let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": user, "signedTransaction": try await apple.sign(TestApple.transaction(id))])
                #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            }
            let (status, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(status == .ok && summary["paired"] as? Int == 1 && summary["recoveryOrders"] as? Int == 0 && summary["notRecovered"] as? Int == 1, "\(summary)")
            let (_, order) = try await http.send(.get, "/v1/orders/o-r-8")
            #expect(order["state"] as? String == "verified" && order["transactionId"] as? String == "8000021", "\(order)")
            let (missing, _) = try await http.send(.get, "/v1/orders/recovery-8000022")
            #expect(missing == .notFound)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("with the policy off (the default), orphans with no candidate stay in the pool")
    func policyOff() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            try await http.send(.put, "/v1/products/gems.100", json: ["price": "0.99", "currency": "USD"])
            try await http.send(.post, "/v1/receipts", json: ["userId": "r-2", "signedTransaction": try await apple.sign(TestApple.transaction("8000010"))])
            let (_, summary) = try await http.send(.post, "/v1/reconcile")
            #expect(summary["recoveryOrders"] as? Int == 0 && summary["paired"] as? Int == 0)
            let (missing, _) = try await http.send(.get, "/v1/orders/recovery-8000010")
            #expect(missing == .notFound)
        }
    }
}
