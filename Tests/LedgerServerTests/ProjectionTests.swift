import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerCore
import LedgerJSON
import LedgerServer
import LedgerStore
import LedgerTestSupport
import PostgresNIO
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
            // Batches of 2 and 3 rows: many batches, decoded and folded by the chain of tasks.
            for batchSize in [2, 3] {
                #expect(try await ProjectionRebuilder(database: db.database, batchSize: batchSize).verify() == [])
            }

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

    @Test("a rebuild folds a stream in version order when a later version has the lower position")
    func rebuildFoldsInVersionOrder() async throws {
        // This test failed twice in about twenty full local runs, with a PSQLError whose
        // description hides PostgreSQL's message; the message is recorded when it fails again.
        do { try await rebuildFoldsInVersionOrderBody() } catch { Issue.record("PostgreSQL said: \(String(reflecting: error))"); throw error }
    }

    func rebuildFoldsInVersionOrderBody() async throws {
        try await withLiveApplication { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("before"))
            let slow = try await db.connect(id: 1)
            let fast = try await db.connect(id: 2)
            // The slow transaction takes its id (and so its positions) first and stays open.
            try await slow.query("BEGIN", logger: TestServer.logger)
            try await slow.query("SELECT pg_current_xact_id()", logger: TestServer.logger)
            let stream = try StreamID("order-late")
            let created = OrderEvent.created(OrderCreated(userId: try UserID("u-1"), productId: try ProductID("gems.100")))
            let first = try await db.append(
                [try EventCoding.newEvent(created, id: EventID(), metadata: Data("{}".utf8))], to: stream, expectedVersion: .noStream, on: fast)
            let queued = OrderEvent.paymentAdded(PaymentAdded(queuedAt: Date(timeIntervalSince1970: 1_790_000_000)))
            let second = try await db.append(
                [try EventCoding.newEvent(queued, id: EventID(), metadata: Data("{}".utf8))], to: stream, expectedVersion: .exact(0), on: slow)
            try await slow.query("COMMIT", logger: TestServer.logger)
            #expect(second.positions[0] < first.positions[0], "version 1 has the lower position")

            let rebuilder = ProjectionRebuilder(database: db.database)
            try await rebuilder.rebuild()
            let (status, order) = try await http.send(.get, "/v1/orders/late")
            #expect(status == .ok)
            #expect(order["state"] as? String == "payment-added")
            #expect(order["version"] as? Int == 1)
            try await slow.close()
            try await fast.close()
        }
    }

    @Test("orders whose ids differ only in how an accented letter is spelled stay two orders in a rebuild")
    func rebuildKeepsCanonicallyEquivalentStreamsApart() async throws {
        try await withLiveApplication { http, db in
            // "é" as one code point and as "e" + a combining acute: equal as Swift strings,
            // two streams to PostgreSQL; the rebuild, which reads stream by stream, must not merge them.
            let composed = "caf\u{E9}-order"
            let decomposed = "cafe\u{301}-order"
            let (first, _) = try await http.send(.post, "/v1/orders", json: newOrder(composed, user: "u-composed"))
            let (second, _) = try await http.send(.post, "/v1/orders", json: newOrder(decomposed, user: "u-decomposed"))
            #expect(first == .created && second == .created)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a rebuild leaves the projection tables with the keys and indexes the migrations made")
    func rebuildKeepsIndexes() async throws {
        try await withLiveApplication { http, db in
            for index in 0..<5 { try await http.send(.post, "/v1/orders", json: newOrder("ix-\(index)")) }
            func definitions() async throws -> [String] {
                let rows = try await db.client.query(
                    """
                    SELECT indexrelid::regclass::text || ' ' || pg_get_indexdef(indexrelid) || ' ' || coalesce(c.conname, '')
                    FROM pg_index x LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid
                    WHERE indrelid IN ('public.orders'::regclass, 'public.apple_transactions'::regclass) ORDER BY 1
                    """,
                    logger: TestServer.logger)
                var lines: [String] = []
                for try await line in rows.decode(String.self) { lines.append(line) }
                return lines
            }
            let before = try await definitions()
            #expect(before.count == 7, "\(before)")
            #expect(before.contains { $0.hasSuffix("orders_pkey") })
            try await ProjectionRebuilder(database: db.database).rebuild()
            #expect(try await definitions() == before)
            // The room migration 013 leaves on the pages for updates in place is kept.
            let options = try await db.client.query(
                "SELECT relname || ' ' || array_to_string(reloptions, ',') FROM pg_class WHERE oid IN ('public.orders'::regclass, 'public.apple_transactions'::regclass) ORDER BY 1",
                logger: TestServer.logger)
            var kept: [String] = []
            for try await line in options.decode(String.self) { kept.append(line) }
            #expect(kept == ["apple_transactions fillfactor=80", "orders fillfactor=60"])
            // The unique indexes hold again: a second transaction row for a held order is refused.
            await #expect(throws: PSQLError.self) {
                try await db.client.query(
                    """
                    INSERT INTO orders (order_id, user_id, product_id, quantity, app_account_token, state, version, created_at, updated_at)
                    SELECT order_id, user_id, product_id, quantity, app_account_token, state, version, created_at, updated_at
                    FROM orders WHERE order_id = 'ix-0'
                    """,
                    logger: TestServer.logger)
            }
            // Tokens keep their owners across a rebuild (app_account_tokens is not a projection
            // the rebuild empties), and a rebuild adds the owners of tokens the table lacks.
            #expect(try await scalar(db, "SELECT count(*)::int FROM app_account_tokens WHERE order_id LIKE 'ix-%'", as: Int.self) == 5)
            try await db.client.query("DELETE FROM app_account_tokens WHERE order_id = 'ix-1'", logger: TestServer.logger)
            try await ProjectionRebuilder(database: db.database).rebuild()
            #expect(try await scalar(db, "SELECT count(*)::int FROM app_account_tokens WHERE order_id LIKE 'ix-%'", as: Int.self) == 5)
        }
    }
}
