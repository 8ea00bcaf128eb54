import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerTestSupport
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
}
