import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerJSON
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("POST /v1/notifications/apple and legacy receipts over HTTP")
struct NotificationRoutesTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("REFUND refunds the order once per notificationUUID; REFUND_REVERSED reverses it; other types are recorded")
    func refunds() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let transaction = TestApple.transaction("2000001")
            try await http.deliveredOrder("o-refund", paidWith: transaction, apple: apple)

            var refunded = transaction
            refunded.revocationDate = Date().millisecondsSince1970
            refunded.revocationReason = 1
            let uuid = UUID()
            let refund = try await apple.notification("REFUND", uuid: uuid, transaction: refunded)
            let (status, first) = try await http.notifyApple(refund)
            #expect(status == .ok && first["applied"] as? Bool == true && first["type"] as? String == "refunded")
            let count = try await eventCount(db)
            let (again, second) = try await http.notifyApple(refund)
            #expect(again == .ok && second["applied"] as? Bool == false)
            #expect(try await eventCount(db) == count)
            let (_, order) = try await http.send(.get, "/v1/orders/o-refund")
            #expect(order["state"] as? String == "refunded")
            let refundEvent = (order["events"] as? [[String: Any]])?.last
            #expect(refundEvent?["eventId"] as? String == uuid.uuidString.lowercased())
            #expect((refundEvent?["data"] as? [String: Any])?["notificationType"] as? String == "REFUND")
            #expect((refundEvent?["data"] as? [String: Any])?["revocationType"] == nil, "Apple's signed transaction said none: a full refund")

            let (_, reversed) = try await http.notifyApple(try await apple.notification("REFUND_REVERSED", transaction: transaction))
            #expect(reversed["type"] as? String == "refund-reversed")
            let (_, consumption) = try await http.notifyApple(try await apple.notification("CONSUMPTION_REQUEST", transaction: transaction))
            #expect(consumption["type"] as? String == "notification-received" && consumption["streamId"] as? String == "order-o-refund")
            let (_, after) = try await http.send(.get, "/v1/orders/o-refund")
            #expect(after["state"] as? String == "delivered")

            // Refunded again after the reversal, by half: refunded, and the report takes the money
            // back once, by the refund that stands.
            var refundAgain = transaction
            refundAgain.revocationDate = Date().addingTimeInterval(1).millisecondsSince1970
            refundAgain.revocationType = "REFUND_PRORATED"
            refundAgain.revocationPercentage = 50_000
            let (_, refundedAgain) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refundAgain))
            #expect(refundedAgain["type"] as? String == "refunded")
            let totals = try await http.send(.get, "/v1/reports/reconciliation").1["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["refunded"] as? Int == 1 && totals["refundedAmount"] as? String == "0.495" && totals["revenue"] as? String == "0.495", "\(totals)")
            #expect(try await scalar(db, "SELECT refunded_amount::text FROM dashboards.daily_orders WHERE state = 'refunded'", as: String.self)
                        .flatMap { Decimal(string: $0) } == Decimal(string: "0.495"), "the dashboard says the same")

            // Then Apple refunds it in full, later: the order is refunded already (the refund kept
            // on its notification-received), and the report takes the whole price back, Apple's latest.
            var refundInFull = transaction
            refundInFull.revocationDate = Date().addingTimeInterval(2).millisecondsSince1970
            refundInFull.revocationType = "REFUND_FULL"
            let (_, full) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refundInFull))
            #expect(full["type"] as? String == "notification-received", "\(full)")
            let fullTotals = try await http.send(.get, "/v1/reports/reconciliation").1["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(fullTotals["refunded"] as? Int == 1 && fullTotals["refundedAmount"] as? String == "0.99" && fullTotals["revenue"] as? String == "0",
                    "\(fullTotals)")
            #expect(try await scalar(db, "SELECT refunded_amount::text FROM dashboards.daily_orders WHERE state = 'refunded'", as: String.self)
                        .flatMap { Decimal(string: $0) } == Decimal(string: "0.99"), "the dashboard says the same")
        }
    }

    @Test("a backend's own event under Apple's notificationUUID never swallows the notification: it refunds the order, once")
    func backendTookTheNotificationsUUID() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let uuid = UUID()
            let transaction = TestApple.transaction("2000060")
            try await http.send(.post, "/v1/orders", json: newOrder("o-uuid"))
            try await http.send(.post, "/v1/receipts", json: ["orderId": "o-uuid", "signedTransaction": try await apple.sign(transaction)])
            let (delivered, _) = try await http.send(
                .post, "/v1/orders/o-uuid/events", json: ["type": "delivered", "eventId": uuid.uuidString, "data": [:]])
            #expect(delivered == .created)
            var refunded = transaction
            refunded.revocationDate = Date().millisecondsSince1970
            let refund = try await apple.notification("REFUND", uuid: uuid, transaction: refunded)
            let (status, first) = try await http.notifyApple(refund)
            #expect(status == .ok && first["applied"] as? Bool == true && first["type"] as? String == "refunded", "\(first)")
            let count = try await eventCount(db)
            let (_, again) = try await http.notifyApple(refund)
            #expect(again["applied"] as? Bool == false && again["type"] as? String == "refunded", "Apple's retry: \(again)")
            #expect(try await eventCount(db) == count)
            let (_, order) = try await http.send(.get, "/v1/orders/o-uuid")
            #expect(order["state"] as? String == "refunded", "\(order)")
            // The backend's retry of its own event is answered as before.
            let (retried, _) = try await http.send(
                .post, "/v1/orders/o-uuid/events", json: ["type": "delivered", "eventId": uuid.uuidString, "data": [:]])
            #expect(retried == .ok)
            // A backend that forwarded Apple's refund as its own `refunded` under the notification's
            // UUID, then its reversal: the notification is that fact, applied already, never a second refund.
            let forwarded = UUID()
            let other = TestApple.transaction("2000061")
            try await http.deliveredOrder("o-forwarded", paidWith: other, apple: apple)
            let (ownRefund, ownRefundAnswer) = try await http.send(
                .post, "/v1/orders/o-forwarded/events",
                json: ["type": "refunded", "eventId": forwarded.uuidString, "data": ["revocationDate": "2026-11-01T10:00:00Z"]])
            try await http.send(.post, "/v1/orders/o-forwarded/events", json: ["type": "refund-reversed", "data": [:]])
            #expect(ownRefund == .created, "\(ownRefundAnswer)")
            var otherRefunded = other
            otherRefunded.revocationDate = Date().addingTimeInterval(-5).millisecondsSince1970
            let (_, late) = try await http.notifyApple(try await apple.notification("REFUND", uuid: forwarded, transaction: otherRefunded))
            #expect(late["applied"] as? Bool == false, "\(late)")
            let (_, reversedOrder) = try await http.send(.get, "/v1/orders/o-forwarded")
            #expect(reversedOrder["state"] as? String == "delivered", "\(reversedOrder)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a REFUND that arrives after the REFUND_REVERSED Apple signed later refunds nothing (an order's, a pooled one's); a later refund does")
    func refundAfterItsReversal() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let now = Date()
            let held = TestApple.transaction("2000011")
            try await http.deliveredOrder("o-reversed", paidWith: held, apple: apple)
            let pooled = TestApple.transaction("2000012")
            try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: pooled))

            for transaction in [held, pooled] {
                // Refunded two hours ago and reversed an hour ago; the reversal comes first (Apple
                // retried the refund's notification, or a backfill found it).
                var refunded = transaction
                refunded.revocationDate = now.addingTimeInterval(-7200).millisecondsSince1970
                refunded.revocationReason = 1
                let (_, reversal) = try await http.notifyApple(
                    try await apple.notification("REFUND_REVERSED", transaction: transaction, signedDate: now.addingTimeInterval(-3600)))
                #expect(reversal["type"] as? String == "notification-received")
                let (status, late) = try await http.notifyApple(
                    try await apple.notification("REFUND", transaction: refunded, signedDate: now.addingTimeInterval(-7190)))
                #expect(status == .ok && late["applied"] as? Bool == true)
                #expect(late["type"] as? String == "notification-received", "\(transaction.transactionId): the reversed refund refunds nothing")
            }
            var (_, order) = try await http.send(.get, "/v1/orders/o-reversed")
            #expect(order["state"] as? String == "delivered")
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '2000012'", as: Int.self) == 1,
                    "still waits to be granted")

            // Refunded again after the reversal: that refund stands.
            var again = held
            again.revocationDate = now.millisecondsSince1970
            again.revocationReason = 1
            let (_, refund) = try await http.notifyApple(try await apple.notification("REFUND", transaction: again))
            #expect(refund["type"] as? String == "refunded")
            (_, order) = try await http.send(.get, "/v1/orders/o-reversed")
            #expect(order["state"] as? String == "refunded")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a refund recorded, reversed, then told again (the refund catch-up's record, another notification of it) refunds nothing; an order's and a pooled one's")
    func refundToldAgainAfterItsReversal() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let held = TestApple.transaction("2000021")
            try await http.deliveredOrder("o-told-again", paidWith: held, apple: apple)
            let pooled = TestApple.transaction("2000022")
            try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: pooled))

            // A revocation time the log writes a millisecond early where there is one (its times
            // have three decimals, cut from a Double): the same refund is still found.
            let recent = Date().addingTimeInterval(-600).millisecondsSince1970
            let revoked = (recent..<recent + 1000).first { ms in
                EventCoding.parseDate(EventCoding.formatDate(Date(millisecondsSince1970: ms)))?.millisecondsSince1970 != ms
            } ?? recent
            for (transaction, refundType, stream) in [(held, "refunded", "order-o-told-again"), (pooled, "notification-received", "transaction-2000022")] {
                var refunded = transaction
                refunded.revocationDate = revoked
                refunded.revocationReason = 1
                let (_, refund) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded))
                #expect(refund["type"] as? String == refundType)
                try await http.notifyApple(try await apple.notification("REFUND_REVERSED", transaction: transaction))
                // The same refund (revoked at the same time) under another notification's UUID.
                let (_, again) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded))
                #expect(again["type"] as? String == "notification-received" && again["streamId"] as? String == stream, "\(again)")
            }
            let (_, order) = try await http.send(.get, "/v1/orders/o-told-again")
            #expect(order["state"] as? String == "delivered")
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '2000022'", as: Int.self) == 1)
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE data->>'reversedBefore' = 'true'", as: Int.self) == 2)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a notification about a transaction the ledger does not know puts it in the pool; a refund keeps it from being granted")
    func unknownTransaction() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let (_, answer) = try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("2000002")))
            #expect(answer["streamId"] as? String == "transaction-2000002")
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '2000002'", as: Int.self) == 1)
            try await http.notifyApple(try await apple.notification("REFUND", transaction: TestApple.transaction("2000002")))
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '2000002'", as: Int.self) == 0)
            try await http.send(.post, "/v1/orders", json: newOrder("o-late"))
            let (_, receipt) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-late", "signedTransaction": try await apple.sign(TestApple.transaction("2000002"))])
            #expect(receipt["outcome"] as? String == "rejected" && receipt["reason"] as? String == "transaction-refunded")
            let (_, order) = try await http.send(.get, "/v1/orders/o-late")
            #expect(order["state"] as? String == "created")
        }
    }

    @Test("a purchase Apple told of before any client (no user) is the user's its client's upload names, once; the reconciler then pairs it")
    func notifiedFirstThenClaimed() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-orphan", user: "u-orphan"))
            try await http.send(.post, "/v1/orders/o-orphan/events", json: ["type": "payment-added", "data": [:]])
            let purchase = TestApple.transaction("2000010")
            let (told, _) = try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: purchase))
            #expect(told == .ok)
            func userOf() async throws -> String? {
                try await scalar(db, "SELECT coalesce(user_id, '-') FROM apple_transactions WHERE transaction_id = '2000010'", as: String.self)
            }
            #expect(try await userOf() == "-")

            // The client lost the order id (applicationUsername): it sends its user's id alone.
            let (_, uploaded) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-orphan", "signedTransaction": try await apple.sign(purchase)])
            #expect(uploaded["outcome"] as? String == "unmatched", "\(uploaded)")
            #expect(try await userOf() == "u-orphan")
            let count = try await eventCount(db)
            _ = try await http.send(.post, "/v1/receipts", json: ["userId": "u-other", "signedTransaction": try await apple.sign(purchase)])
            #expect(try await userOf() == "u-orphan", "the first claim stands")
            #expect(try await eventCount(db) == count)

            let (_, pass) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(pass["paired"] as? Int == 1, "\(pass)")
            let (_, order) = try await http.send(.get, "/v1/orders/o-orphan")
            #expect(order["state"] as? String == "verified" && order["transactionId"] as? String == "2000010", "\(order)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a REFUND delivered twice at once, racing its transaction's proofs, is taken each time (200) and refunds its order once")
    func refundRacingItself() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let rounds = 12
            var notifications: [String] = []
            var proofs: [String] = []
            for n in 0..<rounds {
                let payload = TestApple.transaction("\(2_100_000 + n)")
                try await http.deliveredOrder("race-r\(n)", paidWith: payload, apple: apple)
                var revoked = payload
                revoked.revocationDate = Date().millisecondsSince1970
                revoked.revocationReason = 1
                notifications.append(try await apple.notification("REFUND", transaction: revoked))
                proofs.append(try await apple.sign(payload))
            }
            let (sent, proofsSent) = (notifications, proofs)
            // Apple's delivery and its retry arrive at once; the client uploads the proof again meanwhile.
            // Four connections: requests on one are served in turn, on different ones at once.
            let answers = try await http.withConnections(4) { clients in
                try await withThrowingTaskGroup(of: [(notification: Bool, status: HTTPResponse.Status, applied: Bool?)].self) { group in
                    for (index, client) in clients.enumerated() {
                        group.addTask {
                            var mine: [(notification: Bool, status: HTTPResponse.Status, applied: Bool?)] = []
                            for n in 0..<rounds {
                                if index < 2 {
                                    let (status, answer) = try await client.notifyApple(sent[n])
                                    mine.append((true, status, answer["applied"] as? Bool))
                                } else {
                                    let (status, _) = try await client.send(
                                        .post, "/v1/receipts", json: ["orderId": "race-r\(n)", "signedTransaction": proofsSent[n]])
                                    mine.append((false, status, nil))
                                }
                            }
                            return mine
                        }
                    }
                    var all: [(notification: Bool, status: HTTPResponse.Status, applied: Bool?)] = []
                    for try await answers in group { all += answers }
                    return all
                }
            }
            let notified = answers.filter(\.notification)
            #expect(notified.count == 2 * rounds && notified.allSatisfy { $0.status == .ok }, "\(notified.map(\.status))")
            #expect(notified.filter { $0.applied == true }.count == rounds && notified.filter { $0.applied == false }.count == rounds)
            #expect(answers.allSatisfy { $0.status.code < 500 }, "\(answers.map(\.status))")
            #expect(try await scalar(db, "SELECT count(*)::int FROM orders WHERE order_id LIKE 'race-r%' AND state = 'refunded'", as: Int.self) == rounds)
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id LIKE 'order-race-r%' AND type = 'refunded'", as: Int.self) == rounds)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a ONE_TIME_CHARGE of a purchase the ledger does not know, delivered twice at once, is applied once and answered so once")
    func chargeRacingItself() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let rounds = 12
            var notifications: [String] = []
            for n in 0..<rounds {
                notifications.append(try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("\(2_200_000 + n)")))
            }
            let sent = notifications
            let applied = try await http.withConnections(2) { clients in
                try await withThrowingTaskGroup(of: [Bool].self) { group in
                    for client in clients {
                        group.addTask {
                            var mine: [Bool] = []
                            for n in 0..<rounds {
                                let (status, answer) = try await client.notifyApple(sent[n])
                                #expect(status == .ok, "\(answer)")
                                mine.append(answer["applied"] as? Bool ?? false)
                            }
                            return mine
                        }
                    }
                    return try await group.reduce(into: [Bool]()) { $0 += $1 }
                }
            }
            #expect(applied.filter { $0 }.count == rounds, "\(applied)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id LIKE 'transaction-22000%' AND type = 'notification-received'", as: Int.self) == rounds)
        }
    }

    @Test("a refund Apple made after a reversal, arriving before that reversal, stands: the order stays refunded, a pooled one is never granted")
    func refundBeforeTheReversalOfAnEarlierOne() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let now = Date()
            let (first, reversal, second) = (now.addingTimeInterval(-300), now.addingTimeInterval(-200), now.addingTimeInterval(-100))
            func refund(_ payload: SignedTransactionPayload, at date: Date) async throws -> String {
                var revoked = payload
                revoked.revocationDate = date.millisecondsSince1970
                revoked.revocationReason = 0
                return try await apple.notification("REFUND", transaction: revoked, signedDate: date)
            }
            let paid = TestApple.transaction("2300001")
            try await http.deliveredOrder("o-twice", paidWith: paid, apple: apple)
            let (_, pooledAnswer) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": try await apple.sign(TestApple.transaction("2300002"))])
            #expect(pooledAnswer["outcome"] as? String == "unmatched", "\(pooledAnswer)")
            for payload in [paid, TestApple.transaction("2300002")] {
                // Refunded, refunded again after a reversal, the reversal of the first arriving last.
                try await http.notifyAppleTaken(try await refund(payload, at: first))
                try await http.notifyAppleTaken(try await refund(payload, at: second))
                try await http.notifyAppleTaken(try await apple.notification("REFUND_REVERSED", transaction: payload, signedDate: reversal))
            }
            let (_, order) = try await http.send(.get, "/v1/orders/o-twice")
            #expect(order["state"] as? String == "refunded", "\(order)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '2300002'", as: String.self) == "refunded")
            try await http.send(.post, "/v1/orders", json: newOrder("o-open"))
            #expect(try await http.send(.post, "/v1/reconcile").1["paired"] as? Int == 0)
            let totals = try await http.send(.get, "/v1/reports/reconciliation").1["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["refunded"] as? Int == 1 && totals["revenue"] as? String == "0", "one sale, one refund standing: \(totals)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a pooled purchase whose every refund Apple reversed waits again, whatever order the reversals arrive in")
    func everyRefundReversed() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let now = Date()
            let payload = TestApple.transaction("2300011")
            try await http.notifyAppleTaken(try await apple.notification("ONE_TIME_CHARGE", transaction: payload))
            for at in [-400.0, -200.0] {
                var revoked = payload
                revoked.revocationDate = now.addingTimeInterval(at).millisecondsSince1970
                try await http.notifyAppleTaken(try await apple.notification("REFUND", transaction: revoked, signedDate: now.addingTimeInterval(at)))
            }
            // The reversal of the second refund, then the late one of the first.
            for at in [-100.0, -300.0] {
                try await http.notifyAppleTaken(try await apple.notification("REFUND_REVERSED", transaction: payload, signedDate: now.addingTimeInterval(at)))
            }
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '2300011'", as: String.self) == "unmatched")
        }
    }

    @Test("a notification whose token finds an order ties the transaction to it")
    func notificationMatchesByToken() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-notified"))
            let token = UUID(uuidString: created["appAccountToken"] as? String ?? "")
            try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("2000003", appAccountToken: token)))
            let (_, order) = try await http.send(.get, "/v1/orders/o-notified")
            #expect(order["state"] as? String == "verified")
            #expect((order["events"] as? [[String: Any]])?.map { $0["type"] as? String } == ["created", "receipt-received", "verified", "notification-received"])
        }
    }

    @Test("a forged or malformed notification is a 400 and changes nothing")
    func forgedNotification() async throws {
        try await withReceiptsApplication(apple) { http, db in
            let count = try await eventCount(db)
            let forger = try TestApple()
            let (status, answer) = try await http.notifyApple(try await forger.notification("REFUND", transaction: TestApple.transaction("2000004")))
            #expect(status == .badRequest && errorOf(answer)["code"] as? String == "invalid-certificate-chain")
            let (missing, _) = try await http.send(.post, "/v1/notifications/apple", json: ["nothing": true], key: .some(nil))
            #expect(missing == .badRequest)
            #expect(try await eventCount(db) == count)
        }
    }

    @Test("legacy receipts: matched by claimed id; 21005 retry-later and 21003 rejected leave the order as it was; no claimed id processes every transaction")
    func legacyReceipts() async throws {
        let purchase = Date().millisecondsSince1970 - 60_000
        let standIn = VerifyReceiptStandIn(answers: [
            "production:OK": VerifyReceiptStandIn.valid(transactions: [("3000001", "gems.100", purchase)]),
            "production:BUSY": .json(#"{"status": 21005}"#),
            "production:FAKE": .json(#"{"status": 21003}"#),
            "production:MANY": VerifyReceiptStandIn.valid(transactions: [("3000002", "gems.500", purchase), ("3000003", "gems.100", purchase + 1), ("3000004", "gems.100", purchase + 2)]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, db in
                for id in ["o-ok", "o-busy", "o-fake", "o-many"] { try await http.send(.post, "/v1/orders", json: newOrder(id)) }
                let (_, ok) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-ok", "transactionId": "3000001", "receiptData": "OK"])
                #expect(ok["outcome"] as? String == "matched" && ok["state"] as? String == "verified")
                let (_, missing) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-ok", "transactionId": "9999", "receiptData": "OK"])
                #expect(missing["outcome"] as? String == "rejected" && missing["reason"] as? String == "transaction-not-in-receipt")
                #expect(missing["finishTransaction"] as? Bool == false)

                let (_, busy) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-busy", "receiptData": "BUSY"])
                #expect(busy["outcome"] as? String == "retry-later" && busy["appleStatus"] as? Int == 21005)
                let (_, fake) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-fake", "receiptData": "FAKE"])
                #expect(fake["outcome"] as? String == "rejected" && fake["appleStatus"] as? Int == 21003)
                for id in ["o-busy", "o-fake"] {
                    let (_, order) = try await http.send(.get, "/v1/orders/\(id)")
                    #expect(order["state"] as? String == "created" && order["version"] as? Int == 0)
                }

                let (_, many) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "orderId": "o-many", "receiptData": "MANY"])
                #expect(many["outcome"] as? String == "matched" && many["transactionId"] as? String == "3000003")
                #expect((many["transactions"] as? [[String: Any]])?.map { $0["outcome"] as? String } == ["unmatched", "matched", "unmatched"])
                #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE user_id = 'u-1'", as: Int.self) == 2)
                let count = try await eventCount(db)
                let (_, again) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "orderId": "o-many", "receiptData": "MANY"])
                #expect(again["outcome"] as? String == "matched" && again["transactionId"] as? String == "3000003")
                #expect(try await eventCount(db) == count)
            }
        }
    }

    @Test("a legacy receipt naming its order alone: the earliest purchase made after the order pays it; an older one of the product, and a later one, wait in the pool")
    func legacyReceiptWithAnOlderPurchase() async throws {
        let now = Date().millisecondsSince1970
        let standIn = VerifyReceiptStandIn(answers: [
            // Apple lists a receipt's purchases oldest first: one of the product a month ago, then today's.
            "production:BOTH": VerifyReceiptStandIn.valid(transactions: [
                ("3000011", "gems.100", now - 30 * 86_400_000), ("3000014", "gems.100", now - 30_000), ("3000012", "gems.100", now - 60_000),
            ]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox) { http, db in
                try await http.send(.post, "/v1/orders", json: newOrder("o-both", user: "u-both"))
                let (_, both) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-both", "receiptData": "BOTH"])
                #expect(both["outcome"] as? String == "matched" && both["transactionId"] as? String == "3000012" && both["state"] as? String == "verified", "\(both)")
                // The earliest bought after the order pays it; the older one and the later one wait
                // in the pool (the answer lists them by purchase date).
                #expect((both["transactions"] as? [[String: Any]])?.map { $0["transactionId"] as? String } == ["3000011", "3000012", "3000014"], "\(both)")
                #expect((both["transactions"] as? [[String: Any]])?.map { $0["outcome"] as? String } == ["unmatched", "matched", "unmatched"], "\(both)")
                #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id IN ('3000011', '3000014')", as: Int.self) == 2)
                let (_, again) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-both", "receiptData": "BOTH"])
                #expect(again["outcome"] as? String == "matched" && again["transactionId"] as? String == "3000012", "\(again)")
            }
        }
    }

    @Test("after receipts, pool entries, refunds and notifications, a rebuild equals the inline projections")
    func projectionsVerify() async throws {
        try await withReceiptsApplication(apple) { http, db in
            for index in 0..<6 { try await http.send(.post, "/v1/orders", json: newOrder("p-\(index)", user: "u-\(index % 2)")) }
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("p-token"))
            let token = UUID(uuidString: created["appAccountToken"] as? String ?? "")
            try await http.send(.post, "/v1/receipts", json: ["orderId": "p-0", "signedTransaction": try await apple.sign(TestApple.transaction("4000000"))])
            try await http.send(.post, "/v1/receipts", json: ["signedTransaction": try await apple.sign(TestApple.transaction("4000001", appAccountToken: token))])
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": try await apple.sign(TestApple.transaction("4000002"))])
            try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "orderId": "p-1", "signedTransaction": try await apple.sign(TestApple.transaction("4000002"))])
            try await http.send(.post, "/v1/receipts", json: ["orderId": "p-2", "signedTransaction": try await apple.sign(TestApple.transaction("4000003", product: "other"))])
            try await http.send(.post, "/v1/receipts", json: ["orderId": "p-3", "signedTransaction": try await apple.sign(TestApple.transaction("4000000"))])
            try await http.send(.post, "/v1/orders/p-0/events", json: ["type": "delivered", "data": [:]])
            try await http.notifyApple(try await apple.notification("REFUND", transaction: TestApple.transaction("4000000")))
            try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("4000004")))
            try await http.notifyApple(try await apple.notification("REVOKE", transaction: TestApple.transaction("4000004")))
            try await http.notifyApple(try await apple.notification("TEST", transaction: nil))
            let rebuilder = ProjectionRebuilder(database: db.database)
            #expect(try await rebuilder.verify() == [])
            try await rebuilder.rebuild()
            #expect(try await rebuilder.verify() == [])
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions", as: Int.self) == 5)
        }
    }
}
