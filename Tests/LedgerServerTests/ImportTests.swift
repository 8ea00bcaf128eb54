import Foundation
import HTTPTypes
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerStore
import LedgerTestSupport
import NIOCore
import Testing

/// Issue 41, point 4: a team's history imported through the append routine, idempotent and
/// resumable, each conflicting line refused and reported; an imported grant is never granted again.
@Suite("Importing a team's history")
struct ImportTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    static let header = "orderId,userId,productId,bundleId,createdAt,state,price,currency,transactionId,originalTransactionId,purchaseDate,environment,refundedAt"

    /// Ten lines: six orders of every kind, a granted transaction alone, and three refused.
    static let history = """
        \(header)
        h-1,u-1,gems.100,,2025-03-01T10:00:00Z,finished,0.99,USD,5100001,,2025-03-01T10:01:00Z,,
        h-2,u-1,gems.100,,2025-03-02T10:00:00Z,refunded,0.99,USD,5100002,,2025-03-02T10:01:00Z,Production,2025-03-09T00:00:00Z
        h-3,u-2,"gems,500",,2025-04-01T08:00:00.250Z,failed,4.99,USD,,,,,
        h-4,u-2,gems.100,,2025-04-02T08:00:00+02:00,created,,,,,,,
        h-5,u-3,gems.100,,2025-05-01T09:00:00Z,verified,0.99,USD,5100005,5100005,2025-05-01T09:00:30Z,sandbox,
        ,u-4,gems.100,,,,,,5100006,,2024-12-24T18:00:00Z,,
        h-7,u-5,gems.100,,2025-06-01T09:00:00Z,delivered,0.99,USD,5100001,,2025-06-01T09:00:10Z,,
        h-8,u-5,gems.100,,2025-06-01T09:00:00Z,shipped,0.99,USD,,,,,
        h-9,u-5,gems.100,,2025-06-01T09:00:00Z,finished,0.99,USD,5100009,,,,
        h-10,u-6,gems.100,,2025-06-02T09:00:00Z,finished,0.99,USD,5100010,,2025-06-02T09:00:10Z,,

        """

    func post(_ http: LedgerHTTP, _ body: String, type: String = "text/csv", key: String? = nil) async throws -> (HTTPResponse.Status, [String: Any]) {
        let headers: HTTPFields = [.contentType: type, .authorization: "Bearer \(key ?? http.key)"]
        let response = try await http.client.execute(uri: "/v1/imports?source=history.csv", method: .post, headers: headers, body: ByteBuffer(string: body))
        return (response.status, json(response.body))
    }

    static func refusals(_ summary: [String: Any]) -> [Int: String] {
        var found: [Int: String] = [:]
        for refusal in summary["refusals"] as? [[String: Any]] ?? [] { found[refusal["line"] as? Int ?? 0] = refusal["code"] as? String }
        return found
    }

    @Test("each line becomes its order's events; refused lines are named; importing again adds nothing")
    func importsOnceAndReportsRefusals() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            // An order of the ledger's own that a line of the history names with another user.
            try await http.send(.post, "/v1/orders", json: newOrder("h-10", user: "u-other"))
            let (status, summary) = try await post(http, Self.history)
            #expect(status == .ok, "\(summary)")
            #expect(summary["read"] as? Int == 10 && summary["imported"] as? Int == 6 && summary["alreadyPresent"] as? Int == 0, "\(summary)")
            #expect(summary["refused"] as? Int == 4, "\(summary)")
            // Lines: h-7 reuses h-1's transaction; h-8's state is unknown; h-9 has no purchase date; h-10 is the ledger's own order.
            #expect(Self.refusals(summary) == [8: "transaction-granted", 9: "invalid-input", 10: "invalid-input", 11: "order-exists"], "\(summary)")

            let (_, finished) = try await http.send(.get, "/v1/orders/h-1")
            #expect(finished["state"] as? String == "finished" && finished["transactionId"] as? String == "5100001", "\(finished)")
            #expect(finished["createdAt"] as? String == "2025-03-01T10:00:00.000Z", "\(finished)")
            let (_, refunded) = try await http.send(.get, "/v1/orders/h-2")
            #expect(refunded["state"] as? String == "refunded", "\(refunded)")
            let (_, failed) = try await http.send(.get, "/v1/orders/h-3")
            #expect(failed["state"] as? String == "failed" && failed["productId"] as? String == "gems,500", "\(failed)")
            let (_, open) = try await http.send(.get, "/v1/orders/h-4")
            #expect(open["state"] as? String == "created" && open["createdAt"] as? String == "2025-04-02T06:00:00.000Z", "\(open)")
            let (_, sandbox) = try await http.send(.get, "/v1/orders/h-5")
            #expect(sandbox["state"] as? String == "verified" && sandbox["environment"] as? String == "Sandbox", "\(sandbox)")
            let (_, alone) = try await http.send(.get, "/v1/orders/imported-5100006")
            #expect(alone["state"] as? String == "finished" && alone["userId"] as? String == "u-4", "\(alone)")
            // Each event says where it came from.
            let origin = try await scalar(db, """
                SELECT metadata->'importedFrom'->>'source' || ':' || (metadata->'importedFrom'->>'line')
                  FROM events WHERE stream_id = 'order-h-5' AND type = 'verified'
                """, as: String.self)
            #expect(origin == "history.csv:6")
            #expect(try await scalar(db, "SELECT order_id FROM apple_transactions WHERE transaction_id = '5100002'", as: String.self) == "h-2")

            // The report dates imported facts by the history, not by the import.
            let (_, march) = try await http.send(.get, "/v1/reports/reconciliation?from=2025-03-01&to=2025-03-10")
            let days = (march["rows"] as? [[String: Any]] ?? []).map { "\($0["day"] ?? "")" }.sorted()
            #expect(days == ["2025-03-01", "2025-03-02", "2025-03-09"], "\(march)")
            let totals = march["totals"] as? [String: Any] ?? [:]
            #expect(totals["verified"] as? Int == 2 && totals["refunded"] as? Int == 1 && totals["ordersCreated"] as? Int == 2, "\(totals)")

            // Again: nothing added, the same lines refused.
            let events = try await scalar(db, "SELECT count(*)::int FROM events", as: Int.self)
            let (_, again) = try await post(http, Self.history)
            #expect(again["imported"] as? Int == 0 && again["alreadyPresent"] as? Int == 6 && again["refused"] as? Int == 4, "\(again)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events", as: Int.self) == events)
        }
    }

    @Test("a proof of an imported grant is already granted: duplicate for a new order, finishTransaction true")
    func importedGrantIsNotGrantedAgain() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, _ in
            _ = try await post(http, Self.history)
            try await http.send(.post, "/v1/orders", json: newOrder("o-new", user: "u-1"))
            let jws = try await apple.sign(TestApple.transaction("5100001"))
            let (status, answer) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": jws, "orderId": "o-new", "userId": "u-1"])
            #expect(status == .ok && answer["outcome"] as? String == "duplicate", "\(answer)")
            #expect(answer["reason"] as? String == "duplicate-transaction" && answer["finishTransaction"] as? Bool == true, "\(answer)")
            // Granted alone (its order gone): the same.
            try await http.send(.post, "/v1/orders", json: newOrder("o-new-2", user: "u-4"))
            let alone = try await apple.sign(TestApple.transaction("5100006"))
            let (_, second) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": alone, "orderId": "o-new-2"])
            #expect(second["outcome"] as? String == "duplicate" && second["finishTransaction"] as? Bool == true, "\(second)")
            // Imported as verified (granted, its delivery the team's business): the same.
            try await http.send(.post, "/v1/orders", json: newOrder("o-new-3", user: "u-3"))
            let verified = try await apple.sign(TestApple.transaction("5100005"))
            let (_, third) = try await http.send(.post, "/v1/receipts", json: ["signedTransaction": verified, "orderId": "o-new-3", "userId": "u-3"])
            #expect(third["outcome"] as? String == "duplicate" && third["finishTransaction"] as? Bool == true, "\(third)")
            // A client that sends it again naming its imported order, or no order: matched, finished too.
            for named in ["h-5", nil] {
                var body: [String: Any] = ["signedTransaction": verified, "userId": "u-3"]
                if let named { body["orderId"] = named }
                let (_, again) = try await http.send(.post, "/v1/receipts", json: body)
                #expect(again["outcome"] as? String == "matched" && again["orderId"] as? String == "h-5", "\(again)")
                #expect(again["finishTransaction"] as? Bool == true, "\(named ?? "no order"): \(again)")
            }
            // An imported grant is no pairing support can undo, and the refusal says where it came from.
            let (undo, refusal) = try await http.send(.post, "/v1/transactions/5100001/unmatch", json: ["reason": "test"])
            #expect(undo == .conflict && errorOf(refusal)["code"] as? String == "not-a-pool-pairing", "\(refusal)")
            #expect((errorOf(refusal)["message"] as? String ?? "").contains("in an imported history"), "\(refusal)")
        }
    }

    @Test("a line granting a transaction that waits in the pool for another user or product, or that Apple refunded there, or says another purchase date or environment than Apple signed, is refused; one that agrees, or names neither, takes it")
    func pooledTransactions() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            // Four paid purchases waiting in the pool: u-7's gems.100 ones, and one of gems.500.
            let bought = Date(timeIntervalSince1970: (Date().timeIntervalSince1970 - 3_600).rounded(.down))
            // Two more that agree with their lines but for what Apple signed: the day, the environment;
            // and one whose line names no environment, which claims none.
            for (id, product) in [("5300001", "gems.100"), ("5300002", "gems.100"), ("5300003", "gems.500"), ("5300004", "gems.100"),
                                  ("5300006", "gems.100"), ("5300007", "gems.100"), ("5300008", "gems.100")] {
                let (_, pooled) = try await http.send(.post, "/v1/receipts", json: [
                    "userId": "u-7", "signedTransaction": try await apple.sign(TestApple.transaction(id, product: product, purchaseDate: bought)),
                ])
                #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            }
            // A fifth, refunded by Apple while it waited: never granted.
            var refunded = TestApple.transaction("5300005")
            #expect(try await http.send(.post, "/v1/receipts", json: ["userId": "u-7", "signedTransaction": try await apple.sign(refunded)]).0 == .ok)
            refunded.revocationDate = Date().millisecondsSince1970
            #expect(try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded)).0 == .ok)
            let stamp = EventCoding.formatDate(bought)
            let lines = """
                \(Self.header)
                p-1,u-9,gems.100,,\(stamp),finished,0.99,USD,5300001,,\(stamp),Sandbox,
                p-2,u-7,gems.500,,\(stamp),finished,4.99,USD,5300002,,\(stamp),Sandbox,
                p-3,u-7,gems.500,,\(stamp),finished,4.99,USD,5300003,,\(stamp),Sandbox,
                ,,,,,,,,5300004,,\(stamp),Sandbox,
                p-5,u-7,gems.100,,\(stamp),finished,0.99,USD,5300005,,\(stamp),Sandbox,
                p-6,u-7,gems.100,,\(EventCoding.formatDate(bought.addingTimeInterval(-86_400))),finished,0.99,USD,5300006,,\(EventCoding.formatDate(bought.addingTimeInterval(-86_400))),Sandbox,
                p-7,u-7,gems.100,,\(stamp),finished,0.99,USD,5300007,,\(stamp),Production,
                p-8,u-7,gems.100,,\(stamp),finished,0.99,USD,5300008,,\(stamp),,

                """
            let (status, summary) = try await post(http, lines)
            #expect(status == .ok && summary["imported"] as? Int == 3, "\(summary)")
            #expect(Self.refusals(summary) == [2: "transaction-pooled", 3: "transaction-pooled", 6: "transaction-refunded", 7: "transaction-pooled", 8: "transaction-pooled"],
                    "\(summary)")
            let refusals = summary["refusals"] as? [[String: Any]] ?? []
            #expect((refusals.first?["message"] as? String)?.contains("user u-7, product gems.100") == true, "\(refusals)")
            let signed = refusals.compactMap { $0["message"] as? String }.suffix(2)
            #expect(signed.first == "Apple transaction 5300006 waits in the pool with the purchaseDate Apple signed, \(stamp); the line says \(EventCoding.formatDate(bought.addingTimeInterval(-86_400)))", "\(signed)")
            #expect(signed.last == "Apple transaction 5300007 waits in the pool with the environment Apple signed, Sandbox; the line says Production", "\(signed)")
            // The refused lines' purchases still wait for u-7, untouched; the others are granted.
            let rows = try await scalar(db, """
                SELECT string_agg(transaction_id || ' ' || coalesce(order_id, '-') || ' ' || coalesce(user_id, '-'), ', ' ORDER BY transaction_id)
                  FROM apple_transactions WHERE transaction_id LIKE '53000%'
                """, as: String.self)
            #expect(rows == "5300001 - u-7, 5300002 - u-7, 5300003 p-3 u-7, 5300004 imported-5300004 u-7, 5300005 - u-7, 5300006 - u-7, 5300007 - u-7, 5300008 p-8 u-7", "\(rows ?? "")")
            #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE order_id IN ('p-1', 'p-2', 'p-5', 'p-6', 'p-7')", as: Int.self) == 0)
            // The line that named neither user nor product: its order is the pool's user's, of Apple's product.
            #expect(try await scalar(db, "SELECT user_id || ' ' || product_id FROM orders WHERE order_id = 'imported-5300004'", as: String.self) == "u-7 gems.100")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a file imported again after a second app was added, or after its app was retired, counts its orders present; a new line of it is refused as before")
    func importedAgainAfterAppsChanged() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            let stamp = EventCoding.formatDate(Date(timeIntervalSinceNow: -3_600))
            let lines = """
                \(Self.header)
                a-1,u-1,gems.100,,\(stamp),finished,0.99,USD,5600001,,\(stamp),,
                a-2,u-2,gems.100,\(TestApple.bundleId),\(stamp),created,0.99,USD,,,,,

                """
            #expect(try await post(http, lines).1["imported"] as? Int == 2)
            #expect(try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.second"]).0 == .created)
            let (_, again) = try await post(http, lines)
            #expect(again["alreadyPresent"] as? Int == 2 && Self.refusals(again).isEmpty, "\(again)")
            let (_, more) = try await post(http, lines + "a-3,u-3,gems.100,,\(stamp),created,0.99,USD,,,,,\n")
            #expect(more["alreadyPresent"] as? Int == 2 && Self.refusals(more) == [4: "bundle-id-required"], "\(more)")
            #expect(try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["retired": true]).0 == .ok)
            let (_, retired) = try await post(http, lines)
            #expect(retired["alreadyPresent"] as? Int == 2 && Self.refusals(retired).isEmpty, "\(retired)")
            // Another history for a present order is still a conflict, never present.
            let (_, other) = try await post(http, "\(Self.header)\na-2,u-2,gems.100,\(TestApple.bundleId),\(stamp),created,1.99,USD,,,,,\n")
            #expect(Self.refusals(other) == [2: "order-exists"], "\(other)")
            // So is the same history for another app than the one whose import made the order.
            let second = "b-1,u-1,gems.100,com.example.second,\(stamp),created,0.99,USD,,,,,"
            #expect(try await post(http, "\(Self.header)\n\(second)\n").1["imported"] as? Int == 1)
            let (_, otherApp) = try await post(http, "\(Self.header)\n\(second.replacingOccurrences(of: "com.example.second", with: TestApple.bundleId))\n")
            #expect(Self.refusals(otherApp) == [2: "order-exists"] && otherApp["alreadyPresent"] as? Int == 0, "\(otherApp)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a granted transaction listed alone, with no date, that waits in the pool: its order is dated and owned as Apple signed it and the pool held it; imported again, present")
    func grantedAloneFromThePool() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); olderPurchases(&$0) }) { http, db in
            let bought = Date(timeIntervalSinceNow: -40 * 86_400)
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: [
                "userId": "u-9", "signedTransaction": try await apple.sign(TestApple.transaction("5300021", purchaseDate: bought)),
            ])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            let lines = "\(Self.header)\n,,,,,,,,5300021,,,,\n"
            let (_, first) = try await post(http, lines)
            #expect(first["imported"] as? Int == 1 && Self.refusals(first).isEmpty, "\(first)")
            #expect(try await scalar(db, """
                SELECT user_id || ' ' || product_id || ' ' || (created_at = \(bought.millisecondsSince1970)::bigint / 1000.0 * interval '1 second' + 'epoch'::timestamptz)::text
                  FROM orders WHERE order_id = 'imported-5300021'
                """, as: String.self) == "u-9 gems.100 true")
            let (_, again) = try await post(http, lines)
            #expect(again["alreadyPresent"] as? Int == 1 && Self.refusals(again).isEmpty, "\(again)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a file imported while the ledger held no app is present when imported again once it holds one, then two")
    func importedBeforeAnyApp() async throws {
        try await withLiveApplication { http, _ in
            let stamp = EventCoding.formatDate(Date(timeIntervalSinceNow: -3_600))
            let lines = "\(Self.header)\nn-1,u-1,gems.100,,\(stamp),created,0.99,USD,,,,,\n"
            #expect(try await post(http, lines).1["imported"] as? Int == 1)
            for app in ["com.example.first", "com.example.second"] {
                #expect(try await http.send(.post, "/v1/apps", json: ["bundleId": app]).0 == .created)
                let (_, again) = try await post(http, lines)
                #expect(again["alreadyPresent"] as? Int == 1 && Self.refusals(again).isEmpty, "\(app): \(again)")
            }
        }
    }

    @Test("an app set to Production alone takes no sandbox line; one imported before it was is present, not refused, when the file is imported again")
    func sandboxLineOfAProductionApp() async throws {
        try await withReceiptsApplication(apple, configure: { bothEnvironments(&$0); $0.apple.appID = TestApple.appAppleId }) { http, db in
            let stamp = EventCoding.formatDate(Date(timeIntervalSinceNow: -3_600))
            let first = "e-0,u-1,gems.100,,\(stamp),finished,0.99,USD,5500000,,\(stamp),Sandbox,"
            #expect(try await post(http, "\(Self.header)\n\(first)\n").1["imported"] as? Int == 1)
            #expect(try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["environments": ["Production"]]).0 == .ok)
            let lines = """
                \(Self.header)
                \(first)
                e-1,u-1,gems.100,,\(stamp),finished,0.99,USD,5500001,,\(stamp),Sandbox,
                e-2,u-1,gems.100,,\(stamp),finished,0.99,USD,5500002,,\(stamp),Production,
                e-3,u-1,gems.100,,\(stamp),created,0.99,USD,,,,Sandbox,
                e-4,u-1,gems.100,,\(stamp),finished,0.99,USD,5500004,,\(stamp),,

                """
            let (status, summary) = try await post(http, lines)
            #expect(status == .ok && summary["imported"] as? Int == 3 && summary["alreadyPresent"] as? Int == 1, "\(summary)")
            #expect(Self.refusals(summary) == [3: "wrong-environment"], "\(summary)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE transaction_id = '5500001'", as: Int.self) == 0)
        }
    }

    @Test("a line whose times cannot have been, or whose order was created after the purchase Apple signed for a pooled one, is refused; an order row made when its receipt came is not")
    func impossibleTimes() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            // Bought 100 days ago (Apple's signature), waiting in the pool for u-7.
            let old = TestApple.transaction("5400001", purchaseDate: Date(timeIntervalSinceNow: -100 * 86_400))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-7", "signedTransaction": try await apple.sign(old)])
            #expect(pooled["outcome"] as? String == "unmatched", "\(pooled)")
            let now = EventCoding.formatDate(Date(timeIntervalSinceNow: -60))
            let lines = """
                \(Self.header)
                t-1,u-7,gems.100,,\(now),finished,0.99,USD,5400001,,\(now),Sandbox,
                t-2,u-7,gems.100,,2024-05-01T00:00:00Z,refunded,0.99,USD,5400002,,2024-05-02T00:00:00Z,Sandbox,2020-01-01T00:00:00Z
                t-3,u-7,gems.100,,2024-05-01T00:10:00Z,finished,0.99,USD,5400003,,2024-05-01T00:00:00Z,Sandbox,
                t-4,u-7,gems.100,,2024-05-01T00:00:00Z,finished,0.99,USD,5400004,,2099-05-02T00:00:00Z,Sandbox,
                ,,,,,,,,5400005,,1999-05-02T00:00:00Z,Sandbox,
                t-6,u-7,gems.100,,2024-05-01T00:00:00Z,finished,0.99,USD,5400006,,2024-05-01T00:04:00Z,Sandbox,

                """
            let (status, summary) = try await post(http, lines)
            // t-3: the earlier backend made its order row ten minutes after the purchase, when the receipt came.
            #expect(status == .ok && summary["imported"] as? Int == 2, "\(summary)")
            #expect(Self.refusals(summary) == [2: "purchased-before-order", 3: "invalid-input", 5: "invalid-input", 6: "invalid-input"], "\(summary)")
            let messages = (summary["refusals"] as? [[String: Any]] ?? []).compactMap { $0["message"] as? String }
            #expect(messages.count == 4 && messages[1] == "refundedAt is before purchaseDate: a purchase is refunded after it was bought", "\(messages)")
            #expect(messages[2] == "purchaseDate is in the future", "\(messages)")
            #expect(messages[3] == "purchaseDate is before the App Store opened (2008-07-10)", "\(messages)")
            #expect(try await scalar(db, "SELECT coalesce(order_id, '-') || ' ' || status FROM apple_transactions WHERE transaction_id = '5400001'", as: String.self)
                    == "- unmatched", "the pooled purchase still waits")
        }
    }

    @Test("an import stopped part way leaves whole orders, and the next run goes on where it stopped")
    func resumes() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            let lines = Self.history.split(separator: "\n").map(String.init)
            // The first three orders made it before the stop.
            let (_, first) = try await post(http, lines.prefix(4).joined(separator: "\n"))
            #expect(first["imported"] as? Int == 3, "\(first)")
            let (_, rest) = try await post(http, Self.history)
            #expect(rest["imported"] as? Int == 4 && rest["alreadyPresent"] as? Int == 3, "\(rest)")
            // Whole orders: every imported order has its created event and its final state's.
            #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE order_id LIKE 'h-%' OR order_id LIKE 'imported-%'", as: Int.self) == 7)
        }
    }

    @Test("JSON Lines with numbers and nulls; a bad header, an unknown member, an empty body, a wrong content type and a read key are refused")
    func formatsAndRefusals() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            let lines = """
                {"orderId":"j-1","userId":"u-1","productId":"gems.100","createdAt":"2025-01-01T00:00:00Z","state":"finished","price":0.99,"currency":"USD","transactionId":"5200001","purchaseDate":"2025-01-01T00:00:05Z","refundedAt":null,"storefront":"deu"}

                {"orderId":"j-2","userId":"u-1","productId":"gems.100","createdAt":"2025-01-01T00:00:00Z","state":"created","coupon":"X"}
                not json
                {"orderId":"j-3","userId":"u-1","productId":"gems.100","createdAt":"2025-01-01T00:00:00Z","state":"finished","transactionId":"5200003","purchaseDate":"2025-01-01T00:00:05Z","storefront":"DE"}
                """
            let (status, summary) = try await post(http, lines, type: "application/x-ndjson")
            #expect(status == .ok && summary["imported"] as? Int == 1 && summary["read"] as? Int == 4, "\(summary)")
            let refusals = summary["refusals"] as? [[String: Any]] ?? []
            #expect(refusals.map { $0["line"] as? Int } == [3, 4, 5], "\(summary)")
            #expect((refusals.first?["message"] as? String)?.hasPrefix("coupon is not a column") == true, "\(refusals)")
            #expect((refusals.last?["message"] as? String)?.hasPrefix("storefront is \"DE\"") == true, "\(refusals)")
            #expect(try await scalar(db, "SELECT price::text FROM orders WHERE order_id = 'j-1'", as: String.self) == "0.99")
            // The storefront as Apple names it, for the comparison with Apple's sales reports.
            #expect(try await scalar(db, "SELECT storefront FROM apple_transactions WHERE transaction_id = '5200001'", as: String.self) == "DEU")
            // Another line for j-1 (another transaction) is refused, never taken for the same.
            let other = #"{"orderId":"j-1","userId":"u-1","productId":"gems.100","createdAt":"2025-01-01T00:00:00Z","state":"finished","price":"0.99","currency":"USD","transactionId":"5200002","purchaseDate":"2025-01-01T00:00:05Z"}"#
            let (_, conflict) = try await post(http, other, type: "application/x-ndjson")
            #expect(conflict["imported"] as? Int == 0 && conflict["alreadyPresent"] as? Int == 0 && Self.refusals(conflict) == [1: "order-exists"], "\(conflict)")
            let response = try await http.client.execute(
                uri: "/v1/imports?source=a%00b", method: .post,
                headers: [.contentType: "application/x-ndjson", .authorization: "Bearer \(http.key)"], body: ByteBuffer(string: other))
            let (badSource, sourceError) = (response.status, json(response.body))
            #expect(badSource == .badRequest && (errorOf(sourceError)["message"] as? String)?.contains("source") == true, "\(sourceError)")

            let (badHeader, headerError) = try await post(http, "orderId,userId,coupon\nx,u,1\n")
            #expect(badHeader == .badRequest && (errorOf(headerError)["message"] as? String)?.contains("coupon") == true, "\(headerError)")
            // A quote that swallows the rest of the file refuses it whole, naming its line.
            let (misquoted, quoteError) = try await post(http, "orderId,userId,productId,createdAt,state\nq-1,\"u-1\"x,p,2025-01-01T00:00:00Z,created\nq-2,u,p,2025-01-01T00:00:00Z,created\n")
            #expect(misquoted == .badRequest && (errorOf(quoteError)["message"] as? String)?.hasPrefix("line 2 has a quoted value") == true, "\(quoteError)")
            // A time past 9999 refuses its line, never the import (it stopped it: a 500).
            let (late, lateSummary) = try await post(http, "orderId,userId,productId,createdAt,state\nq-3,u,p,10000-01-01T00:00:00Z,created\nq-4,u,p,2025-01-01T00:00:00Z,created\n")
            #expect(late == .ok && lateSummary["imported"] as? Int == 1 && Self.refusals(lateSummary) == [2: "invalid-input"], "\(lateSummary)")
            for type in ["text/csv", "application/x-ndjson"] {
                // An empty body is named as the history it lacks, not as JSON.
                let (empty, emptyError) = try await post(http, "", type: type)
                #expect(empty == .badRequest && errorOf(emptyError)["code"] as? String == "invalid-input" && errorOf(emptyError)["field"] as? String == "body", "\(type): \(emptyError)")
                #expect((errorOf(emptyError)["message"] as? String)?.contains("JSON object") == false, "\(emptyError)")
            }
            let (badType, typeError) = try await post(http, lines, type: "application/json")
            #expect(badType == .unsupportedMediaType && errorOf(typeError)["code"] as? String == "unsupported-media-type", "\(typeError)")
            let reader = try await APIKeyStore(database: db.database).create(name: "reader", scopes: [.read, .append])
            let (forbidden, _) = try await post(http, lines, type: "application/x-ndjson", key: reader)
            #expect(forbidden == .forbidden)
        }
    }
}
