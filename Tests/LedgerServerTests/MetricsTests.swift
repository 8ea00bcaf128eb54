import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerTestSupport
import PostgresNIO
import Testing

@Suite("Metrics")
struct MetricsTests {
    @Test("/metrics counts requests by route and status and events appended by type")
    func prometheus() async throws {
        try await withLiveApplication { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "finished", "data": [:]])
            try await http.send(.get, "/v1/orders/o-1")
            let response = try await http.client.execute(uri: "/metrics", method: .get)
            #expect(response.status == .ok)
            let text = String(buffer: response.body)
            #expect(text.contains(#"http_server_requests_total{http_route="/v1/orders",http_request_method="POST",http_response_status_code="201"} 1"#))
            #expect(text.contains(#"http_server_requests_total{http_route="/v1/orders",http_request_method="POST",http_response_status_code="200"} 1"#))
            #expect(text.contains(#"http_response_status_code="409"} 1"#))
            #expect(text.contains(#"ledger_events_appended_total{type="created"} 1"#))
            #expect(text.contains("http_server_request_duration_seconds_bucket"))
        }
    }

    @Test("each type's counter of appended events counts every append of that type, and only those")
    func eventsByType() async throws {
        try await withLiveApplication { http, _ in
            for order in ["o-1", "o-2", "o-3"] { try await http.send(.post, "/v1/orders", json: newOrder(order)) }
            for order in ["o-1", "o-2"] {
                try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "failed", "data": ["reason": "cancelled"]])
            }
            let text = String(buffer: try await http.client.execute(uri: "/metrics", method: .get).body)
            #expect(text.contains(#"ledger_events_appended_total{type="created"} 3"#))
            #expect(text.contains(#"ledger_events_appended_total{type="failed"} 2"#))
        }
    }

    @Test("events the ledger appends itself (receipts, the pool) are counted too, as the log holds them; a re-sent proof adds nothing")
    func everyAppendCounted() async throws {
        let apple = try TestApple()
        try await withReceiptsApplication(apple) { http, db in
            let jws = try await apple.sign(TestApple.transaction("1000042"))
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-9", "signedTransaction": jws])
            try await http.send(.post, "/v1/orders", json: newOrder("o-later", user: "u-9"))
            for _ in 0..<2 {
                let (_, matched) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-9", "orderId": "o-later", "signedTransaction": jws])
                #expect(matched["outcome"] as? String == "matched")
            }
            try await http.send(.post, "/v1/orders/o-later/events", json: ["type": "delivered", "data": [:]])
            // Another order's claim of the same transaction: `failed` on that order, and no second claim.
            try await http.send(.post, "/v1/orders", json: newOrder("o-other", user: "u-9"))
            let (_, duplicate) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-9", "orderId": "o-other", "signedTransaction": jws])
            #expect(duplicate["outcome"] as? String == "duplicate")
            let text = String(buffer: try await http.client.execute(uri: "/metrics", method: .get).body)
            var counted: [String: Int] = [:]
            for line in text.split(separator: "\n") where line.hasPrefix("ledger_events_appended_total{type=\"") {
                let parts = line.dropFirst("ledger_events_appended_total{type=\"".count).split(separator: "\"")
                counted[String(parts[0])] = Int(parts[1].dropFirst(2).trimmingCharacters(in: .whitespaces))
            }
            var logged: [String: Int] = [:]
            let rows = try await db.client.query("SELECT type, count(*)::int FROM events GROUP BY type", logger: TestServer.logger)
            for try await (type, count) in rows.decode((String, Int).self) { logged[type] = count }
            #expect(counted == logged)
            #expect(counted["transaction-unmatched"] == 1 && counted["transaction-matched"] == 1)
            #expect(counted["receipt-received"] == 1 && counted["verified"] == 1 && counted["delivered"] == 1 && counted["created"] == 2)
            #expect(counted["failed"] == 1)
        }
    }
}
