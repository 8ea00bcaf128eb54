import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("Projections are derived from the log")
struct ProjectionTests {
    @Test("after a mixed workload over HTTP, a rebuild equals the inline projections row for row")
    func verifyAfterMixedWorkload() async throws {
        try await withLiveApplication { http, db in
            for index in 0..<12 {
                try await http.send(.post, "/v1/orders", json: newOrder("o-\(index)", user: "u-\(index % 3)"))
            }
            let journeys: [[(String, [String: Any])]] = [
                [("payment-added", ["queuedAt": "2026-11-21T09:00:00.123Z"]), ("receipt-received", receipt("t-1")), ("verified", [:]), ("delivered", ["grantId": "g-1"]), ("finished", [:])],
                [("receipt-received", receipt("t-2")), ("verified", [:]), ("refunded", ["revocationDate": "2026-11-22T00:00:00Z", "revocationReason": 1])],
                [("receipt-received", receipt("t-3")), ("verified", [:]), ("delivered", [:]), ("refunded", ["revocationDate": "2026-11-22T00:00:00Z"]), ("refund-reversed", [:])],
                [("failed", ["reason": "cancelled", "detail": "user closed the sheet"])],
                [("payment-added", ["queuedAt": "2026-11-21T09:00:00Z"])],
            ]
            for (index, journey) in journeys.enumerated() {
                for (type, data) in journey {
                    let (status, _) = try await http.send(.post, "/v1/orders/o-\(index)/events", json: ["type": type, "data": data])
                    #expect(status == .created, "\(type) on o-\(index)")
                }
            }
            // Refused and replayed appends must leave no trace in the projections either.
            try await http.send(.post, "/v1/orders/o-5/events", json: ["type": "receipt-received", "data": receipt("t-1")])
            try await http.send(.post, "/v1/orders/o-6/events", json: ["type": "finished", "data": [:]])

            let rebuilder = ProjectionRebuilder(database: db.database)
            #expect(try await rebuilder.verify() == [])

            // A projection row changed behind the ledger's back is found, and a rebuild restores it.
            try await db.client.query("UPDATE orders SET state = 'finished' WHERE order_id = 'o-4'", logger: TestServer.logger)
            try await db.client.query("DELETE FROM apple_transactions WHERE transaction_id = 't-2'", logger: TestServer.logger)
            let differences = try await rebuilder.verify()
            #expect(differences.count == 3, "\(differences)")
            #expect(differences.contains { $0.contains("only in the live projection") && $0.contains("o-4") })
            #expect(try await rebuilder.rebuild() == 12 + 15)
            #expect(try await rebuilder.verify() == [])
            let (_, order) = try await http.send(.get, "/v1/orders/o-4")
            #expect(order["state"] as? String == "payment-added")
            let (_, refundReversed) = try await http.send(.get, "/v1/orders/o-2")
            #expect(refundReversed["state"] as? String == "delivered")
        }
    }

    @Test("verify reports no difference while appends go on (one snapshot)")
    func verifyUnderLoad() async throws {
        try await withLiveApplication { http, db in
            for index in 0..<20 { try await http.send(.post, "/v1/orders", json: newOrder("seed-\(index)")) }
            let rebuilder = ProjectionRebuilder(database: db.database)
            try await withThrowingTaskGroup(of: [String].self) { group in
                group.addTask {
                    for index in 0..<60 {
                        try await http.send(.post, "/v1/orders", json: newOrder("load-\(index)"))
                        try await http.send(.post, "/v1/orders/load-\(index)/events", json: ["type": "receipt-received", "data": receipt("tl-\(index)")])
                    }
                    return []
                }
                for _ in 0..<4 { group.addTask { try await rebuilder.verify() } }
                for try await differences in group { #expect(differences == []) }
            }
            #expect(try await rebuilder.verify() == [])
        }
    }
}
