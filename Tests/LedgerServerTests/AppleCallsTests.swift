import AppleReceipts
import AppStoreStandIn
import Foundation
import HTTPTypes
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore
import LedgerTestSupport
import NIOCore
import Testing

/// A configuration that trusts `apple`'s test chain, as the test servers do.
func trusting(_ apple: TestApple) -> LedgerConfiguration {
    var configuration = LedgerConfiguration()
    configuration.apple.rootCertificateFiles = [apple.rootFile]
    configuration.apple.bundleID = TestApple.bundleId
    configuration.apple.environments = [.sandbox]
    return configuration
}

/// The ledger's services on `db`, as a second server in the same process has them (a writer of
/// their own).
func secondServer(_ db: TestDatabase) -> ServiceAssembly {
    ServiceAssembly(database: Database(client: db.client, logger: TestServer.logger))
}

/// A server's calls to Apple on `db`, made to the stand-in at `base`, with `switches`.
func appleCalls(
    _ standIn: AppStoreServerStandIn, _ base: String, _ db: TestDatabase, switches: AppleCallQueue.Switches, timeout: TimeAmount = .seconds(30)
) -> AppleCalls {
    var configuration = LedgerConfiguration()
    configuration.appleCalls = switches
    var calls = configuration.appleCalls(
        secondServer(db), api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base, timeout: timeout), logger: TestServer.logger))
    calls.backoff = 30
    return calls
}

/// Passes until the feed has read every event committed before the call (the gap-safe position
/// may lag behind: the test cluster's other suites hold transactions open too), 30 s at most.
func drain(_ calls: AppleCalls, _ db: TestDatabase) async throws -> AppleCalls.Summary {
    let target = try await scalar(db, "SELECT max(global_position) FROM events", as: Int64.self) ?? 0
    var total = AppleCalls.Summary()
    for _ in 0..<300 {
        let summary = try await calls.run()
        total.queued += summary.queued
        total.calls.merge(summary.calls, uniquingKeysWith: +)
        if try await scalar(db, "SELECT read_to FROM apple_call_feed", as: Int64.self) ?? 0 >= target { break }
        try await Task.sleep(for: .milliseconds(100))
    }
    return total
}

