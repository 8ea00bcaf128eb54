import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerCore
import LedgerServer
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// A key limited to one app over HTTP, beside another app's orders and pool (issue 39, point 5).
@Suite("A key limited to an app reaches nothing of another app")
struct KeyAppsRowsTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    /// The error object with the order id taken out, to compare another app's order with a missing one.
    static func shape(_ json: [String: Any], _ id: String) -> String {
        let error = errorOf(json)
        return "\(error["code"] ?? "") \((error["message"] as? String ?? "").replacingOccurrences(of: id, with: "ID"))"
    }

    @Test("another app's order is 404 as a missing one, to read and to append; lists, the pool and streams leave it out; creating for it is 403")
    func ordersOfAnotherApp() async throws {
        // Two apps: the configured one (TestApple's, whose proofs the ledger verifies) and alpha.
        let beta = TestApple.bundleId
        try await withReceiptsApplication(apple) { http, db in
            _ = try await AppCatalog(database: db.database).add(try BundleID(TwoApps.alpha), AppChanges())
            let keys = APIKeyStore(database: db.database)
            let alpha = try await keys.create(name: "alpha-backend", scopes: [.append, .read], apps: [try BundleID(TwoApps.alpha)])
            let alphaSupport = try await keys.create(name: "alpha-support", scopes: [.admin], apps: [try BundleID(TwoApps.alpha)])
            var order = newOrder("a-1")
            order["bundleId"] = TwoApps.alpha
            #expect(try await http.send(.post, "/v1/orders", json: order).0 == .created)
            order = newOrder("b-1")
            order["bundleId"] = beta
            #expect(try await http.send(.post, "/v1/orders", json: order).0 == .created)
            // A transaction of beta's that no order takes: in beta's pool.
            let signed = try await apple.sign(TestApple.transaction("9200001", product: "gems.500"))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": signed])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")

            // Reading: beta's order answers as a missing one, word for word.
            let (hidden, hiddenAnswer) = try await http.send(.get, "/v1/orders/b-1", key: .some(alpha))
            let (missing, missingAnswer) = try await http.send(.get, "/v1/orders/nothing", key: .some(alpha))
            #expect(hidden == .notFound && missing == .notFound)
            #expect(Self.shape(hiddenAnswer, "b-1") == Self.shape(missingAnswer, "nothing"), "\(hiddenAnswer) \(missingAnswer)")
            let (own, ownAnswer) = try await http.send(.get, "/v1/orders/a-1", key: .some(alpha))
            #expect(own == .ok && ownAnswer["bundleId"] as? String == TwoApps.alpha, "\(ownAnswer)")
            // Appending: the same.
            let failed: [String: Any] = ["type": "failed", "data": ["reason": "cancelled"]]
            let (refused, refusedAnswer) = try await http.send(.post, "/v1/orders/b-1/events", json: failed, key: .some(alpha))
            let (_, missingAppend) = try await http.send(.post, "/v1/orders/nothing/events", json: failed, key: .some(alpha))
            #expect(refused == .notFound && Self.shape(refusedAnswer, "b-1") == Self.shape(missingAppend, "nothing"), "\(refusedAnswer)")
            #expect(try await http.send(.get, "/v1/orders/b-1").1["state"] as? String == "created", "nothing was appended")
            // Streams: beta's order's stream holds no events for alpha's key; the pool's needs every app.
            let (stream, streamAnswer) = try await http.send(.get, "/v1/streams/order-b-1/events", key: .some(alpha))
            #expect(stream == .ok && (streamAnswer["events"] as? [Any])?.isEmpty == true, "\(streamAnswer)")
            #expect(try await http.send(.get, "/v1/streams/order-a-1/events", key: .some(alpha)).1["events"].map { ($0 as? [Any])?.count } == 1)
            let (poolStream, poolStreamAnswer) = try await http.send(.get, "/v1/streams/transaction-9200001/events", key: .some(alpha))
            #expect(poolStream == .forbidden && errorOf(poolStreamAnswer)["code"] as? String == "all-apps-key-required")
            // Lists: alpha's rows alone, for the same user id.
            for uri in ["/v1/orders", "/v1/orders?userId=u-1", "/v1/orders?state=open"] {
                let (_, list) = try await http.send(.get, uri, key: .some(alpha))
                #expect((list["orders"] as? [[String: Any]])?.map { $0["orderId"] as? String } == ["a-1"], "\(uri): \(list)")
                let (_, all) = try await http.send(.get, uri)
                #expect((all["orders"] as? [[String: Any]])?.count == 2, "\(uri): a key of every app sees both")
            }
            for uri in ["/v1/transactions/unmatched", "/v1/transactions/unmatched?transactionId=9200001"] {
                let (_, pool) = try await http.send(.get, uri, key: .some(alpha))
                #expect((pool["transactions"] as? [Any])?.isEmpty == true, "\(uri): \(pool)")
                let (_, all) = try await http.send(.get, uri)
                #expect((all["transactions"] as? [Any])?.count == 1, "\(uri): \(all)")
            }
            // A list filtered by an app the key does not reach, held or not: 403, as the user routes
            // answer; a key of every app naming one the ledger does not hold: 400 unknown-app, not an
            // empty list that would read as an app with nothing.
            for list in ["/v1/orders", "/v1/transactions/unmatched"] {
                for app in [beta, "com.example.nothing"] {
                    let (status, answer) = try await http.send(.get, "\(list)?bundleId=\(app)", key: .some(alpha))
                    #expect(status == .forbidden && errorOf(answer)["code"] as? String == "app-not-allowed", "\(list) \(app): \(answer)")
                }
                let (unknown, answer) = try await http.send(.get, "\(list)?userId=u-1&bundleId=com.example.nothing")
                #expect(unknown == .badRequest && errorOf(answer)["code"] as? String == "unknown-app", "\(list): \(answer)")
                let (own, _) = try await http.send(.get, "\(list)?bundleId=\(TwoApps.alpha)", key: .some(alpha))
                #expect(own == .ok)
            }
            // The catalog and the report: alpha's alone.
            #expect(try await http.send(.put, "/v1/products/gems.500", json: ["price": "4.99", "currency": "USD"]).0 == .ok)
            let (setByAlpha, alphaProduct) = try await http.send(.put, "/v1/products/gems.100", json: ["price": "0.99", "currency": "USD"], key: .some(alphaSupport))
            #expect(setByAlpha == .ok, "\(alphaProduct)")
            let (notBeta, notBetaAnswer) = try await http.send(
                .put, "/v1/products/gems.100", json: ["price": "9.99", "currency": "USD", "bundleId": beta], key: .some(alphaSupport))
            #expect(notBeta == .forbidden && errorOf(notBetaAnswer)["code"] as? String == "app-not-allowed", "\(notBetaAnswer)")
            let (_, alphaProducts) = try await http.send(.get, "/v1/products", key: .some(alpha))
            #expect((alphaProducts["products"] as? [[String: Any]])?.map { $0["productId"] as? String } == ["gems.100"], "\(alphaProducts)")
            #expect(try await scalar(db, "SELECT bundle_id FROM products WHERE product_id = 'gems.100'", as: String.self) == TwoApps.alpha)
            #expect((try await http.send(.get, "/v1/products").1["products"] as? [Any])?.count == 2)
            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation", key: .some(alpha))
            let rows = report["rows"] as? [[String: Any]] ?? []
            #expect(!rows.isEmpty && rows.allSatisfy { $0["bundleId"] as? String == TwoApps.alpha }, "\(rows)")
            #expect((report["unmatched"] as? [String: Any])?["count"] as? Int == 0, "\(report)")
            let (_, everyReport) = try await http.send(.get, "/v1/reports/reconciliation")
            #expect((everyReport["rows"] as? [[String: Any]])?.count == 2 && (everyReport["unmatched"] as? [String: Any])?["count"] as? Int == 1)

            // Support's match of beta's transaction: as one that does not exist.
            let (match, matchAnswer) = try await http.send(
                .post, "/v1/transactions/9200001/match", json: ["orderId": "a-1", "force": true, "reason": "test"], key: .some(alphaSupport))
            #expect(match == .notFound && errorOf(matchAnswer)["code"] as? String == "transaction-not-found", "\(matchAnswer)")
            let (unmatch, _) = try await http.send(.post, "/v1/transactions/9200001/unmatch", json: ["reason": "test"], key: .some(alphaSupport))
            #expect(unmatch == .notFound)

            // Creating: for beta (or an app the ledger does not hold) 403; without an app, alpha's.
            for app in [beta, "com.example.nothing"] {
                var order = newOrder("a-2")
                order["bundleId"] = app
                let (status, answer) = try await http.send(.post, "/v1/orders", json: order, key: .some(alpha))
                #expect(status == .forbidden && errorOf(answer)["code"] as? String == "app-not-allowed", "\(app): \(answer)")
            }
            let (created, createdAnswer) = try await http.send(.post, "/v1/orders", json: newOrder("a-2"), key: .some(alpha))
            #expect(created == .created && createdAnswer["bundleId"] as? String == TwoApps.alpha, "\(createdAnswer)")
            // An order id beta's order holds: taken, without its order.
            var taken = newOrder("b-1")
            taken["bundleId"] = TwoApps.alpha
            let (conflict, conflictAnswer) = try await http.send(.post, "/v1/orders", json: taken, key: .some(alpha))
            #expect(conflict == .conflict && conflictAnswer["orderId"] == nil, "\(conflictAnswer)")
            let (replay, replayAnswer) = try await http.send(.post, "/v1/orders", json: newOrder("b-1"), key: .some(alpha))
            #expect(replay == .conflict && replayAnswer["orderId"] == nil, "a retry of beta's own body is no way in: \(replayAnswer)")

            // A backend's own claim of beta's pooled transaction on alpha's order: refused as
            // another app's, before its product (or whether an order holds it) is told.
            let claim: [String: Any] = [
                "type": "receipt-received",
                "data": ["transactionId": "9200001", "productId": "gems.100", "purchaseDate": LedgerJSONDate.now(minus: 60),
                         "receiptSha256": String(repeating: "0", count: 64), "format": "jws", "matchedBy": "applicationUsername"],
            ]
            let (claimed, claimedAnswer) = try await http.send(.post, "/v1/orders/a-1/events", json: claim, key: .some(alpha))
            #expect(claimed == .conflict && errorOf(claimedAnswer)["code"] as? String == "app-mismatch", "\(claimedAnswer)")
            #expect(!"\(claimedAnswer)".contains("gems.500"), "\(claimedAnswer)")

            // Alpha's backend claims a transaction id the ledger does not know yet; Apple signs it
            // for beta: alpha's unverified claim is taken back, and beta's order takes it.
            var squat = claim
            squat["data"] = (claim["data"] as? [String: Any] ?? [:]).merging(["transactionId": "9200009"]) { $1 }
            #expect(try await http.send(.post, "/v1/orders/a-1/events", json: squat, key: .some(alpha)).0 == .created)
            let proof = try await apple.sign(TestApple.transaction("9200009"))
            let (_, squatted) = try await http.send(.post, "/v1/receipts", json: ["orderId": "b-1", "signedTransaction": proof])
            #expect(squatted["outcome"] as? String == "matched" && squatted["orderId"] as? String == "b-1", "\(squatted)")
            #expect(try await http.send(.get, "/v1/orders/b-1").1["state"] as? String == "verified")
            #expect(try await http.send(.get, "/v1/orders/a-1", key: .some(alpha)).1["state"] as? String == "created")
        }
    }
}
