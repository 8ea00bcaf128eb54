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
}
