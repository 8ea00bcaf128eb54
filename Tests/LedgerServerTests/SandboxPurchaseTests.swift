import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// App Review buys in the sandbox against the production build, which talks to the production
/// ledger: a ledger that accepts both environments (the default) grants that purchase, shows its
/// environment everywhere, and keeps it out of production's revenue.
@Suite("Both environments: App Review's sandbox purchase in a production ledger")
struct SandboxPurchaseTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("a Sandbox-signed purchase is granted; the answer, the order, the feed and the dashboards say Sandbox; the report keeps it apart")
    func sandboxPurchaseGranted() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            for id in ["review-1", "paid-1"] {
                try await http.send(.post, "/v1/orders", json: ["orderId": id, "userId": "u-\(id)", "productId": "gems.100", "price": "0.99", "currency": "USD"])
            }
            let reviewer = try await apple.sign(TestApple.transaction("8800001", environment: "Sandbox"))
            let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "review-1", "signedTransaction": reviewer])
            #expect(status == .ok)
            #expect(answer["outcome"] as? String == "matched" && answer["state"] as? String == "verified", "\(answer)")
            #expect(answer["environment"] as? String == "Sandbox")
            let customer = try await apple.sign(TestApple.transaction("8800002", environment: "Production"))
            let (_, paid) = try await http.send(.post, "/v1/receipts", json: ["orderId": "paid-1", "signedTransaction": customer])
            #expect(paid["outcome"] as? String == "matched" && paid["environment"] as? String == "Production", "\(paid)")

            // The order: read, listed, and answered after a client's event (the write path).
            let (_, order) = try await http.send(.get, "/v1/orders/review-1")
            #expect(order["state"] as? String == "verified" && order["environment"] as? String == "Sandbox", "\(order)")
            #expect(try await http.send(.get, "/v1/orders/paid-1").1["environment"] as? String == "Production")
            let (_, delivered) = try await http.send(.post, "/v1/orders/review-1/events", json: ["type": "delivered", "data": [:]])
            #expect(delivered["state"] as? String == "delivered" && delivered["environment"] as? String == "Sandbox", "\(delivered)")
            let (_, list) = try await http.send(.get, "/v1/orders?userId=u-review-1")
            #expect((list["orders"] as? [[String: Any]])?.first?["environment"] as? String == "Sandbox", "\(list)")

            // The feed: the verified event names the environment Apple signed in. (Polled: other
            // tests' open transactions on the shared cluster may hold the gap-safe feed back.)
            var verified: [[String: Any]] = []
            for _ in 0..<2400 where verified.count < 2 {
                let (_, feed) = try await http.send(.get, "/v1/events?limit=1000")
                verified = (feed["events"] as? [[String: Any]] ?? []).filter { $0["type"] as? String == "verified" }
                if verified.count < 2 { try await Task.sleep(for: .milliseconds(50)) }
            }
            let environments = verified.map { ($0["streamId"] as? String ?? "", ($0["data"] as? [String: Any])?["environment"] as? String ?? "") }
            #expect(Dictionary(uniqueKeysWithValues: environments) == ["order-review-1": "Sandbox", "order-paid-1": "Production"], "\(verified)")

            // Apple refunds the reviewer's purchase in the sandbox: taken, and the sandbox's refund.
            var refunded = TestApple.transaction("8800001", environment: "Sandbox")
            refunded.revocationDate = Date().millisecondsSince1970
            refunded.revocationType = "REFUND_FULL"
            let (refundStatus, _) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded, environment: "Sandbox"))
            #expect(refundStatus == .ok)
            #expect(try await http.send(.get, "/v1/orders/review-1").1["state"] as? String == "refunded")
            // A sandbox orphan in the pool.
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-nobody", "signedTransaction": try await apple.sign(TestApple.transaction("8800003", environment: "Sandbox"))])

            // The report: the sandbox in rows of its own, never in production's totals.
            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let rows = report["rows"] as? [[String: Any]] ?? []
            let sandboxRows = rows.filter { $0["environment"] as? String == "Sandbox" }
            let productionRows = rows.filter { $0["environment"] as? String == "Production" }
            #expect(sandboxRows.count == 1 && productionRows.count == 1, "\(rows)")
            #expect(sandboxRows.first?["verified"] as? Int == 1 && sandboxRows.first?["refunded"] as? Int == 1, "\(sandboxRows)")
            let totals = report["totals"] as? [String: Any] ?? [:]
            let sandbox = report["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["environment"] as? String == "Production" && totals["ordersCreated"] as? Int == 1, "\(totals)")
            #expect(totals["verified"] as? Int == 1 && totals["refunded"] as? Int == 0 && totals["revenue"] as? String == "0.99", "\(totals)")
            #expect(sandbox["environment"] as? String == "Sandbox" && sandbox["ordersCreated"] as? Int == 1, "\(sandbox)")
            #expect(sandbox["verified"] as? Int == 1 && sandbox["refundedAmount"] as? String == "0.99" && sandbox["revenue"] as? String == "0", "\(sandbox)")
            #expect((report["unmatched"] as? [String: Any])?["byEnvironment"] as? [String: Int] == ["Sandbox": 1], "\(report)")
            let csv = try await http.client.execute(
                uri: "/v1/reports/reconciliation?from=2000-01-01", method: .get, headers: [.authorization: "Bearer \(http.key)", .accept: "text/csv"])
            let lines = String(buffer: csv.body).split(separator: "\n")
            #expect(lines.filter { $0.hasPrefix("total,total,") }.map { $0.split(separator: ",", omittingEmptySubsequences: false)[20] } == ["Production", "Sandbox"], "\(lines)")

            // The dashboards, as their reader sees them.
            let connection = try await db.connect()
            try await connection.query("SET ROLE ledger_reader", logger: TestServer.logger)
            var orders: [String: String] = [:]
            for try await (id, environment) in try await connection.query(
                "SELECT order_id, environment FROM dashboards.orders", logger: TestServer.logger).decode((String, String).self) {
                orders[id] = environment
            }
            var daily: [String: (Int, String?)] = [:]
            for try await (environment, count, refunded) in try await connection.query(
                "SELECT environment, sum(orders)::int, sum(refunded_amount)::text FROM dashboards.daily_orders GROUP BY environment",
                logger: TestServer.logger).decode((String, Int, String?).self) {
                daily[environment] = (count, refunded)
            }
            let pooled = try await connection.query(
                "SELECT environment FROM dashboards.unmatched_transactions", logger: TestServer.logger).decode(String.self)
            var pool: [String] = []
            for try await environment in pooled { pool.append(environment) }
            try await connection.close()
            #expect(orders == ["review-1": "Sandbox", "paid-1": "Production"])
            #expect(daily["Sandbox"]?.0 == 1 && daily["Sandbox"]?.1.flatMap { Decimal(string: $0) } == Decimal(string: "0.99"), "\(daily)")
            #expect(daily["Production"]?.0 == 1 && daily["Production"]?.1.flatMap { Decimal(string: $0) } == 0, "\(daily)")
            #expect(pool == ["Sandbox"])
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    @Test("set to Production alone, the ledger refuses the same purchase as wrong-environment, and the order stays created; a backend's own sandbox purchase too")
    func productionOnlyRefuses() async throws {
        try await withReceiptsApplication(apple, configure: { configuration in
            configuration.apple.environments = [.production]
            configuration.apple.appID = TestApple.appAppleId
        }) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("review-2"))
            let reviewer = try await apple.sign(TestApple.transaction("8800011", environment: "Sandbox"))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "review-2", "signedTransaction": reviewer])
            #expect(answer["outcome"] as? String == "rejected" && answer["reason"] as? String == "wrong-environment", "\(answer)")
            #expect(answer["finishTransaction"] as? Bool == true)
            #expect((answer["message"] as? String ?? "").hasSuffix("the app \(TestApple.bundleId) accepts Production"), "\(answer)")
            // The client named no transaction; Apple's signature verified: support finds the refusal by Apple's id.
            #expect(answer["transactionId"] as? String == "8800011", "\(answer)")
            #expect(try await scalar(db, "SELECT transaction_id FROM dashboards.rejected_proofs WHERE reason = 'wrong-environment'", as: String.self) == "8800011")
            let (_, order) = try await http.send(.get, "/v1/orders/review-2")
            #expect(order["state"] as? String == "created" && order["environment"] is NSNull, "\(order)")
            let note = try await apple.notification("REFUND", transaction: TestApple.transaction("8800012"), environment: "Sandbox")
            let (status, refusal) = try await http.notifyApple(note)
            #expect(status == .badRequest && errorOf(refusal)["code"] as? String == "wrong-environment", "\(refusal)")

            // A backend's own purchase in the sandbox is refused the same way; in production, taken.
            try await http.send(.post, "/v1/orders", json: newOrder("review-3"))
            var own = receipt("8800013")
            own["environment"] = "Sandbox"
            let (claimed, claim) = try await http.send(.post, "/v1/orders/review-3/events", json: ["type": "receipt-received", "data": own])
            #expect(claimed == .badRequest && errorOf(claim)["code"] as? String == "wrong-environment", "\(claim)")
            own["environment"] = "Production"
            #expect(try await http.send(.post, "/v1/orders/review-3/events", json: ["type": "receipt-received", "data": own]).0 == .created)
            let (verified, verifiedAnswer) = try await http.send(.post, "/v1/orders/review-3/events", json: [
                "type": "verified", "data": ["transactionId": "8800013", "environment": "Sandbox"]])
            #expect(verified == .badRequest && errorOf(verifiedAnswer)["code"] as? String == "wrong-environment", "\(verifiedAnswer)")
            let (_, held) = try await http.send(.get, "/v1/orders/review-3")
            #expect(held["state"] as? String == "receipt-received", "\(held)")
        }
    }

    @Test("a backend's own purchase in an environment its app no longer takes: 400 naming the field, but its retry answers as before; an order that does not exist is 404")
    func ownPurchaseAfterTheAppNarrowed() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); $0.apple.appID = TestApple.appAppleId }) { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("narrow-1"))
            var own = receipt("8800041")
            own["environment"] = "Sandbox"
            let event: [String: Any] = ["type": "receipt-received", "eventId": "6f1c1e9a-5d43-4c6e-9f6c-0d4c2c1b7a01", "data": own]
            #expect(try await http.send(.post, "/v1/orders/narrow-1/events", json: event).0 == .created)
            #expect(try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["environments": ["Production"]]).0 == .ok)
            let (again, answer) = try await http.send(.post, "/v1/orders/narrow-1/events", json: event)
            #expect(again == .ok && answer["state"] as? String == "receipt-received", "a retry is answered as it was: \(answer)")
            try await http.send(.post, "/v1/orders", json: newOrder("narrow-2"))
            var other = receipt("8800042")
            other["environment"] = "Sandbox"
            let (refused, refusal) = try await http.send(.post, "/v1/orders/narrow-2/events", json: ["type": "receipt-received", "data": other])
            #expect(refused == .badRequest && errorOf(refusal)["code"] as? String == "wrong-environment" && errorOf(refusal)["field"] as? String == "data.environment",
                    "\(refusal)")
            let (missing, _) = try await http.send(.post, "/v1/orders/narrow-none/events", json: ["type": "receipt-received", "data": other])
            #expect(missing == .notFound)
            // And the other way round: an app set to Sandbox alone takes no production purchase.
            #expect(try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["environments": ["Sandbox"]]).0 == .ok)
            other["environment"] = "Production"
            let (production, productionRefusal) = try await http.send(.post, "/v1/orders/narrow-2/events", json: ["type": "receipt-received", "data": other])
            #expect(production == .badRequest && errorOf(productionRefusal)["code"] as? String == "wrong-environment", "\(productionRefusal)")
        }
    }

    @Test("a legacy receipt keeps Apple's 21007 routing: production first, then the sandbox, and the transaction is the sandbox's")
    func legacySandboxReceipt() async throws {
        let purchase = Date().millisecondsSince1970 - 60_000
        let standIn = VerifyReceiptStandIn(answers: [
            "production:REVIEW": .json(#"{"status": 21007}"#),
            "sandbox:REVIEW": VerifyReceiptStandIn.valid(environment: "Sandbox", transactions: [("8800021", "gems.100", purchase)]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox, configure: bothEnvironments) { http, db in
                try await http.send(.post, "/v1/orders", json: newOrder("review-3"))
                let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "review-3", "receiptData": "REVIEW"])
                #expect(answer["outcome"] as? String == "matched" && answer["environment"] as? String == "Sandbox", "\(answer)")
                #expect(try await http.send(.get, "/v1/orders/review-3").1["environment"] as? String == "Sandbox")
                #expect(try await scalar(db, "SELECT environment FROM apple_transactions WHERE transaction_id = '8800021'", as: String.self) == "Sandbox")
            }
        }
        #expect(await standIn.calls("production:REVIEW") == 1)
        #expect(await standIn.calls("sandbox:REVIEW") == 1)
    }

    @Test("an app that refuses the sandbox refuses a receipt the sandbox answered (wrong-environment), and takes a production one")
    func legacySandboxReceiptRefused() async throws {
        let purchase = Date().millisecondsSince1970 - 60_000
        let standIn = VerifyReceiptStandIn(answers: [
            "production:REVIEW": .json(#"{"status": 21007}"#),
            "sandbox:REVIEW": VerifyReceiptStandIn.valid(environment: "Sandbox", transactions: [("8800031", "gems.100", purchase)]),
            "production:PAID": VerifyReceiptStandIn.valid(transactions: [("8800032", "gems.100", purchase)]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox, configure: { $0.apple.environments = [.production]; $0.apple.appID = TestApple.appAppleId }) { http, db in
                try await http.send(.post, "/v1/orders", json: newOrder("review-4"))
                let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "review-4", "receiptData": "REVIEW"])
                #expect(answer["outcome"] as? String == "rejected" && answer["reason"] as? String == "wrong-environment", "\(answer)")
                #expect(try await http.send(.get, "/v1/orders/review-4").1["state"] as? String == "created")
                #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE transaction_id = '8800031'", as: Int.self) == 0)
                let (_, paid) = try await http.send(.post, "/v1/receipts", json: ["orderId": "review-4", "receiptData": "PAID"])
                #expect(paid["outcome"] as? String == "matched" && paid["environment"] as? String == "Production", "\(paid)")
            }
        }
    }

    @Test(
        "a backend's own receipt-received names no environment, or Production: the client's proof verifies the order, and the sandbox's purchase counts as the sandbox's",
        arguments: ["", "Production"])
    func backendsOwnReceiptThenProof(claimedEnvironment: String) async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("review-own", user: "u-review-own"))
            var own = receipt("8800011")
            own["purchaseDate"] = ISO8601DateFormatter().string(from: Date())
            if !claimedEnvironment.isEmpty { own["environment"] = claimedEnvironment }
            let (claimed, _) = try await http.send(.post, "/v1/orders/review-own/events", json: ["type": "receipt-received", "data": own])
            #expect(claimed == .created)
            let (_, before) = try await http.send(.get, "/v1/orders/review-own")
            #expect(before["state"] as? String == "receipt-received" && before["environment"] as? String == (claimedEnvironment.isEmpty ? nil : claimedEnvironment),
                    "\(before)")

            let reviewer = try await apple.sign(TestApple.transaction("8800011", environment: "Sandbox"))
            let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "review-own", "signedTransaction": reviewer])
            #expect(answer["outcome"] as? String == "matched" && answer["state"] as? String == "verified", "\(answer)")
            let (_, order) = try await http.send(.get, "/v1/orders/review-own")
            #expect(order["state"] as? String == "verified" && order["environment"] as? String == "Sandbox", "\(order)")
            // Sent again: nothing more.
            let (_, again) = try await http.send(.post, "/v1/receipts", json: ["orderId": "review-own", "signedTransaction": reviewer])
            #expect(again["outcome"] as? String == "matched" && again["state"] as? String == "verified", "\(again)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'order-review-own' AND type = 'verified'", as: Int.self) == 1)

            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let totals = report["totals"] as? [String: Any] ?? [:]
            let sandbox = report["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["verified"] as? Int == 0 && sandbox["verified"] as? Int == 1, "\(report)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a backend's own verified naming the environment gives its transaction that environment, as a rebuild does")
    func backendsOwnVerified() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("own-verified", user: "u-own-verified"))
            let (claimed, _) = try await http.send(.post, "/v1/orders/own-verified/events", json: ["type": "receipt-received", "data": receipt("8800021")])
            #expect(claimed == .created)
            let (verified, answer) = try await http.send(.post, "/v1/orders/own-verified/events", json: [
                "type": "verified", "data": ["transactionId": "8800021", "environment": "Sandbox"],
            ])
            #expect(verified == .created && answer["environment"] as? String == "Sandbox", "\(answer)")
            let (_, order) = try await http.send(.get, "/v1/orders/own-verified")
            #expect(order["state"] as? String == "verified" && order["environment"] as? String == "Sandbox", "\(order)")
            #expect(try await scalar(db, "SELECT environment FROM apple_transactions WHERE transaction_id = '8800021'", as: String.self) == "Sandbox")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a backend's own claim and verified of a sandbox purchase waiting in the pool: what Apple signed stays, live and rebuilt")
    func backendsClaimOfPooledSandboxPurchase() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            // App Review's purchase, uploaded without an order: it waits in the pool, signed Sandbox.
            var purchase = TestApple.transaction("8800031", environment: "Sandbox")
            purchase.purchaseDate = Date().millisecondsSince1970
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-pooled-review", "signedTransaction": try await apple.sign(purchase)])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            try await http.send(.post, "/v1/orders", json: newOrder("claims-pooled", user: "u-pooled-review"))
            var own = receipt("8800031")
            own["purchaseDate"] = ISO8601DateFormatter().string(from: Date())
            own["environment"] = "Production"
            let (claimed, claim) = try await http.send(.post, "/v1/orders/claims-pooled/events", json: ["type": "receipt-received", "data": own])
            #expect(claimed == .created, "\(claim)")
            let (verified, answer) = try await http.send(.post, "/v1/orders/claims-pooled/events", json: [
                "type": "verified", "data": ["transactionId": "8800031", "environment": "Production"],
            ])
            #expect(verified == .created, "\(answer)")
            #expect(try await scalar(db, "SELECT environment FROM apple_transactions WHERE transaction_id = '8800031'", as: String.self) == "Sandbox",
                    "a backend's claim replaced the environment Apple signed")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}
