import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerTestSupport
import PostgresNIO
import Testing

@Suite("Dashboard views")
struct DashboardTests {
    func sqlState(_ body: () async throws -> Void) async -> String? {
        do { try await body(); return nil } catch let error as PSQLError { return error.serverInfo?[.sqlState] } catch { return "\(error)" }
    }

    @Test("ledger_reader reads the dashboard views and nothing else")
    func readerSeesOnlyViews() async throws {
        try await withLiveApplication { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-2", product: "coins.5"))
            try await http.send(.post, "/v1/orders/o-2/events", json: ["type": "failed", "data": ["reason": "cancelled"]])
            let connection = try await db.connect()
            let log = TestServer.logger
            try await connection.query("SET ROLE ledger_reader", logger: log)
            let orders = try await connection.query("SELECT order_id, state FROM dashboards.orders ORDER BY order_id", logger: log)
            var rows: [String] = []
            for try await (id, state) in orders.decode((String, String).self) { rows.append("\(id):\(state)") }
            #expect(rows == ["o-1:created", "o-2:failed"])
            let daily = try await connection.query(
                "SELECT product_id, state, orders FROM dashboards.daily_orders ORDER BY product_id", logger: log)
            var counts: [String] = []
            for try await (product, state, count) in daily.decode((String, String, Int64).self) { counts.append("\(product):\(state):\(count)") }
            #expect(counts == ["coins.5:failed:1", "gems.100:created:1"])
            let pool = try await connection.query("SELECT count(*) FROM dashboards.unmatched_transactions", logger: log)
            for try await count in pool.decode(Int64.self) { #expect(count == 0) }
            for table in ["events", "orders", "apple_transactions", "api_keys", "schema_migrations"] {
                #expect(await sqlState { try await connection.query(PostgresQuery(unsafeSQL: "SELECT 1 FROM public.\(table) LIMIT 1"), logger: log) } == "42501", "\(table)")
            }
            #expect(await sqlState { try await connection.query("DELETE FROM dashboards.orders", logger: log) } == "42501")
            try await connection.close()
        }
    }

    @Test("every example query of docs/dashboards.md runs as ledger_reader")
    func exampleQueriesRun() async throws {
        let text = try String(contentsOf: TestServer.packageRoot.appendingPathComponent("docs/dashboards.md"), encoding: .utf8)
        let examples = try #require(text.components(separatedBy: "## Example queries").last)
        let queries = examples.components(separatedBy: "```sql\n").dropFirst().compactMap { $0.components(separatedBy: "```").first }
        #expect(queries.count >= 5, "\(queries.count) queries found")
        try await withLiveApplication { _, db in
            let connection = try await db.connect()
            try await connection.query("SET ROLE ledger_reader", logger: TestServer.logger)
            for query in queries {
                #expect(await sqlState { _ = try await connection.query(PostgresQuery(unsafeSQL: query), logger: TestServer.logger) } == nil, "\(query)")
            }
            try await connection.close()
        }
    }
    @Test("time_in_state is the time since the order's state changed: a notification recorded on it does not reset it")
    func timeInStateIgnoresRecords() async throws {
        let apple = try TestApple()
        try await withReceiptsApplication(apple) { http, db in
            // An order verified long ago (an imported history's, dated when it happened).
            let csv = """
                orderId,userId,productId,createdAt,state,price,currency,transactionId,purchaseDate,environment
                st-1,u-st,gems.100,2026-01-01T10:00:00Z,verified,0.99,USD,5200001,2026-01-01T10:00:30Z,Sandbox

                """
            let headers: HTTPFields = [.contentType: "text/csv", .authorization: "Bearer \(http.key)"]
            let imported = try await http.client.execute(uri: "/v1/imports?source=stuck.csv", method: .post, headers: headers, body: ByteBuffer(string: csv))
            #expect(imported.status == .ok, "\(String(buffer: imported.body))")
            let stuck: PostgresQuery = "SELECT coalesce(string_agg(order_id, ','), '') FROM dashboards.orders WHERE state IN ('receipt-received', 'verified') AND time_in_state > interval '1 hour'"
            #expect(try await scalar(db, stuck, as: String.self) == "st-1")
            // Apple asks for consumption data about it: recorded on the order, no state changed.
            let purchase = TestApple.transaction("5200001", purchaseDate: Date(timeIntervalSince1970: 1_767_261_630))
            try await http.notifyAppleTaken(try await apple.notification("CONSUMPTION_REQUEST", transaction: purchase, consumptionRequestReason: "UNINTENDED_PURCHASE"))
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'order-st-1' AND type = 'notification-received'", as: Int.self) == 1)
            #expect(try await scalar(db, stuck, as: String.self) == "st-1", "still stuck in verified since January")
        }
    }
}
