import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

@Suite("Refunds and one-time charges as Apple states them, over HTTP")
struct RefundRoutesTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    /// Posts a notification with no API key (Apple signs it instead).
    func revoked(_ transaction: SignedTransactionPayload, type: String?, percentage: Int? = nil, ownership: String = "PURCHASED") -> SignedTransactionPayload {
        var revoked = transaction
        revoked.revocationDate = Date().millisecondsSince1970
        revoked.revocationReason = 1
        revoked.revocationType = type
        revoked.revocationPercentage = percentage
        revoked.inAppOwnershipType = ownership
        return revoked
    }

    func events(_ http: LedgerHTTP, _ order: String) async throws -> [[String: Any]] {
        try await http.send(.get, "/v1/orders/\(order)").1["events"] as? [[String: Any]] ?? []
    }

    @Test("a refund's event carries Apple's revocationType and revocationPercentage, and the notification's type as notificationType")
    func proratedRefund() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            let transaction = TestApple.transaction("5000001")
            try await http.deliveredOrder("o-prorated", paidWith: transaction, apple: apple)
            let answer = try await http.notifyAppleTaken(try await apple.notification("REFUND", transaction: revoked(transaction, type: "REFUND_PRORATED", percentage: 25_000)))
            #expect(answer["type"] as? String == "refunded")
            let refund = try await events(http, "o-prorated").last?["data"] as? [String: Any] ?? [:]
            #expect(refund["revocationType"] as? String == "REFUND_PRORATED", "\(refund)")
            #expect(refund["revocationPercentage"] as? Int == 25_000)
            #expect(refund["notificationType"] as? String == "REFUND")
            #expect(refund["revocationReason"] as? Int == 1)
        }
    }

    @Test("a client's refunded event: FAMILY_REVOKE is no order's refund, REFUND_PRORATED needs its share, another type is refused; each 400 naming the field")
    func clientRefundChecks() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-client-refund"))
            let transaction = TestApple.transaction("5000009")
            try await http.send(.post, "/v1/receipts", json: ["orderId": "o-client-refund", "signedTransaction": try await apple.sign(transaction)])
            let date = "2026-11-26T10:00:00Z"
            let cases: [([String: Any], String)] = [
                (["revocationDate": date, "revocationType": "FAMILY_REVOKE"], "revocationType"),
                (["revocationDate": date, "revocationType": "REFUND_PRORATED"], "revocationPercentage"),
                (["revocationDate": date, "revocationType": "REFUND_PRORATED", "revocationPercentage": 100_001], "revocationPercentage"),
                // Misspelt: never read as a full refund.
                (["revocationDate": date, "revocationType": "REFUND_PRORATE", "revocationPercentage": 40_000], "revocationType is REFUND_PRORATE; use REFUND_FULL or REFUND_PRORATED"),
            ]
            for (data, field) in cases {
                let (status, answer) = try await http.send(.post, "/v1/orders/o-client-refund/events", json: ["type": "refunded", "data": data])
                let error = answer["error"] as? [String: Any] ?? [:]
                #expect(status == .badRequest && (error["message"] as? String ?? "").contains(field), "\(data): \(answer)")
            }
            #expect(try await http.send(.get, "/v1/orders/o-client-refund").1["state"] as? String == "verified", "no refund was recorded")
            let (status, _) = try await http.send(.post, "/v1/orders/o-client-refund/events", json: [
                "type": "refunded", "data": ["revocationDate": date, "revocationType": "REFUND_PRORATED", "revocationPercentage": 40_000],
            ])
            #expect(status == .created)
        }
    }

    @Test("refunds recorded out of Apple's order: dashboards.daily_orders takes back what the report does, Apple's latest refund")
    func refundsOutOfOrder() async throws {
        try await withReceiptsApplication(apple) { http, db in
            var order = newOrder("o-twice-refunded")
            order["price"] = "4.00"
            order["currency"] = "USD"
            try await http.send(.post, "/v1/orders", json: order)
            try await http.send(.post, "/v1/receipts", json: ["orderId": "o-twice-refunded", "signedTransaction": try await apple.sign(TestApple.transaction("5000111"))])
            // Apple: a 25% refund at 10:20, reversed, then a full refund at 10:31; the full one came first.
            let refunds: [[String: Any]] = [
                ["type": "refunded", "data": ["revocationDate": "2026-11-29T10:31:00Z", "revocationType": "REFUND_FULL"]],
                ["type": "refund-reversed", "data": [:]],
                ["type": "refunded", "data": ["revocationDate": "2026-11-29T10:20:00Z", "revocationType": "REFUND_PRORATED", "revocationPercentage": 25_000]],
            ]
            for refund in refunds {
                let (status, answer) = try await http.send(.post, "/v1/orders/o-twice-refunded/events", json: refund)
                #expect(status == .created, "\(answer)")
            }
            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
            let rows = (report["rows"] as? [[String: Any]] ?? []).filter { $0["refunded"] as? Int == 1 }
            #expect(rows.count == 1 && rows.first?["refundedAmount"] as? String == "4", "\(report)")
            #expect(try await scalar(db, "SELECT refunded_amount::text FROM dashboards.daily_orders WHERE state = 'refunded'", as: String.self) == "4")
        }
    }

    @Test("FAMILY_REVOKE, or a revoked FAMILY_SHARED transaction, changes no order and takes no money back: recorded on the transaction's stream")
    func familyRevocation() async throws {
        try await withReceiptsApplication(apple) { http, db in
            // The purchaser's own order, and an order a family member's shared transaction names (never paid by it: issue 40).
            for id in ["o-buyer", "o-member", "o-open"] { try await http.send(.post, "/v1/orders", json: newOrder(id)) }
            let bought = TestApple.transaction("5000101")
            var shared = TestApple.transaction("5000102")
            shared.inAppOwnershipType = "FAMILY_SHARED"
            try await http.send(.post, "/v1/receipts", json: ["orderId": "o-buyer", "signedTransaction": try await apple.sign(bought)])
            try await http.send(.post, "/v1/receipts", json: ["orderId": "o-member", "signedTransaction": try await apple.sign(shared)])
            try await http.send(.post, "/v1/orders/o-buyer/events", json: ["type": "delivered", "data": [:]])
            let (_, before) = try await http.send(.get, "/v1/reports/reconciliation")

            let uuid = UUID()
            let revoke = try await apple.notification("REVOKE", uuid: uuid, transaction: revoked(bought, type: "FAMILY_REVOKE"))
            let first = try await http.notifyAppleTaken(revoke)
            #expect(first["type"] as? String == "family-share-revoked" && first["streamId"] as? String == "transaction-5000101", "\(first)")
            let count = try await eventCount(db)
            #expect(try await http.notifyAppleTaken(revoke)["applied"] as? Bool == false)
            #expect(try await eventCount(db) == count)
            // A refund of a family member's transaction, whatever its type: nobody paid for it.
            let member = try await http.notifyAppleTaken(try await apple.notification("REFUND", transaction: revoked(shared, type: "REFUND_FULL", ownership: "FAMILY_SHARED")))
            #expect(member["type"] as? String == "family-share-revoked" && member["streamId"] as? String == "transaction-5000102", "\(member)")

            let (_, buyer) = try await http.send(.get, "/v1/orders/o-buyer")
            #expect(buyer["state"] as? String == "delivered")
            let (_, memberOrder) = try await http.send(.get, "/v1/orders/o-member")
            #expect(memberOrder["state"] as? String == "created")
            let recorded = try await scalar(db, "SELECT data::text FROM events WHERE event_id = \(uuid)", as: String.self) ?? ""
            let body = try JSONSerialization.jsonObject(with: Data(recorded.utf8)) as? [String: Any] ?? [:]
            #expect(body["orderId"] as? String == "o-buyer" && body["revocationType"] as? String == "FAMILY_REVOKE" && body["notificationType"] as? String == "REVOKE", "\(body)")

            // One the ledger did not know, naming an open order by its token: never tied to it, never granted.
            let (_, open) = try await http.send(.get, "/v1/orders/o-open")
            var stranger = TestApple.transaction("5000103", appAccountToken: UUID(uuidString: open["appAccountToken"] as? String ?? ""))
            stranger.inAppOwnershipType = "FAMILY_SHARED"
            let unknown = try await http.notifyAppleTaken(try await apple.notification("REVOKE", transaction: revoked(stranger, type: "FAMILY_REVOKE", ownership: "FAMILY_SHARED")))
            #expect(unknown["streamId"] as? String == "transaction-5000103")
            #expect(try await http.send(.get, "/v1/orders/o-open").1["state"] as? String == "created")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '5000103'", as: String.self) == "refunded")
            // A reversed refund gives a family member's transaction no grant: it stays refunded.
            _ = try await http.notifyAppleTaken(try await apple.notification("REFUND_REVERSED", transaction: stranger))
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '5000103'", as: String.self) == "refunded")
            let (_, late) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-open", "signedTransaction": try await apple.sign(stranger)])
            #expect(late["outcome"] as? String == "rejected" && late["reason"] as? String == "transaction-refunded", "\(late)")
            // A backend claiming it for its own order is told what it is: a family member's share.
            let (claimed, claim) = try await http.send(.post, "/v1/orders/o-open/events", json: ["type": "receipt-received", "data": receipt("5000103")])
            #expect(claimed == .conflict && errorOf(claim)["code"] as? String == "later-transaction"
                    && (errorOf(claim)["message"] as? String ?? "").contains("family member's shared access"), "\(claim)")

            let (_, after) = try await http.send(.get, "/v1/reports/reconciliation")
            let totals = after["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["refunded"] as? Int == 0 && totals["refundedAmount"] as? String == "0", "\(totals)")
            #expect(totals["revenue"] as? String == (before["sandboxTotals"] as? [String: Any])?["revenue"] as? String)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
            #expect(try await statusAfterMigration029(db, transaction: "5000103") == "refunded", "an earlier ledger's row, as a rebuild sets it")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("ONE_TIME_CHARGE goes through a client's proof's intake: it pays the order its token names, once, and the client's proof then finds it paid")
    func oneTimeCharge() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let (_, charged) = try await http.send(.post, "/v1/orders", json: newOrder("o-charged"))
            let (_, proven) = try await http.send(.post, "/v1/orders", json: newOrder("o-proven"))
            func token(_ order: [String: Any]) -> UUID? { UUID(uuidString: order["appAccountToken"] as? String ?? "") }
            let byNotification = TestApple.transaction("5000201", appAccountToken: token(charged))
            let byClient = TestApple.transaction("5000202", appAccountToken: token(proven))

            let uuid = UUID()
            let charge = try await apple.notification("ONE_TIME_CHARGE", uuid: uuid, transaction: byNotification)
            let applied = try await http.notifyAppleTaken(charge)
            #expect(applied["applied"] as? Bool == true && applied["streamId"] as? String == "order-o-charged")
            let (_, client) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": try await apple.sign(byClient)])
            #expect(client["outcome"] as? String == "matched" && client["orderId"] as? String == "o-proven")

            // The same events, with the same fields, as the client's proof appends.
            let fromNotification = try await events(http, "o-charged")
            let fromClient = try await events(http, "o-proven")
            #expect(fromNotification.map { $0["type"] as? String } == ["created", "receipt-received", "verified", "notification-received"])
            #expect(fromClient.map { $0["type"] as? String } == ["created", "receipt-received", "verified"])
            for index in 1...2 {
                let a = fromNotification[index]["data"] as? [String: Any] ?? [:]
                let b = fromClient[index]["data"] as? [String: Any] ?? [:]
                #expect(Set(a.keys) == Set(b.keys), "\(a) \(b)")
                #expect(a["matchedBy"] as? String == b["matchedBy"] as? String)
                #expect(a["environment"] as? String == b["environment"] as? String)
            }
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE status = 'claimed' AND matched_by = 'appAccountToken'", as: Int.self) == 2)

            // Applied twice: nothing more. The client's own proof of it later: the order as it stands.
            let count = try await eventCount(db)
            #expect(try await http.notifyAppleTaken(charge)["applied"] as? Bool == false)
            let (_, late) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": try await apple.sign(byNotification)])
            #expect(late["outcome"] as? String == "matched" && late["orderId"] as? String == "o-charged" && late["state"] as? String == "verified")
            #expect(try await eventCount(db) == count)

            // No order names it: the pool.
            let orphan = try await http.notifyAppleTaken(try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("5000203")))
            #expect(orphan["streamId"] as? String == "transaction-5000203")
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '5000203'", as: Int.self) == 1)
            let totals = try await http.send(.get, "/v1/reports/reconciliation").1["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["verified"] as? Int == 2 && totals["revenue"] as? String == "1.98", "\(totals)")
        }
    }
    @Test("another type's notification whose signed transaction Apple revoked never grants it: the refund is applied first, once")
    func revokedInAnotherType() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-charged"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-open"))
            let token = UUID(uuidString: created["appAccountToken"] as? String ?? "")
            let charge = try await apple.notification("ONE_TIME_CHARGE", transaction: revoked(TestApple.transaction("5000301", appAccountToken: token), type: "REFUND_FULL"))
            for _ in 0..<2 { try await http.notifyAppleTaken(charge) }
            #expect(try await events(http, "o-charged").map { $0["type"] as? String } == ["created", "receipt-received", "verified", "refunded", "notification-received"])
            // No order names it: pooled refunded, never paired.
            try await http.notifyAppleTaken(try await apple.notification("CONSUMPTION_REQUEST", transaction: revoked(TestApple.transaction("5000302"), type: "REFUND_FULL")))
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '5000302'", as: String.self) == "refunded")
            let (_, reconciled) = try await http.send(.post, "/v1/reconcile")
            #expect(reconciled["paired"] as? Int == 0, "\(reconciled)")
            let totals = try await http.send(.get, "/v1/reports/reconciliation").1["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["refunded"] as? Int == 1 && totals["revenue"] as? String == "0", "\(totals)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
    @Test("Apple's REFUND arriving after its REFUND_REVERSED refunds nothing, though the refund the order holds was recorded to the second")
    func lateRefundAfterReversalOfABackendsRefund() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let purchase = TestApple.transaction("5000401")
            try await http.deliveredOrder("o-late", paidWith: purchase, apple: apple)
            let revoked = Date(millisecondsSince1970: Date().millisecondsSince1970 / 1000 * 1000 - 30_456)
            // The backend passes Apple's refund on, its time cut to the second.
            let cut = ISO8601DateFormatter().string(from: revoked)
            let (status, answer) = try await http.send(.post, "/v1/orders/o-late/events", json: ["type": "refunded", "data": ["revocationDate": cut, "revocationReason": 1]])
            #expect(status == .created, "\(answer)")
            let reversal = try await http.notifyAppleTaken(try await apple.notification("REFUND_REVERSED", transaction: purchase))
            #expect(reversal["type"] as? String == "refund-reversed", "\(reversal)")
            // Apple's REFUND, retried or backfilled late, with the refund's own time.
            var refunded = purchase
            refunded.revocationDate = revoked.millisecondsSince1970
            refunded.revocationReason = 1
            let late = try await http.notifyAppleTaken(try await apple.notification("REFUND", transaction: refunded, signedDate: revoked))
            #expect(late["type"] as? String == "notification-received", "\(late)")
            let (_, order) = try await http.send(.get, "/v1/orders/o-late")
            #expect(order["state"] as? String == "delivered", "\(order)")
            #expect(try await scalar(db, "SELECT coalesce(sum(refunded_amount), 0)::text FROM dashboards.daily_orders", as: String.self) == "0")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
    @Test("a backend's own refund-reversed reverses the refund it undid, not Apple's new refund made after that refund was recorded")
    func newRefundAfterABackendsReversal() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let purchase = TestApple.transaction("5000501")
            try await http.deliveredOrder("o-new", paidWith: purchase, apple: apple)
            var first = purchase
            first.revocationDate = Date().addingTimeInterval(-60).millisecondsSince1970
            try await http.notifyAppleTaken(try await apple.notification("REFUND", transaction: first))
            // Apple refunds again after the first refund was recorded; the backend's correction
            // (its own refund-reversed) reaches the ledger after that.
            let again = Date()
            try await Task.sleep(for: .milliseconds(20))
            let (status, answer) = try await http.send(.post, "/v1/orders/o-new/events", json: ["type": "refund-reversed", "data": [:]])
            #expect(status == .created, "\(answer)")
            var second = purchase
            second.revocationDate = again.millisecondsSince1970
            let late = try await http.notifyAppleTaken(try await apple.notification("REFUND", transaction: second))
            #expect(late["type"] as? String == "refunded", "\(late)")
            #expect(try await http.send(.get, "/v1/orders/o-new").1["state"] as? String == "refunded")
            // The first refund sent again (a client's old revoked transaction) still refunds nothing more.
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'order-o-new' AND type = 'refunded'", as: Int.self) == 2)
        }
    }
}