@Suite("Calls to Apple the log calls for: consumption answers, finish after delivery, token after pairing")
struct AppleCallsTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    func withCallsApplication(_ test: @Sendable @escaping (LedgerHTTP, TestDatabase, String) async throws -> Void) async throws {
        try await withAppleAPIApplication(apple, standIn, configure: { configuration in
            configuration.appleCallsInterval = 0
            configuration.backfillNotificationsAtStart = false
            configuration.refundCatchUpInterval = 0
        }, test)
    }

    /// An order of `product` holding transaction `id`, verified.
    func verifiedOrder(_ http: LedgerHTTP, _ order: String, _ id: String, product: String = "gems.100") async throws -> SignedTransactionPayload {
        try await http.send(.post, "/v1/orders", json: newOrder(order, product: product))
        let transaction = TestApple.transaction(id, product: product)
        let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": order, "signedTransaction": try await apple.sign(transaction)])
        #expect(answer["state"] as? String == "verified")
        return transaction
    }

    /// The consumption bodies sent, by transaction id.
    func consumptionBodies() async -> [String: [String: Any]] {
        var bodies: [String: [String: Any]] = [:]
        for write in await standIn.writes where write.path.hasPrefix("/inApps/v2/transactions/consumption/") {
            bodies[String(write.path.split(separator: "/").last ?? "")] =
                (try? JSONSerialization.jsonObject(with: Data(write.body.utf8))) as? [String: Any] ?? [:]
        }
        return bodies
    }

    @Test("each CONSUMPTION_REQUEST is answered once from the ledger's facts: the body field by field for a delivered order and each failure reason")
    func consumptionAnswers() async throws {
        try await withCallsApplication { http, db, base in
            let (catalog, product) = try await http.send(.put, "/v1/products/gems.100", json: ["sampleContentProvided": true, "refundPreference": "DECLINE"])
            #expect(catalog == .ok && product["refundPreference"] as? String == "DECLINE" && product["sampleContentProvided"] as? Bool == true)
            let (badPreference, refusal) = try await http.send(.put, "/v1/products/gems.100", json: ["refundPreference": "MAYBE"])
            #expect(badPreference == .badRequest && (errorOf(refusal)["message"] as? String ?? "").contains("refundPreference"))
            try await http.send(.put, "/v1/products/gems.100", json: ["sampleContentProvided": true, "refundPreference": "DECLINE"])

            // Delivered, with how much of it was consumed.
            let delivered = try await verifiedOrder(http, "c-delivered", "8200001")
            let (tooMuch, error) = try await http.send(.post, "/v1/orders/c-delivered/events", json: ["type": "delivered", "data": ["consumptionPercentage": 100_001]])
            #expect(tooMuch == .badRequest && (errorOf(error)["message"] as? String ?? "").contains("consumptionPercentage"))
            let (fraction, fractionError) = try await http.send(.post, "/v1/orders/c-delivered/events", json: ["type": "delivered", "data": ["consumptionPercentage": 0.5]])
            #expect(fraction == .badRequest && errorOf(fractionError)["code"] as? String == "invalid-input" && errorOf(fractionError)["field"] as? String == "consumptionPercentage",
                    "\(fractionError)")
            // Written as a JSON number with a fraction, as some encoders write every number: the
            // ledger takes it (a whole number) and must read it back as one.
            let written = try await http.client.execute(
                uri: "/v1/orders/c-delivered/events", method: .post,
                headers: [.contentType: "application/json", .authorization: "Bearer \(http.key)"],
                body: ByteBuffer(string: #"{"type": "delivered", "data": {"consumptionPercentage": 25000.0}}"#))
            #expect(written.status == .created)
            // Failed after verification, by reason; one verified and never delivered; one of a product the catalog does not describe.
            let reasons = ["server-outage": "UNDELIVERED_SERVER_OUTAGE", "quality-issue": "UNDELIVERED_QUALITY_ISSUE",
                           "product-mismatch": "UNDELIVERED_WRONG_ITEM", "cancelled": "UNDELIVERED_OTHER"]
            var requests: [(String, SignedTransactionPayload)] = [("8200001", delivered)]
            for (index, reason) in reasons.keys.sorted().enumerated() {
                let id = "82001\(index)0"
                requests.append((id, try await verifiedOrder(http, "c-\(reason)", id)))
                try await http.send(.post, "/v1/orders/c-\(reason)/events", json: ["type": "failed", "data": ["reason": reason]])
            }
            requests.append(("8200002", try await verifiedOrder(http, "c-verified", "8200002")))
            requests.append(("8200003", try await verifiedOrder(http, "c-other-product", "8200003", product: "coins.5")))
            // A transaction the ledger never saw: pooled by the request itself.
            requests.append(("8200004", TestApple.transaction("8200004")))

            var uuids: [String: UUID] = [:]
            for (id, transaction) in requests {
                let uuid = UUID()
                uuids[id] = uuid
                _ = try await http.notifyAppleTaken(try await apple.notification(
                    "CONSUMPTION_REQUEST", uuid: uuid, transaction: transaction, consumptionRequestReason: "UNINTENDED_PURCHASE"))
            }
            // Apple sends one again: applied once.
            let again = try await http.notifyAppleTaken(try await apple.notification(
                "CONSUMPTION_REQUEST", uuid: uuids["8200001"]!, transaction: delivered, consumptionRequestReason: "UNINTENDED_PURCHASE"))
            #expect(again["applied"] as? Bool == false)

            let calls = appleCalls(standIn, base, db, switches: .init(consumption: true))
            let summary = try await drain(calls, db)
            #expect(summary.calls == ["consumption sent": requests.count], "\(summary)")
            let bodies = await consumptionBodies()
            #expect(bodies.count == requests.count)
            #expect(await standIn.writes.count == requests.count, "each request answered once")

            let answered = bodies["8200001"] ?? [:]
            #expect(answered["customerConsented"] as? Bool == true)
            #expect(answered["deliveryStatus"] as? String == "DELIVERED")
            #expect(answered["sampleContentProvided"] as? Bool == true)
            #expect(answered["refundPreference"] as? String == "DECLINE")
            #expect(answered["consumptionPercentage"] as? Int == 25_000)
            #expect(answered.count == 5, "\(answered)")
            for (index, reason) in reasons.keys.sorted().enumerated() {
                let body = bodies["82001\(index)0"] ?? [:]
                #expect(body["deliveryStatus"] as? String == reasons[reason], "\(reason): \(body)")
                #expect(body["customerConsented"] as? Bool == true && body["consumptionPercentage"] as? Int == 0, "not delivered: 0, as Apple asks")
                #expect(body["sampleContentProvided"] as? Bool == true && body["refundPreference"] as? String == "DECLINE")
            }
            #expect(bodies["8200002"]?["deliveryStatus"] as? String == "UNDELIVERED_OTHER")
            // Apple requires sampleContentProvided: the documented default, false, for a product the catalog does not describe.
            let uncatalogued = bodies["8200003"] ?? [:]
            #expect(uncatalogued["sampleContentProvided"] as? Bool == false && uncatalogued["refundPreference"] == nil && uncatalogued["consumptionPercentage"] as? Int == 0 && uncatalogued.count == 4, "\(uncatalogued)")
            #expect(bodies["8200004"]?["deliveryStatus"] as? String == "UNDELIVERED_OTHER")

            // Recorded where the request was, after it: on the order's stream, or the pooled transaction's.
            let (_, order) = try await http.send(.get, "/v1/orders/c-delivered")
            let events = order["events"] as? [[String: Any]] ?? []
            #expect(events.suffix(2).map { $0["type"] as? String } == ["notification-received", "consumption-answer"])
            #expect((events.suffix(2).first?["data"] as? [String: Any])?["consumptionRequestReason"] as? String == "UNINTENDED_PURCHASE")
            let answer = events.last?["data"] as? [String: Any] ?? [:]
            #expect(answer["outcome"] as? String == "sent" && answer["deliveryStatus"] as? String == "DELIVERED" && answer["attempts"] as? Int == 1)
            #expect((answer["notificationUUID"] as? String)?.lowercased() == uuids["8200001"]!.uuidString.lowercased())
            #expect(order["state"] as? String == "delivered", "an answer changes no state")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'transaction-8200004' AND type = 'consumption-answer'", as: Int.self) == 1)
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '8200004'", as: Int.self) == 1,
                    "an answer leaves a pooled transaction in the pool (promise 8)")

            // Nothing is sent twice: another pass, and the same request again, call for nothing.
            _ = try await http.notifyAppleTaken(try await apple.notification(
                "CONSUMPTION_REQUEST", uuid: uuids["8200002"]!, transaction: requests[5].1, consumptionRequestReason: "UNINTENDED_PURCHASE"))
            let later = try await drain(calls, db)
            let writesAfter = await standIn.writes.count
            #expect(later.calls.isEmpty && writesAfter == requests.count)

            // The app's refund preference where the product has none; the product's comes first.
            let (patched, app) = try await http.send(.patch, "/v1/apps/\(TestApple.bundleId)", json: ["refundPreference": "GRANT_FULL"])
            #expect(patched == .ok && app["refundPreference"] as? String == "GRANT_FULL", "\(app)")
            for (id, product) in [("8200005", "coins.5"), ("8200006", "gems.100")] {
                let transaction = try await verifiedOrder(http, "c-app-\(id)", id, product: product)
                _ = try await http.notifyAppleTaken(try await apple.notification(
                    "CONSUMPTION_REQUEST", transaction: transaction, consumptionRequestReason: "UNINTENDED_PURCHASE"))
            }
            let appLevel = try await drain(calls, db)
            #expect(appLevel.calls == ["consumption sent": 2], "\(appLevel)")
            let withApp = await consumptionBodies()
            #expect(withApp["8200005"]?["refundPreference"] as? String == "GRANT_FULL", "the app's: \(withApp["8200005"] ?? [:])")
            #expect(withApp["8200006"]?["refundPreference"] as? String == "DECLINE", "the product's: \(withApp["8200006"] ?? [:])")

            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation")
            let totals = report["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["consumptionAnswered"] as? Int == requests.count + 2, "\(totals)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    @Test("consumption answers Apple takes: sampleContentProvided always sent, GRANT_PRORATED only with a share consumed, else the preference it comes to, recorded with why")
    func consumptionAnswersAppleTakes() async throws {
        try await withCallsApplication { http, db, base in
            try await http.send(.put, "/v1/products/gems.prorated", json: ["sampleContentProvided": true, "refundPreference": "GRANT_PRORATED"])
            // The catalog says nothing of a sample: the default (false) is sent, and the answer says it was defaulted.
            try await http.send(.put, "/v1/products/gems.unsaid", json: ["refundPreference": "DECLINE"])
            // (delivered consumptionPercentage or nil when not delivered, failed reason) -> (refundPreference, consumptionPercentage, preferenceAdjusted)
            let cases: [(id: String, product: String, consumed: Int??, failed: String?, preference: String?, percentage: Int?, adjusted: String?)] = [
                ("8250001", "gems.prorated", .some(40_000), nil, "GRANT_PRORATED", 40_000, nil),
                ("8250002", "gems.prorated", .some(0), nil, "GRANT_FULL", 0, "nothing-consumed"),
                ("8250003", "gems.prorated", .some(100_000), nil, "DECLINE", 100_000, "fully-consumed"),
                ("8250004", "gems.prorated", .some(nil), nil, nil, nil, "no-consumption-percentage"),
                ("8250005", "gems.prorated", nil, "server-outage", "GRANT_FULL", 0, "not-delivered"),
                ("8250006", "gems.prorated", nil, nil, "GRANT_FULL", 0, "not-delivered"),
                ("8250007", "gems.unsaid", .some(10_000), nil, "DECLINE", 10_000, nil),
            ]
            for item in cases {
                let transaction = try await verifiedOrder(http, "p-\(item.id)", item.id, product: item.product)
                if let consumed = item.consumed {
                    let data: [String: Any] = consumed.map { ["consumptionPercentage": $0] } ?? [:]
                    try await http.send(.post, "/v1/orders/p-\(item.id)/events", json: ["type": "delivered", "data": data])
                }
                if let reason = item.failed {
                    try await http.send(.post, "/v1/orders/p-\(item.id)/events", json: ["type": "failed", "data": ["reason": reason]])
                }
                _ = try await http.notifyAppleTaken(try await apple.notification("CONSUMPTION_REQUEST", transaction: transaction, consumptionRequestReason: "UNINTENDED_PURCHASE"))
            }
            let summary = try await drain(appleCalls(standIn, base, db, switches: .init(consumption: true)), db)
            #expect(summary.calls == ["consumption sent": cases.count], "every answer taken by a stand-in that refuses what Apple refuses: \(summary)")
            let bodies = await consumptionBodies()
            for item in cases {
                let body = bodies[item.id] ?? [:]
                #expect(body["customerConsented"] as? Bool == true && body["sampleContentProvided"] as? Bool == (item.product == "gems.prorated"), "\(item.id): \(body)")
                #expect(body["refundPreference"] as? String == item.preference && body["consumptionPercentage"] as? Int == item.percentage, "\(item.id): \(body)")
                let (_, order) = try await http.send(.get, "/v1/orders/p-\(item.id)")
                let answer = (order["events"] as? [[String: Any]])?.last?["data"] as? [String: Any] ?? [:]
                #expect(answer["outcome"] as? String == "sent" && answer["preferenceAdjusted"] as? String == item.adjusted, "\(item.id): \(answer)")
                #expect(answer["refundPreference"] as? String == item.preference && answer["consumptionPercentage"] as? Int == item.percentage, "\(item.id): \(answer)")
                #expect(answer["sampleContentDefaulted"] as? Bool == (item.product == "gems.unsaid" ? true : nil), "\(item.id): \(answer)")
            }
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    @Test("a refused consumption answer shows Apple's errorCode on the order's stream and in dashboards.apple_calls, beside the calls still to make")
    func refusalsWhereSupportLooks() async throws {
        try await withCallsApplication { http, db, base in
            let calls = appleCalls(standIn, base, db, switches: .init(consumption: true))
            let refused = try await verifiedOrder(http, "r-refused", "8260001")
            _ = try await http.notifyAppleTaken(try await apple.notification("CONSUMPTION_REQUEST", transaction: refused))
            await standIn.queue([.refused(status: 400, errorCode: 4000185)])
            #expect(try await drain(calls, db).calls == ["consumption refused": 1])
            let (_, order) = try await http.send(.get, "/v1/orders/r-refused")
            let answer = (order["events"] as? [[String: Any]])?.last?["data"] as? [String: Any] ?? [:]
            #expect(answer["outcome"] as? String == "refused" && answer["appleErrorCode"] as? Int == 4000185 && answer["error"] as? String == "apple-api-refused", "\(answer)")

            let limited = try await verifiedOrder(http, "r-limited", "8260002")
            _ = try await http.notifyAppleTaken(try await apple.notification("CONSUMPTION_REQUEST", transaction: limited))
            await standIn.queue([.tooManyRequests(after: .seconds(120))])
            #expect(try await drain(calls, db).calls == ["consumption retrying": 1])

            let rows = try await db.client.query(
                "SELECT transaction_id, order_id, attempts, apple_error_code, outcome FROM dashboards.apple_calls ORDER BY transaction_id",
                logger: TestServer.logger)
            var seen: [String: (String?, Int, Int?, String?)] = [:]
            for try await (transaction, order, attempts, code, outcome) in rows.decode((String, String?, Int, Int?, String?).self) {
                seen[transaction] = (order, attempts, code, outcome)
            }
            #expect(seen["8260001"]?.0 == "r-refused" && seen["8260001"]?.2 == 4000185 && seen["8260001"]?.3 == "refused", "\(seen)")
            #expect(seen["8260002"]?.1 == 1 && seen["8260002"]?.3 == nil, "still to make: \(seen)")
            #expect(seen.count == 2, "\(seen)")
        }
    }

    @Test("consumption answers wait out Apple's faults within the 12 hours: Retry-After honoured, 500s retried, a refusal recorded, too late recorded, no consent no call")
    func consumptionFaults() async throws {
        try await withCallsApplication { http, db, base in
            let calls = appleCalls(standIn, base, db, switches: .init(consumption: true))
            // No consent: the request is recorded, nothing is queued or sent.
            let unconsented = try await verifiedOrder(http, "f-0", "8300000")
            _ = try await http.notifyAppleTaken(try await apple.notification("CONSUMPTION_REQUEST", transaction: unconsented))
            let silent = appleCalls(standIn, base, db, switches: .init())
            _ = try await drain(silent, db)
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) == 0)

            // Rate-limited beyond the client's longest wait: the call waits until Apple's Retry-After.
            let limited = try await verifiedOrder(http, "f-1", "8300001")
            _ = try await http.notifyAppleTaken(try await apple.notification("CONSUMPTION_REQUEST", transaction: limited))
            await standIn.queue([.tooManyRequests(after: .seconds(120))])
            let first = try await drain(calls, db)
            #expect(first.calls == ["consumption retrying": 1], "\(first)")
            let wait = try await scalar(db, "SELECT extract(epoch FROM due_at - now())::float8 FROM apple_calls WHERE transaction_id = '8300001'", as: Double.self)
            #expect((wait ?? 0) > 110, "not before Apple's Retry-After: \(wait ?? -1) s")
            #expect(try await calls.run().calls.isEmpty, "not due yet")
            // Time passes: due now; Apple answers 500 more times than the client retries, then takes it.
            try await db.client.query("UPDATE apple_calls SET due_at = now()", logger: TestServer.logger)
            await standIn.queue(Array(repeating: .serverError, count: 4))
            let second = try await calls.run()
            #expect(second.calls == ["consumption retrying": 1], "\(second)")
            let backoff = try await scalar(db, "SELECT extract(epoch FROM due_at - now())::float8 FROM apple_calls WHERE transaction_id = '8300001'", as: Double.self)
            #expect((backoff ?? 0) > 50 && (backoff ?? 0) < 70, "backoff 30 s doubled after the second try: \(backoff ?? -1) s")
            try await db.client.query("UPDATE apple_calls SET due_at = now()", logger: TestServer.logger)
            await standIn.queue([.slow(.seconds(3))])
            let third = try await calls.run()
            #expect(third.calls == ["consumption sent": 1], "\(third)")
            let (_, order) = try await http.send(.get, "/v1/orders/f-1")
            let answer = (order["events"] as? [[String: Any]])?.last?["data"] as? [String: Any] ?? [:]
            #expect(answer["outcome"] as? String == "sent" && answer["attempts"] as? Int == 3, "\(answer)")

            // Apple refuses it: recorded with Apple's code, not tried again.
            let refused = try await verifiedOrder(http, "f-2", "8300002")
            _ = try await http.notifyAppleTaken(try await apple.notification("CONSUMPTION_REQUEST", transaction: refused))
            await standIn.queue([.refused(status: 400, errorCode: 4000183)])
            let refusal = try await drain(calls, db)
            #expect(refusal.calls == ["consumption refused": 1], "\(refusal)")
            let (_, refusedOrder) = try await http.send(.get, "/v1/orders/f-2")
            let refusedAnswer = (refusedOrder["events"] as? [[String: Any]])?.last?["data"] as? [String: Any] ?? [:]
            #expect(refusedAnswer["outcome"] as? String == "refused" && refusedAnswer["appleErrorCode"] as? Int == 4000183, "\(refusedAnswer)")

            // Signed 13 hours ago: Apple no longer waits; recorded too late, never sent.
            let stale = try await verifiedOrder(http, "f-3", "8300003")
            _ = try await http.notifyAppleTaken(try await apple.notification("CONSUMPTION_REQUEST", transaction: stale, signedDate: Date(timeIntervalSinceNow: -13 * 3600)))
            let late = try await drain(calls, db)
            #expect(late.calls == ["consumption too-late": 1], "\(late)")
            // (Counted by path: an earlier slow answer the client gave up on may still land now.)
            let lateWrites = await standIn.writes.filter { $0.path.hasSuffix("/8300003") }
            #expect(lateWrites.isEmpty, "\(lateWrites)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) == 0)

            let (_, json) = try await http.send(.get, "/v1/reports/reconciliation")
            let totals = json["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["consumptionAnswered"] as? Int == 1 && totals["consumptionFailed"] as? Int == 1 && totals["consumptionTooLate"] as? Int == 1, "\(totals)")
        }
    }

    @Test("finish after delivery and token after pairing: off by default, once each when on, never before delivery, a refusal recorded and not retried")
    func finishAndToken() async throws {
        try await withCallsApplication { http, db, base in
            let off = appleCalls(standIn, base, db, switches: .init())
            let calls = appleCalls(standIn, base, db, switches: .init(finishAfterDelivery: true, setTokenAfterPairing: true))
            // Off by default: a delivery made while the switches are off is never finished at Apple.
            _ = try await verifiedOrder(http, "d-off", "8400000")
            try await http.send(.post, "/v1/orders/d-off/events", json: ["type": "delivered", "data": [:]])
            #expect(try await drain(off, db).calls.isEmpty)

            _ = try await verifiedOrder(http, "d-1", "8400001")
            _ = try await verifiedOrder(http, "d-2", "8400002")
            try await http.send(.post, "/v1/orders/d-1/events", json: ["type": "delivered", "data": [:]])
            await standIn.queue(Array(repeating: .serverError, count: 4))
            let first = try await drain(calls, db)
            #expect(first.calls == ["finish retrying": 1], "\(first)")
            try await db.client.query("UPDATE apple_calls SET due_at = now()", logger: TestServer.logger)
            let second = try await calls.run()
            #expect(second.calls == ["finish sent": 1], "\(second)")
            let finishes = await standIn.writes.filter { $0.path.hasSuffix("/finish") }.map(\.path)
            #expect(finishes == ["/inApps/v1/transactions/8400001/finish"], "only the delivered order, once: \(finishes)")
            let recorded = try await scalar(db, "SELECT data->>'outcome' FROM events WHERE stream_id = 'apple-calls-8400001' AND type = 'apple-transaction-finished'", as: String.self)
            #expect(recorded == "sent")
            let (_, order) = try await http.send(.get, "/v1/orders/d-1")
            #expect(order["version"] as? Int == 3, "the order's own stream is not written")

            // Late pairings: the reconciler's sets the order's token; support's is refused (family shared).
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("t-1", user: "u-t"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            let (_, pooled) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-t", "signedTransaction": try await apple.sign(TestApple.transaction("8400003"))])
            #expect(pooled["outcome"] as? String == "unmatched")
            let (_, pass) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(pass["paired"] as? Int == 1)
            try await http.send(.post, "/v1/orders", json: newOrder("t-2", user: "u-t2"))
            _ = try await http.send(.post, "/v1/receipts", json: ["userId": "u-t2", "signedTransaction": try await apple.sign(TestApple.transaction("8400004"))])
            let (matched, _) = try await http.send(.post, "/v1/transactions/8400004/match", json: ["orderId": "t-2", "reason": "customer e-mail"])
            #expect(matched == .ok)
            await standIn.refuseAccountToken("8400004", errorCode: 4000185)
            let third = try await drain(calls, db)
            #expect(third.calls == ["set-token sent": 1, "set-token refused": 1], "\(third)")
            let tokens = await standIn.writes.filter { $0.path.hasSuffix("/appAccountToken") }
            #expect(tokens.map(\.path) == ["/inApps/v1/transactions/8400003/appAccountToken"])
            #expect(tokens.first?.body.contains(token.uuidString.lowercased()) == true)
            let refusal = try await scalar(db, "SELECT (data->>'appleErrorCode')::int FROM events WHERE stream_id = 'apple-calls-8400004'", as: Int.self)
            #expect(refusal == 4000185)
            #expect(try await calls.run().calls.isEmpty, "a refusal is not tried again")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) == 0)
        }
    }

    @Test("a call whose lease ran out while Apple held the one before it is left to the server that took it: made once")
    func leaseRunsOutInABatch() async throws {
        try await withCallsApplication { http, db, base in
            for (order, id) in [("l-1", "8500001"), ("l-2", "8500002")] {
                _ = try await verifiedOrder(http, order, id)
                try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "delivered", "data": [:]])
            }
            var slow = appleCalls(standIn, base, db, switches: .init(finishAfterDelivery: true), timeout: .seconds(120))
            slow.lease = 1
            let other = appleCalls(standIn, base, db, switches: .init(finishAfterDelivery: true))
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) == 0)
            // The feed reads up to the gap-safe position, which other suites' open transactions may hold back.
            for _ in 0..<300 where try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) != 2 {
                _ = try await other.queue.catchUp(.init(finishAfterDelivery: true))
                try await Task.sleep(for: .milliseconds(100))
            }
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_calls", as: Int.self) == 2)
            // The slow server takes both and Apple holds its first call; both leases run out.
            await standIn.queue([.held])
            async let first = slow.run()
            let holding = try await standIn.untilHolding()
            #expect(holding == 1, "the first call reached Apple within 2 minutes")
            for _ in 0..<600 where try await scalar(db, "SELECT count(*)::int FROM leases WHERE name LIKE 'apple-call/%' AND expires_at > now()", as: Int.self) != 0 {
                try await Task.sleep(for: .milliseconds(50))
            }
            // Another server takes both and makes them; then Apple answers the held one.
            let taken = try await other.run()
            #expect(taken.calls == ["finish sent": 2], "\(taken)")
            await standIn.release()
            let slowSummary = try await first
            #expect(slowSummary.calls == ["finish sent": 1], "only the call it had in flight: \(slowSummary)")
            let finishes = await standIn.writes.filter { $0.path.hasSuffix("/finish") }.map(\.path)
            #expect(finishes.filter { $0.contains("8500002") }.count == 1, "the second call made once: \(finishes)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id LIKE 'apple-calls-85000%'", as: Int.self) == 2, "each recorded once")
        }
    }

    @Test("a client cannot append consumption-answer: refused, naming who records it, and nothing is stored")
    func clientsCannotAnswer() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("answer-by-client"))
            let before = try await eventCount(db)
            let (status, error) = try await http.send(.post, "/v1/orders/answer-by-client/events", json: [
                "type": "consumption-answer",
                "data": ["notificationUUID": UUID().uuidString, "transactionId": "1", "outcome": "sent", "deliveryStatus": "DELIVERED",
                         "customerConsented": true, "attempts": 1],
            ])
            #expect(status == .badRequest && errorOf(error)["code"] as? String == "unknown-event-type")
            #expect((errorOf(error)["message"] as? String ?? "").contains("consumption request"))
            #expect(try await eventCount(db) == before)
        }
    }
}
