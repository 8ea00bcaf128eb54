import Foundation
import LedgerStore
import LedgerTestSupport
import Testing

/// A verifyReceipt answer with status 0 whose in_app holds `items` as Apple writes them.
private func answer(_ items: [String]) -> VerifyReceiptStandIn.Answer {
    .json(#"{"status": 0, "environment": "Production", "receipt": {"bundle_id": "\#(TestApple.bundleId)", "in_app": [\#(items.joined(separator: ","))]}}"#)
}

/// One in_app entry: a purchase (`original` its own id), or a restore of `original`; cancelled
/// by Apple at `cancelled` (ms) when given.
private func item(
    _ id: String, original: String? = nil, product: String = "gems.100", purchased: Int64, cancelled: Int64? = nil, quantity: Int = 1,
    ownership: String? = nil
) -> String {
    let cancellation = cancelled.map { #", "cancellation_date_ms": "\#($0)", "cancellation_reason": "0""# } ?? ""
    let owned = ownership.map { #", "in_app_ownership_type": "\#($0)""# } ?? ""
    return #"{"transaction_id": "\#(id)", "original_transaction_id": "\#(original ?? id)", "product_id": "\#(product)", "purchase_date_ms": "\#(purchased)", "quantity": "\#(quantity)"\#(cancellation)\#(owned)}"#
}

@Suite("Legacy receipts: what Apple took back, restores, and orders a receipt holds nothing for")
struct LegacyReceiptTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("receiptData that is no base64 (empty, blank, other characters) is 400 naming it, and Apple is not asked; base64 wrapped in lines is sent without its line breaks")
    func receiptDataIsBase64() async throws {
        let now = Date().millisecondsSince1970
        let standIn = VerifyReceiptStandIn(answers: ["production:TWF/u+w=QUJD": answer([item("3000191", purchased: now - 60_000)])])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, db in
                let events = try await eventCount(db)
                for bad in ["", "   ", "!!!!", "ab-_", "TWFu%3D", "TWFu\u{0}", "=====", " == "] {
                    let (status, refused) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-b", "receiptData": bad])
                    #expect(status == .badRequest && errorOf(refused)["field"] as? String == "receiptData", "\(bad.debugDescription): \(refused)")
                    #expect(await standIn.calls("production:\(bad)") == 0, "\(bad.debugDescription) went to Apple")
                }
                #expect(try await eventCount(db) == events)
                let (_, wrapped) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-b", "receiptData": "TWF/u+w=\r\nQUJD"])
                #expect(wrapped["outcome"] as? String == "unmatched" && wrapped["transactionId"] as? String == "3000191", "\(wrapped)")
            }
        }
    }

    @Test("a transaction whose cancellation_date Apple reports is never granted: refused when claimed, left out when not, never pooled")
    func cancelledIsNeverGranted() async throws {
        let now = Date().millisecondsSince1970
        let standIn = VerifyReceiptStandIn(answers: [
            "production:REFUNDED": answer([item("3000101", purchased: now - 60_000, cancelled: now - 1_000)]),
            "production:MIXED": answer([item("3000102", purchased: now - 50_000, cancelled: now - 1_000), item("3000103", purchased: now - 40_000)]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, db in
                for id in ["o-refunded", "o-mixed"] { try await http.send(.post, "/v1/orders", json: newOrder(id, user: "u-r")) }
                let (_, claimed) = try await http.send(
                    .post, "/v1/receipts", json: ["userId": "u-r", "orderId": "o-refunded", "transactionId": "3000101", "receiptData": "REFUNDED"])
                #expect(claimed["outcome"] as? String == "rejected" && claimed["reason"] as? String == "transaction-revoked", "\(claimed)")
                #expect(claimed["finishTransaction"] as? Bool == true)
                let (_, unclaimed) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-r", "receiptData": "REFUNDED"])
                #expect(unclaimed["outcome"] as? String == "rejected" && unclaimed["reason"] as? String == "transaction-revoked", "\(unclaimed)")
                let (_, order) = try await http.send(.get, "/v1/orders/o-refunded")
                #expect(order["state"] as? String == "created" && order["version"] as? Int == 0, "\(order)")

                let (_, mixed) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-r", "orderId": "o-mixed", "receiptData": "MIXED"])
                #expect(mixed["outcome"] as? String == "matched" && mixed["transactionId"] as? String == "3000103", "\(mixed)")
                #expect((mixed["transactions"] as? [[String: Any]])?.compactMap { $0["transactionId"] as? String } == ["3000103"], "\(mixed)")
                #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE transaction_id IN ('3000101', '3000102')", as: Int.self) == 0)
                let (_, reconciled) = try await http.send(.post, "/v1/reconcile")
                #expect(reconciled["paired"] as? Int == 0, "\(reconciled)")
            }
        }
    }

    @Test("a non-consumable refunded and bought again: the cancelled purchase, older than the order, stays in every receipt; the order's own is awaited, not finished")
    func refundedBeforeTheOrder() async throws {
        let now = Date().millisecondsSince1970
        let day: Int64 = 86_400_000
        let old = item("3000140", purchased: now - 30 * day, cancelled: now - 20 * day)
        let standIn = VerifyReceiptStandIn(answers: [
            "production:OLD": answer([old]),
            "production:BOTH": answer([old, item("3000141", purchased: now + 60_000)]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, _ in
                try await http.send(.post, "/v1/orders", json: newOrder("o-again", user: "u-again"))
                let (_, early) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-again", "orderId": "o-again", "receiptData": "OLD"])
                #expect(early["outcome"] as? String == "rejected" && early["reason"] as? String == "transaction-not-in-receipt", "\(early)")
                #expect(early["finishTransaction"] as? Bool == false, "the client's purchase is still to be verified: \(early)")
                let (_, paid) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-again", "orderId": "o-again", "receiptData": "BOTH"])
                #expect(paid["outcome"] as? String == "matched" && paid["transactionId"] as? String == "3000141", "\(paid)")
            }
        }
    }

    @Test("a receipt listing Apple's refund of a purchase the ledger granted records the refund, once")
    func cancelledAfterGranted() async throws {
        let now = Date().millisecondsSince1970
        let standIn = VerifyReceiptStandIn(answers: [
            "production:BOUGHT": answer([item("3000130", purchased: now - 60_000)]),
            "production:LATER": answer([item("3000130", purchased: now - 60_000, cancelled: now - 1_000), item("3000131", purchased: now - 30_000)]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, db in
                try await http.send(.post, "/v1/orders", json: newOrder("o-bought", user: "u-c"))
                let (_, bought) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-c", "orderId": "o-bought", "receiptData": "BOUGHT"])
                #expect(bought["outcome"] as? String == "matched", "\(bought)")
                try await http.send(.post, "/v1/orders/o-bought/events", json: ["type": "delivered", "data": [:]])
                try await http.send(.post, "/v1/orders", json: newOrder("o-next", user: "u-c"))
                for _ in 0..<2 {
                    let (_, next) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-c", "orderId": "o-next", "receiptData": "LATER"])
                    #expect(next["outcome"] as? String == "matched" && next["transactionId"] as? String == "3000131", "\(next)")
                }
                let (_, order) = try await http.send(.get, "/v1/orders/o-bought")
                #expect(order["state"] as? String == "refunded", "\(order)")
                #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'order-o-bought' AND type = 'refunded'", as: Int.self) == 1)
            }
        }
    }

    @Test("the named order takes the receipt's purchase that can pay it: of its quantity (one another open order is of is never taken for it, a real mismatch is final), never a family member's share")
    func namedOrderTakesAPurchaseThatPays() async throws {
        let now = Date().millisecondsSince1970
        let standIn = VerifyReceiptStandIn(answers: [
            "production:TWO": answer([item("3000140", purchased: now - 20_000), item("3000141", purchased: now - 19_500, quantity: 2)]),
            "production:SHARED": answer([item("3000142", purchased: now - 20_000, ownership: "FAMILY_SHARED"), item("3000143", purchased: now - 19_000, ownership: "PURCHASED")]),
            // Sent for an order of one before its own purchase is in the receipt: the purchase of two is another order's.
            "production:STALE": answer([item("3000144", purchased: now - 10_000, quantity: 2)]),
            "production:FRESH": answer([item("3000144", purchased: now - 10_000, quantity: 2), item("3000145", purchased: now - 9_000)]),
            // No order of three: the order's own purchase, of another quantity than the order's.
            "production:THREE": answer([item("3000146", purchased: now - 5_000, quantity: 3)]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, db in
                var two = newOrder("o-two", user: "u-q")
                two["quantity"] = 2
                let (created, order) = try await http.send(.post, "/v1/orders", json: two)
                #expect(created == .created, "\(order)")
                let (_, paid) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-q", "orderId": "o-two", "receiptData": "TWO"])
                #expect(paid["outcome"] as? String == "matched" && paid["transactionId"] as? String == "3000141", "\(paid)")

                try await http.send(.post, "/v1/orders", json: newOrder("o-own", user: "u-q"))
                let (_, own) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-q", "orderId": "o-own", "receiptData": "SHARED"])
                #expect(own["outcome"] as? String == "matched" && own["transactionId"] as? String == "3000143", "\(own)")

                try await http.send(.post, "/v1/orders", json: newOrder("o-one", user: "u-s"))
                two["orderId"] = "o-pair"
                two["userId"] = "u-s"
                try await http.send(.post, "/v1/orders", json: two)
                let (_, stale) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-s", "orderId": "o-one", "receiptData": "STALE"])
                #expect(stale["reason"] as? String == "transaction-not-in-receipt" && stale["finishTransaction"] as? Bool == false, "\(stale)")
                let (_, pair) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-s", "orderId": "o-pair", "receiptData": "STALE"])
                #expect(pair["outcome"] as? String == "matched" && pair["transactionId"] as? String == "3000144", "\(pair)")
                let (_, fresh) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-s", "orderId": "o-one", "receiptData": "FRESH"])
                #expect(fresh["outcome"] as? String == "matched" && fresh["transactionId"] as? String == "3000145", "\(fresh)")
                #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE state = 'failed'", as: Int.self) == 0)
                // A real mismatch (no open order of the user is of three) is final, not a receipt to refresh for ever.
                try await http.send(.post, "/v1/orders", json: newOrder("o-three", user: "u-m"))
                let (_, three) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-m", "orderId": "o-three", "receiptData": "THREE"])
                #expect(three["reason"] as? String == "quantity-mismatch" && three["transactionId"] as? String == "3000146", "\(three)")
                #expect(try await scalar(db, "SELECT failure_reason FROM orders WHERE order_id = 'o-three'", as: String.self) == "quantity-mismatch")
            }
        }
    }

    @Test("a restore pays no order: answered recorded; the order the proof names stays open, else the answer names the original's order")
    func restorePaysNoOrder() async throws {
        let now = Date().millisecondsSince1970
        let original = item("3000080", product: "lifetime", purchased: now - 60_000)
        let restore = item("3000081", original: "3000080", product: "lifetime", purchased: now - 30_000)
        let standIn = VerifyReceiptStandIn(answers: [
            "production:FIRST": answer([original]),
            "production:RESTORED": answer([original, restore]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, db in
                for id in ["r-1", "r-2", "r-3"] { try await http.send(.post, "/v1/orders", json: newOrder(id, user: "u-4", product: "lifetime")) }
                let (_, first) = try await http.send(.post, "/v1/receipts", json: ["orderId": "r-1", "transactionId": "3000080", "receiptData": "FIRST"])
                #expect(first["outcome"] as? String == "matched", "\(first)")
                let (_, claimed) = try await http.send(.post, "/v1/receipts", json: ["orderId": "r-2", "transactionId": "3000081", "receiptData": "RESTORED"])
                #expect(claimed["outcome"] as? String == "recorded" && claimed["reason"] as? String == "restore", "\(claimed)")
                #expect(claimed["orderId"] as? String == "r-2" && claimed["state"] as? String == "created", "\(claimed)")
                #expect(claimed["finishTransaction"] as? Bool == true, "\(claimed)")
                let (_, alone) = try await http.send(.post, "/v1/receipts", json: ["transactionId": "3000081", "receiptData": "RESTORED"])
                #expect(alone["outcome"] as? String == "recorded" && alone["orderId"] as? String == "r-1", "\(alone)")
                let (_, unclaimed) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-4", "orderId": "r-3", "receiptData": "RESTORED"])
                #expect(unclaimed["outcome"] as? String == "recorded" && unclaimed["reason"] as? String == "restore", "\(unclaimed)")
                for id in ["r-2", "r-3"] {
                    let (_, order) = try await http.send(.get, "/v1/orders/\(id)")
                    #expect(order["state"] as? String == "created" && order["version"] as? Int == 0, "\(id): \(order)")
                }
                // Kept as a restore, for the user its original paid: no pool entry, never paired.
                #expect(try await scalar(db, "SELECT status || ' ' || user_id FROM apple_transactions WHERE transaction_id = '3000081'", as: String.self) == "restore u-4")
                #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions", as: Int.self) == 0)
                #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
                let (_, reconciled) = try await http.send(.post, "/v1/reconcile")
                #expect(reconciled["paired"] as? Int == 0, "\(reconciled)")
                let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
                #expect((report["totals"] as? [String: Any])?["verified"] as? Int == 1, "\(report)")
            }
        }
    }

    @Test("one receipt uploaded for several orders at once, no transaction named: one order takes its purchase, none is failed")
    func concurrentUploadsWithoutAClaim() async throws {
        let now = Date().millisecondsSince1970
        // With a refunded purchase of the same product beside it: the losers' answer is still
        // about the purchase another order took, never told to finish.
        let standIn = VerifyReceiptStandIn(answers: [
            "production:ONE": answer([item("3000121", purchased: now - 60_000, cancelled: now - 50_000), item("3000120", purchased: now - 30_000)]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, db in
                let orders = (0..<8).map { "q-\($0)" }
                for id in orders { try await http.send(.post, "/v1/orders", json: newOrder(id, user: "u-q")) }
                // Each on a connection of its own, so that they are served at once.
                let outcomes = try await http.withConnections(orders.count) { clients in
                    try await withThrowingTaskGroup(of: String.self) { group in
                        for (id, client) in zip(orders, clients) {
                            group.addTask {
                                let (_, answer) = try await client.send(.post, "/v1/receipts", json: ["userId": "u-q", "orderId": id, "receiptData": "ONE"])
                                return "\(answer["outcome"] as? String ?? "?") \(answer["reason"] as? String ?? "")"
                            }
                        }
                        return try await group.reduce(into: [String]()) { $0.append($1) }
                    }
                }
                #expect(outcomes.filter { $0.hasPrefix("matched") }.count == 1, "\(outcomes)")
                #expect(outcomes.filter { !$0.hasPrefix("matched") }.allSatisfy { $0 == "rejected transaction-not-in-receipt" }, "\(outcomes)")
                #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE state = 'failed'", as: Int.self) == 0)
            }
        }
    }

    @Test("a receipt naming an order it holds nothing for is not answered with another order's match")
    func namedOrderWithNothingInTheReceipt() async throws {
        let now = Date().millisecondsSince1970
        let standIn = VerifyReceiptStandIn(answers: [
            "production:X0": answer([item("3000090", purchased: now - 60_000), item("3000091", product: "gems.500", purchased: now - 50_000)]),
            // The same, with a refunded purchase of another product Apple keeps listing.
            "production:X1": answer([
                item("3000090", purchased: now - 60_000), item("3000091", product: "gems.500", purchased: now - 50_000),
                item("3000092", product: "gems.500", purchased: now - 40_000, cancelled: now - 1_000),
            ]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, db in
                for id in ["x-0", "x-1"] { try await http.send(.post, "/v1/orders", json: newOrder(id, user: "u-x")) }
                let (_, first) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-x", "orderId": "x-0", "transactionId": "3000090", "receiptData": "X0"])
                #expect(first["outcome"] as? String == "matched", "\(first)")
                let (_, replay) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-x", "orderId": "x-1", "receiptData": "X0"])
                #expect(replay["outcome"] as? String == "rejected" && replay["reason"] as? String == "transaction-not-in-receipt", "\(replay)")
                #expect(replay["finishTransaction"] as? Bool == false && replay["orderId"] as? String == "x-1", "\(replay)")
                let (_, order) = try await http.send(.get, "/v1/orders/x-1")
                #expect(order["state"] as? String == "created" && order["version"] as? Int == 0, "\(order)")
                // The receipt's other purchase is taken in all the same: it waits for its own order.
                #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '3000091'", as: Int.self) == 1)
                // Another product's refund in the receipt says nothing of this order; nor is an
                // order the ledger does not hold answered with x-0's match.
                for (order, receipt) in [("x-1", "X1"), ("x-unknown", "X0")] {
                    let (_, again) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-x", "orderId": order, "receiptData": receipt])
                    #expect(again["outcome"] as? String == "rejected" && again["reason"] as? String == "transaction-not-in-receipt", "\(order): \(again)")
                    #expect(again["finishTransaction"] as? Bool == false, "\(order): \(again)")
                }
            }
        }
    }

    @Test("a subscription started from a legacy receipt in its free trial (is_trial_period) pays its order with no revenue; a start without it counts its order's")
    func freeTrialFromAReceipt() async throws {
        let now = Date().millisecondsSince1970
        func start(_ id: String, trial: Bool) -> String {
            #"{"transaction_id": "\#(id)", "original_transaction_id": "\#(id)", "product_id": "pro.monthly", "purchase_date_ms": "\#(now - 60_000)", "#
                + #""expires_date_ms": "\#(now + 86_400_000)", "web_order_line_item_id": "w-\#(id)", "quantity": "1", "is_trial_period": "\#(trial)"}"#
        }
        let standIn = VerifyReceiptStandIn(answers: ["production:VFJJQUw=": answer([start("3000201", trial: true)]), "production:UEFJRA==": answer([start("3000202", trial: false)])])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, _ in
                try await http.send(.put, "/v1/products/pro.monthly", json: ["type": "auto-renewable", "subscriptionGroup": "g-pro", "price": "9.99", "currency": "USD"])
                for (order, receipt) in [("o-trial", "VFJJQUw="), ("o-paid", "UEFJRA==")] {
                    try await http.send(.post, "/v1/orders", json: ["orderId": order, "userId": "u-t", "productId": "pro.monthly", "price": "9.99", "currency": "USD"])
                    let (_, started) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-t", "orderId": order, "receiptData": receipt])
                    #expect(started["outcome"] as? String == "matched" && started["state"] as? String == "verified", "\(started)")
                }
                let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
                let starts = (report["rows"] as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "subscription-start" }
                #expect(starts.map { $0["verified"] as? Int ?? 0 }.reduce(0, +) == 2, "\(starts)")
                let revenue = starts.compactMap { Decimal(string: $0["revenue"] as? String ?? "") }.reduce(0, +)
                #expect(revenue == Decimal(string: "9.99"), "the paid start's order alone: \(starts)")
            }
        }
    }

    @Test("a receipt holding a transaction the ledger cannot take (a product typed auto-renewable, no expires_date_ms) is 400 before any of it is applied; one claiming another transaction is applied")
    func receiptRefusedWhole() async throws {
        let now = Date().millisecondsSince1970
        let untyped = #"{"transaction_id": "3000212", "original_transaction_id": "3000212", "product_id": "pro.monthly", "purchase_date_ms": "\#(now - 30_000)", "quantity": "1"}"#
        let standIn = VerifyReceiptStandIn(answers: ["production:UEFSVA==": answer([item("3000211", purchased: now - 40_000), untyped])])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, db in
                try await http.send(.put, "/v1/products/pro.monthly", json: ["type": "auto-renewable", "subscriptionGroup": "g-pro"])
                try await http.send(.post, "/v1/orders", json: newOrder("o-part", user: "u-p"))
                let events = try await eventCount(db)
                let (status, refused) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-p", "orderId": "o-part", "receiptData": "UEFSVA=="])
                #expect(status == .badRequest && errorOf(refused)["field"] as? String == "expiresDate", "\(refused)")
                #expect(try await eventCount(db) == events, "nothing of the receipt applied")
                let (_, claimed) = try await http.send(
                    .post, "/v1/receipts", json: ["userId": "u-p", "orderId": "o-part", "transactionId": "3000211", "receiptData": "UEFSVA=="])
                #expect(claimed["outcome"] as? String == "matched" && claimed["transactionId"] as? String == "3000211", "\(claimed)")
            }
        }
    }
}
