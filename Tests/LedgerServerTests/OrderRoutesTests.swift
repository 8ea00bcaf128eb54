import Foundation
import NIOCore
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerTestSupport
import Testing

@Suite("Order routes over HTTP")
struct OrderRoutesTests {
    @Test("a JSON body in UTF-16 or UTF-32, with or without a byte order mark, is 400 naming the encoding, and nothing is stored")
    func bodiesAreUTF8() async throws {
        try await withLiveApplication { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-utf"))
            let events = try await eventCount(db)
            // A number of 42 significant digits, which the ledger refuses in UTF-8 rather than round it.
            let text = #"{"type":"payment-added","data":{"queuedAt":"2026-11-29T10:00:00Z","amountMicros":123456789012345678901234567890123456789123}}"#
            for (name, encoding) in [("UTF-16", String.Encoding.utf16), ("UTF-16LE", .utf16LittleEndian), ("UTF-16BE", .utf16BigEndian), ("UTF-32LE", .utf32LittleEndian)] {
                let bytes = try #require(text.data(using: encoding))
                let response = try await http.client.execute(
                    uri: "/v1/orders/o-utf/events", method: .post,
                    headers: [.contentType: "application/json", .authorization: "Bearer \(http.key)"], body: ByteBuffer(bytes: bytes))
                let error = errorOf(json(response.body))
                #expect(response.status == .badRequest && error["field"] as? String == "body", "\(name): \(error)")
                #expect((error["message"] as? String)?.contains("UTF-8") == true, "\(name): \(error)")
            }
            #expect(try await eventCount(db) == events)
            let (utf8, refused) = try await http.send(.post, "/v1/orders/o-utf/events", raw: text)
            #expect(utf8 == .badRequest && errorOf(refused)["field"] as? String == "data.amountMicros", "\(refused)")
        }
    }

    @Test("creating is idempotent on orderId: 201, then 200 with the same order, 409 for a different body")
    func createIdempotent() async throws {
        try await withLiveApplication { http, _ in
            let (status, order) = try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            #expect(status == .created)
            #expect(order["state"] as? String == "created")
            #expect(order["version"] as? Int == 0)
            #expect(order["finishTransaction"] as? Bool == false)
            let token = try #require(order["appAccountToken"] as? String)
            #expect(UUID(uuidString: token) != nil)
            #expect((order["events"] as? [[String: Any]])?.count == 1)

            var again = newOrder("o-1")
            again["price"] = "0.990"
            let (retryStatus, retried) = try await http.send(.post, "/v1/orders", json: again)
            #expect(retryStatus == .ok)
            #expect(retried["appAccountToken"] as? String == token)
            #expect((retried["events"] as? [[String: Any]])?.count == 1)

            let (conflict, error) = try await http.send(.post, "/v1/orders", json: newOrder("o-1", user: "u-2"))
            #expect(conflict == .conflict)
            #expect(errorOf(error)["code"] as? String == "order-exists")

            let given = "6f1c2a4e-0000-4000-8000-000000000042"
            var withToken = newOrder("o-2")
            withToken["appAccountToken"] = given
            let (_, second) = try await http.send(.post, "/v1/orders", json: withToken)
            #expect(second["appAccountToken"] as? String == given)
            var reused = newOrder("o-3")
            reused["appAccountToken"] = given
            let (taken, takenError) = try await http.send(.post, "/v1/orders", json: reused)
            #expect(taken == .conflict)
            #expect(errorOf(takenError)["code"] as? String == "app-account-token-taken")
        }
    }

    @Test("events go through the state machine; a refusal names the state and the allowed types")
    func stateMachineOverHTTP() async throws {
        try await withLiveApplication { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            let (refused, error) = try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "delivered", "data": [:]])
            #expect(refused == .conflict)
            #expect(errorOf(error)["code"] as? String == "transition-not-allowed")
            #expect(errorOf(error)["state"] as? String == "created")
            #expect(errorOf(error)["allowed"] as? [String] == ["payment-added", "receipt-received", "failed"])

            let steps: [(String, [String: Any], String, Bool)] = [
                ("payment-added", ["queuedAt": "2026-11-21T09:59:00Z"], "payment-added", false),
                ("receipt-received", receipt("2000001"), "receipt-received", false),
                ("verified", ["environment": "Production"], "verified", false),
                ("delivered", [:], "delivered", true),
                ("finished", [:], "finished", true),
            ]
            for (version, (type, data, state, finish)) in steps.enumerated() {
                let (status, order) = try await http.send(.post, "/v1/orders/o-1/events", json: ["type": type, "data": data])
                #expect(status == .created, "\(type)")
                #expect(order["state"] as? String == state)
                #expect(order["version"] as? Int == version + 1)
                #expect(order["finishTransaction"] as? Bool == finish)
                if type == "receipt-received" {
                    // The ledger's own types (pairing-undone) are not offered to a client.
                    let (early, earlyError) = try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "finished", "data": [:]])
                    #expect(early == .conflict && errorOf(earlyError)["allowed"] as? [String] == ["verified", "failed"], "\(earlyError)")
                    #expect(!(errorOf(earlyError)["message"] as? String ?? "").contains("pairing-undone"), "\(earlyError)")
                }
            }
            let (readStatus, order) = try await http.send(.get, "/v1/orders/o-1")
            #expect(readStatus == .ok)
            #expect(order["transactionId"] as? String == "2000001")
            let events = try #require(order["events"] as? [[String: Any]])
            #expect(events.map { $0["type"] as? String } == ["created", "payment-added", "receipt-received", "verified", "delivered", "finished"])
            #expect(events.map { $0["version"] as? Int } == [0, 1, 2, 3, 4, 5])
            #expect((events[1]["metadata"] as? [String: Any])?["requestId"] != nil)

            let (closed, closedError) = try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "failed", "data": ["reason": "cancelled"]])
            #expect(closed == .conflict)
            #expect(errorOf(closedError)["allowed"] as? [String] == ["refunded"])
        }
    }

    @Test("retries with the same eventId answer the first result; another body is a 409; expectedVersion is checked")
    func idempotentEventsAndVersions() async throws {
        try await withLiveApplication { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            let event: [String: Any] = ["type": "payment-added", "eventId": "6f1c2a4e-0000-4000-8000-0000000000aa",
                                        "expectedVersion": 0, "data": ["queuedAt": "2026-11-21T09:59:00Z"]]
            let (first, _) = try await http.send(.post, "/v1/orders/o-1/events", json: event)
            #expect(first == .created)
            for _ in 0..<3 {
                let (again, order) = try await http.send(.post, "/v1/orders/o-1/events", json: event)
                #expect(again == .ok)
                #expect(order["version"] as? Int == 1)
            }
            // After the order moved on, a retry still answers the first result: the order as
            // that event left it.
            try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "failed", "data": ["reason": "cancelled"]])
            let (late, lateOrder) = try await http.send(.post, "/v1/orders/o-1/events", json: event)
            #expect(late == .ok)
            #expect(lateOrder["state"] as? String == "payment-added")
            #expect(lateOrder["version"] as? Int == 1)
            let (_, now) = try await http.send(.get, "/v1/orders/o-1")
            #expect(now["state"] as? String == "failed")
            var changed = event
            changed["data"] = ["queuedAt": "2026-11-21T10:59:00Z"]
            let (conflict, error) = try await http.send(.post, "/v1/orders/o-1/events", json: changed)
            #expect(conflict == .conflict)
            #expect(errorOf(error)["code"] as? String == "event-id-conflict")

            let stale: [String: Any] = ["type": "receipt-received", "expectedVersion": 0, "data": receipt("2000002")]
            let (staleStatus, staleError) = try await http.send(.post, "/v1/orders/o-1/events", json: stale)
            #expect(staleStatus == .conflict)
            #expect(errorOf(staleError)["code"] as? String == "wrong-expected-version")
            #expect(errorOf(staleError)["currentVersion"] as? Int == 2)
            #expect(try await db.store.readStream(try .init("order-o-1")).count == 3)
        }
    }

    @Test("a retry is the same body whatever its layout: data cut out as written and data written again compare as JSON")
    func retriesCompareAsJSON() async throws {
        try await withLiveApplication { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-layout"))
            let eventID = "6f1c2a4e-0000-4000-8000-0000000000bb"
            // Plain (the data is stored as written), then with an escape (parsed and written
            // again) and other spacing and key order: one body.
            let first = #"{"type":"payment-added","eventId":"\#(eventID)","data":{"queuedAt":"2026-11-21T09:59:00Z","note":"a2"}}"#
            let again = #"{ "eventId" : "\#(eventID)", "type" : "payment-added", "data" : { "note" : "a\u0032", "queuedAt" : "2026-11-21T09:59:00Z" } }"#
            let other = #"{"type":"payment-added","eventId":"\#(eventID)","data":{"queuedAt":"2026-11-21T09:59:00Z","note":"a3"}}"#
            let (created, _) = try await http.send(.post, "/v1/orders/o-layout/events", raw: first)
            #expect(created == .created)
            let (retried, order) = try await http.send(.post, "/v1/orders/o-layout/events", raw: again)
            #expect(retried == .ok)
            #expect(order["version"] as? Int == 1)
            let (conflict, error) = try await http.send(.post, "/v1/orders/o-layout/events", raw: other)
            #expect(conflict == .conflict)
            #expect(errorOf(error)["code"] as? String == "event-id-conflict")
        }
    }

    @Test("32 concurrent conflicting appends to one order: exactly one is accepted")
    func concurrentConflictingAppends() async throws {
        try await withLiveApplication { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            let statuses = try await withThrowingTaskGroup(of: HTTPResponse.Status.self) { group in
                for index in 0..<32 {
                    group.addTask {
                        try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "receipt-received", "data": receipt("300\(index)")]).0
                    }
                }
                return try await group.reduce(into: [HTTPResponse.Status]()) { $0.append($1) }
            }
            #expect(statuses.filter { $0 == .created }.count == 1)
            #expect(statuses.filter { $0 == .conflict }.count == 31)
            let events = try await db.store.readStream(try .init("order-o-1"))
            #expect(events.map(\.type) == ["created", "receipt-received"])
        }
    }

    @Test("an Apple transaction belongs to one order only")
    func transactionClaimedOnce() async throws {
        try await withLiveApplication { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-2", user: "u-2"))
            let (first, _) = try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "receipt-received", "data": receipt("2000001")])
            #expect(first == .created)
            let (second, error) = try await http.send(.post, "/v1/orders/o-2/events", json: ["type": "receipt-received", "data": receipt("2000001")])
            #expect(second == .conflict)
            #expect(errorOf(error)["code"] as? String == "duplicate-transaction")
            let (_, order) = try await http.send(.get, "/v1/orders/o-2")
            #expect(order["state"] as? String == "created")
        }
    }

    @Test("20 orders racing for one Apple transaction: exactly one gets it")
    func racingClaims() async throws {
        try await withLiveApplication { http, db in
            for index in 0..<20 { try await http.send(.post, "/v1/orders", json: newOrder("o-\(index)", user: "u-\(index)")) }
            let answers = try await withThrowingTaskGroup(of: (Int, HTTPResponse.Status).self) { group in
                for index in 0..<20 {
                    group.addTask {
                        (index, try await http.send(.post, "/v1/orders/o-\(index)/events", json: ["type": "receipt-received", "data": receipt("2000000042")]).0)
                    }
                }
                return try await group.reduce(into: [Int: HTTPResponse.Status]()) { $0[$1.0] = $1.1 }
            }
            let winners = answers.filter { $0.value == .created }.map(\.key)
            #expect(winners.count == 1)
            #expect(answers.values.filter { $0 == .conflict }.count == 19)
            let rows = try await db.client.query(
                "SELECT order_id FROM apple_transactions WHERE transaction_id = '2000000042'", logger: TestServer.logger)
            var owners: [String] = []
            for try await owner in rows.decode(String.self) { owners.append(owner) }
            #expect(owners == winners.map { "o-\($0)" })
            let claimed = try await db.client.query(
                "SELECT count(*) FROM events WHERE type = 'receipt-received'", logger: TestServer.logger)
            for try await count in claimed.decode(Int.self) { #expect(count == 1) }
        }
    }

    @Test("searching: by user, product and state (open), paged")
    func search() async throws {
        try await withLiveApplication { http, _ in
            for index in 1...5 { try await http.send(.post, "/v1/orders", json: newOrder("o-\(index)")) }
            try await http.send(.post, "/v1/orders", json: newOrder("o-other", user: "u-2"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-6", product: "coins.5"))
            try await http.send(.post, "/v1/orders/o-2/events", json: ["type": "failed", "data": ["reason": "cancelled"]])

            let (_, open) = try await http.send(.get, "/v1/orders?userId=u-1&productId=gems.100&state=open")
            let ids = (open["orders"] as? [[String: Any]])?.compactMap { $0["orderId"] as? String }
            #expect(ids == ["o-1", "o-3", "o-4", "o-5"])
            let (_, page) = try await http.send(.get, "/v1/orders?userId=u-1&limit=2")
            #expect((page["orders"] as? [[String: Any]])?.count == 2)
            let next = try #require(page["next"] as? String)
            let (_, rest) = try await http.send(.get, "/v1/orders?userId=u-1&limit=10&after=\(next)")
            #expect((rest["orders"] as? [[String: Any]])?.count == 4)
            let (_, failed) = try await http.send(.get, "/v1/orders?state=failed")
            #expect((failed["orders"] as? [[String: Any]])?.compactMap { $0["orderId"] as? String } == ["o-2"])
        }
    }

    @Test("the metadata of an appended event names the request id as the client sent it, quotes and backslashes included")
    func metadataKeepsRequestID() async throws {
        try await withLiveApplication { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-meta"))
            let requestID = #"r"1\x"#
            let headers: HTTPFields = [.contentType: "application/json", .authorization: "Bearer \(http.key)", .init("X-Request-Id")!: requestID]
            let body = ByteBuffer(string: #"{"type":"payment-added","data":{"queuedAt":"2026-11-21T09:59:00Z"}}"#)
            let response = try await http.client.execute(uri: "/v1/orders/o-meta/events", method: .post, headers: headers, body: body)
            #expect(response.status == .created)
            let (_, order) = try await http.send(.get, "/v1/orders/o-meta")
            let metadata = (order["events"] as? [[String: Any]])?.last?["metadata"] as? [String: Any]
            #expect(metadata?["requestId"] as? String == requestID)
        }
    }

    @Test("order ids that a path must escape are reached percent-encoded")
    func escapedOrderIDs() async throws {
        try await withLiveApplication { http, _ in
            let (created, _) = try await http.send(.post, "/v1/orders", json: newOrder("a b/c?d"))
            #expect(created == .created)
            let (status, order) = try await http.send(.get, "/v1/orders/a%20b%2Fc%3Fd")
            #expect(status == .ok)
            #expect(order["orderId"] as? String == "a b/c?d")
            let (appended, _) = try await http.send(.post, "/v1/orders/a%20b%2Fc%3Fd/events", json: ["type": "failed", "data": ["reason": "cancelled"]])
            #expect(appended == .created)
            let (stream, events) = try await http.send(.get, "/v1/streams/order-a%20b%2Fc%3Fd/events")
            #expect(stream == .ok)
            #expect((events["events"] as? [[String: Any]])?.count == 2)
        }
    }

    @Test("an event's data is kept as sent: cut out of the body as written, or written again from the parsed body where a key has an escape")
    func dataKeptAsSent() async throws {
        try await withLiveApplication { http, _ in
            let bodies = [
                // Spaces, non-ASCII text, nesting, a number with a fraction, a field the event
                // type does not know: cut out as written.
                ("o-plain", #"{ "type" : "payment-added", "data" : { "queuedAt" : "2026-11-21T09:59:00Z", "note" : "über 5 €", "nested" : {"a":[1, 2.5, {"b":null}]} } }"#),
                // Escapes in values: cut out as written too.
                ("o-escaped", #"{"type":"payment-added","data":{"queuedAt":"2026-11-21T09:59:00Z","note":"line\nbreak \"quoted\" \u00fc"}}"#),
                // An escape in a key: written again from the parsed object.
                ("o-key", #"{"type":"payment-added","data":{"queuedAt":"2026-11-21T09:59:00Z","n\u006fte":"x"}}"#),
            ]
            for (id, body) in bodies {
                try await http.send(.post, "/v1/orders", json: newOrder(id))
                let (status, _) = try await http.send(.post, "/v1/orders/\(id)/events", raw: body)
                #expect(status == .created)
                let sent = try #require((jsonObject(Data(body.utf8)) as? [String: Any])?["data"] as? NSObject)
                let (_, order) = try await http.send(.get, "/v1/orders/\(id)")
                let stored = (order["events"] as? [[String: Any]])?.last?["data"] as? NSObject
                #expect(stored == sent, "\(id): \(String(describing: stored)) vs \(sent)")
            }
            // A number Decimal cannot hold is refused with a 400 naming it, on either path.
            try await http.send(.post, "/v1/orders", json: newOrder("o-huge"))
            for body in [#"{"type":"payment-added","data":{"queuedAt":"2026-11-21T09:59:00Z","x":1e200}}"#,
                         #"{"type":"payment-added","data":{"queuedAt":"2026-11-21T09:59:00Z","a":1,"a":2,"x":1e200}}"#] {
                let (status, error) = try await http.send(.post, "/v1/orders/o-huge/events", raw: body)
                #expect(status == .badRequest, "\(body): \(error)")
                #expect((errorOf(error)["message"] as? String)?.contains("data") == true, "\(error)")
            }
            // One it can hold is stored with its value.
            let (small, _) = try await http.send(.post, "/v1/orders/o-huge/events", raw: #"{"type":"payment-added","data":{"queuedAt":"2026-11-21T09:59:00Z","x":1.5e2}}"#)
            #expect(small == .created)
            let (_, huge) = try await http.send(.get, "/v1/orders/o-huge")
            #expect(((huge["events"] as? [[String: Any]])?.last?["data"] as? [String: Any])?["x"] as? Double == 150)
        }
    }

    @Test("a creation's token and quantity: generated and defaulted when absent or null, kept when given, whatever the body's layout")
    func creationDefaults() async throws {
        try await withLiveApplication { http, _ in
            let given = "6f1c2a4e-0000-4000-8000-0000000000a1"
            let bodies: [(String, String, quantity: Int, token: String?)] = [
                ("c-absent", #"{"orderId":"c-absent","userId":"u","productId":"p"}"#, 1, nil),
                ("c-spaced", "  \n { \"orderId\" : \"c-spaced\" , \"userId\" : \"u\", \"productId\":\"p\" }  ", 1, nil),
                ("c-null", #"{"orderId":"c-null","userId":"u","productId":"p","quantity":null,"appAccountToken":null}"#, 1, nil),
                ("c-decimal", #"{"orderId":"c-decimal","userId":"u","productId":"p","quantity":2.0}"#, 2, nil),
                ("c-given", #"{"userId":"u","productId":"p","quantity":3,"appAccountToken":"\#(given)","orderId":"c-given"}"#, 3, given),
                ("c-token-only", #"{"orderId":"c-token-only","userId":"u","productId":"p","appAccountToken":"\#(given.replacingOccurrences(of: "a1", with: "a2"))"}"#, 1, given.replacingOccurrences(of: "a1", with: "a2")),
            ]
            var tokens: Set<String> = []
            for (id, body, quantity, token) in bodies {
                let (status, order) = try await http.send(.post, "/v1/orders", raw: body)
                #expect(status == .created, "\(id): \(order)")
                #expect(order["orderId"] as? String == id)
                #expect(order["quantity"] as? Int == quantity, "\(id)")
                let answered = try #require(order["appAccountToken"] as? String)
                #expect(UUID(uuidString: answered) != nil && answered == answered.lowercased())
                if let token { #expect(answered == token) }
                tokens.insert(answered)
                // The stored event holds the same fields as the order, and no orderId.
                let created = try #require((order["events"] as? [[String: Any]])?.first?["data"] as? [String: Any])
                #expect(created["appAccountToken"] as? String == answered && created["quantity"] as? Int == quantity)
                #expect(created["orderId"] == nil)
            }
            #expect(tokens.count == bodies.count, "every order has its own token")
            // A key given twice is refused by name: which value the client meant cannot be known
            // (Foundation's decoder would keep the first, PostgreSQL's jsonb the last).
            let twice = #"{"orderId":"c-twice","userId":"u","productId":"p","price":"0.99","quantity":2.0,"price":"9.99","quantity":null}"#
            let (twiceStatus, twiceError) = try await http.send(.post, "/v1/orders", raw: twice)
            #expect(twiceStatus == .badRequest && errorOf(twiceError)["field"] as? String == "price", "\(twiceError)")
            let (absent, _) = try await http.send(.get, "/v1/orders/c-twice")
            #expect(absent == .notFound, "nothing stored")
            let (wrong, error) = try await http.send(.post, "/v1/orders", raw: #"{"orderId":"c-bad","userId":"u","productId":"p","quantity":"two"}"#)
            #expect(wrong == .badRequest)
            #expect((errorOf(error)["message"] as? String)?.contains("quantity") == true)
        }
    }

    @Test("the feed and stream routes read the log")
    func feedAndStream() async throws {
        try await withLiveApplication { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-2"))
            var feed: [[String: Any]] = []
            // Other tests' open transactions on the shared cluster hold the gap-safe feed back: `feedVisibilityPatience`.
            let deadline = ContinuousClock.now + feedVisibilityPatience
            while feed.count < 2, ContinuousClock.now < deadline {
                let (_, page) = try await http.send(.get, "/v1/events?after=0&limit=10")
                feed = page["events"] as? [[String: Any]] ?? []
                if feed.count < 2 { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(feed.compactMap { $0["streamId"] as? String } == ["order-o-1", "order-o-2"])
            let first = try #require(feed.first?["position"] as? Int)
            let (_, after) = try await http.send(.get, "/v1/events?after=\(first)")
            #expect((after["events"] as? [[String: Any]])?.count == 1)
            let (_, stream) = try await http.send(.get, "/v1/streams/order-o-1/events")
            #expect((stream["events"] as? [[String: Any]])?.first?["type"] as? String == "created")
        }
    }

    @Test("ids are their bytes: one that starts with a combining mark is an order like any other; a user spelled otherwise is another user")
    func idsAreBytes() async throws {
        try await withLiveApplication { http, _ in
            // "order-" and a leading U+0301 make one Character: the order's stream is an order's all the same.
            let (created, order) = try await http.send(.post, "/v1/orders", json: newOrder("\u{301}abc"))
            #expect(created == .created && order["state"] as? String == "created", "\(order)")
            let (paid, afterPayment) = try await http.send(.post, "/v1/orders/%CC%81abc/events", json: ["type": "payment-added", "data": ["queuedAt": "2026-11-01T10:00:00Z"]])
            #expect(paid == .created, "\(afterPayment)")
            #expect(afterPayment["state"] as? String == "payment-added", "\(afterPayment)")
            let (read, stored) = try await http.send(.get, "/v1/orders/%CC%81abc")
            #expect(read == .ok && (stored["events"] as? [[String: Any]])?.count == 2, "\(stored)")
            // The same order again with its user in another normal form: not the same fields.
            try await http.send(.post, "/v1/orders", json: newOrder("o-nfc", user: "caf\u{E9}"))
            let (again, refused) = try await http.send(.post, "/v1/orders", json: newOrder("o-nfc", user: "cafe\u{301}"))
            #expect(again == .conflict && errorOf(refused)["code"] as? String == "order-exists", "\(refused)")
            // A leading byte-order mark is part of an id in a path or a query, not dropped.
            try await http.send(.post, "/v1/orders", json: newOrder("\u{FEFF}bom", user: "\u{FEFF}u-bom"))
            try await http.send(.post, "/v1/orders", json: newOrder("bom", user: "u-bom"))
            let (failed, _) = try await http.send(.post, "/v1/orders/%EF%BB%BFbom/events", json: ["type": "failed", "data": ["reason": "test"]])
            #expect(failed == .created)
            let (_, plain) = try await http.send(.get, "/v1/orders/bom")
            let (_, marked) = try await http.send(.get, "/v1/orders/%EF%BB%BFbom")
            #expect(plain["state"] as? String == "created" && marked["state"] as? String == "failed", "\(plain) \(marked)")
            let (_, found) = try await http.send(.get, "/v1/orders?userId=%EF%BB%BFu-bom")
            // (Foundation's JSONSerialization, reading the answer here, drops the mark: told by state.)
            #expect((found["orders"] as? [[String: Any]])?.map { $0["state"] as? String } == ["failed"], "\(found)")
            let (badEscape, _) = try await http.send(.get, "/v1/orders/%FFbom")
            #expect(badEscape == .badRequest)
        }
    }

    @Test("bad input is a 4xx naming the problem, never a 500")
    func badInput() async throws {
        try await withLiveApplication { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            let long = String(repeating: "x", count: 129)
            let cases: [(HTTPRequest.Method, String, Any?, String?, HTTPResponse.Status, String, String?)] = [
                (.post, "/v1/orders", nil, "{\"orderId\":", .badRequest, "invalid-json", nil),
                (.post, "/v1/orders", nil, "", .badRequest, "invalid-json", nil),
                (.post, "/v1/orders", ["x"], nil, .badRequest, "invalid-json", nil),
                (.post, "/v1/orders", ["userId": "u", "productId": "p"], nil, .badRequest, "invalid-input", "orderId"),
                (.post, "/v1/orders", ["orderId": 5, "userId": "u", "productId": "p"], nil, .badRequest, "invalid-input", "orderId"),
                (.post, "/v1/orders", ["orderId": "", "userId": "u", "productId": "p"], nil, .badRequest, "invalid-input", "orderId"),
                (.post, "/v1/orders", ["orderId": long, "userId": "u", "productId": "p"], nil, .badRequest, "invalid-input", "orderId"),
                // An id padded with white space is another than the one a client sends: refused.
                (.post, "/v1/orders", ["orderId": " o-pad ", "userId": "u", "productId": "p"], nil, .badRequest, "invalid-input", "orderId"),
                (.post, "/v1/orders", ["orderId": "o-pad", "userId": "   ", "productId": "p"], nil, .badRequest, "invalid-input", "userId"),
                (.post, "/v1/orders", ["orderId": "o-pad", "userId": "u", "productId": "gems.100\u{A0}"], nil, .badRequest, "invalid-input", "productId"),
                // And so where a user or product is first named for what is stored under it.
                (.post, "/v1/receipts", ["userId": " u", "signedTransaction": "x.y.z"], nil, .badRequest, "invalid-input", "userId"),
                (.post, "/v1/users/u%20/app-transaction", ["signedAppTransaction": "x.y.z"], nil, .badRequest, "invalid-input", "userId"),
                (.put, "/v1/products/%20gems.100", ["status": "active"], nil, .badRequest, "invalid-input", "productId"),
                (.post, "/v1/recover", ["userId": "u\u{A0}"], nil, .badRequest, "invalid-input", "userId"),
                (.post, "/v1/orders", ["orderId": "o-9", "productId": "p"], nil, .badRequest, "invalid-input", "userId"),
                (.post, "/v1/orders", ["orderId": "o-9", "userId": "u", "productId": "p", "quantity": "2"], nil, .badRequest, "invalid-input", "quantity"),
                (.post, "/v1/orders", ["orderId": "o-9", "userId": "u", "productId": "p", "quantity": 2.5], nil, .badRequest, "invalid-input", "quantity"),
                (.post, "/v1/orders", ["orderId": "o-9", "userId": "u", "productId": "p", "price": 0.99], nil, .badRequest, "invalid-input", "price"),
                // A misspelt member is refused by name, never dropped: the order would carry a token the client does not.
                (.post, "/v1/orders", ["orderId": "o-9", "userId": "u", "productId": "p", "appAcountToken": UUID().uuidString], nil, .badRequest, "invalid-input", "appAcountToken"),
                (.post, "/v1/orders", ["orderId": "o-9", "userId": "u", "productId": "p", "eventId": UUID().uuidString], nil, .badRequest, "invalid-input", "eventId"),
                (.post, "/v1/orders/o-1/events", ["type": "finished", "eventID": UUID().uuidString, "data": [:]], nil, .badRequest, "invalid-input", "eventID"),
                (.post, "/v1/receipts", ["userId": "u", "orderID": "o-1", "signedTransaction": "x.y.z"], nil, .badRequest, "invalid-input", "orderID"),
                // A member given twice, at the top or in `data`: which value was meant cannot be known.
                (.post, "/v1/orders", nil, #"{"orderId":"o-9","userId":"u","productId":"p","userId":"v"}"#, .badRequest, "invalid-input", "userId"),
                (.post, "/v1/orders/o-1/events", nil, #"{"type":"failed","data":{"reason":"a","reason":"b"}}"#, .badRequest, "invalid-input", "data.reason"),
                // Data too deep to be answered again, numbers Decimal would round or cannot hold.
                (.post, "/v1/orders/o-1/events", nil, #"{"type":"failed","data":{"reason":"r","x":"# + String(repeating: "[", count: 510) + String(repeating: "]", count: 510) + "}}",
                 .badRequest, "invalid-input", "data.x"),
                (.post, "/v1/orders/o-1/events", nil, #"{"type":"failed","data":{"reason":"r","n":1111111111111111111111111111111111111111}}"#, .badRequest, "invalid-input", "data.n"),
                (.post, "/v1/orders", nil, #"{"orderId":"o-9","userId":"u","productId":"p","quantity":1e400}"#, .badRequest, "invalid-input", "quantity"),
                // What PostgreSQL cannot store as text, named by its member rather than left to the database.
                (.post, "/v1/orders/o-1/events", nil, #"{"type":"failed","data":{"reason":"r","x":"a\u0000"}}"#, .badRequest, "invalid-input", "data.x"),
                (.post, "/v1/orders/o-1/events", nil, #"{"type":"failed","data":{"reason":"r","x":"\ud800"}}"#, .badRequest, "invalid-input", "data.x"),
                (.post, "/v1/notifications/apple", nil, "signedPayload=eyJ0eXAiOiJKV1Qi1234567890123456789012345678901234567890", .badRequest, "invalid-json", nil),
                (.post, "/v1/orders/o-1/events", ["data": [:]], nil, .badRequest, "invalid-input", "type"),
                (.post, "/v1/orders/o-1/events", ["type": "teleported", "data": [:]], nil, .badRequest, "unknown-event-type", nil),
                (.post, "/v1/orders/o-1/events", ["type": "payment-added", "data": ["queuedAt": "soon"]], nil, .badRequest, "invalid-input", "queuedAt"),
                // The reports count a purchase under Apple's two environments alone.
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("e-1").merging(["environment": "Staging"]) { $1 }], nil, .badRequest, "invalid-input", "data.environment"),
                (.post, "/v1/orders/o-1/events", ["type": "verified", "data": ["environment": "Xcode"]], nil, .badRequest, "invalid-input", "data.environment"),
                // Apple's ids as Apple never writes them: kept apart from Apple's own, which would be granted again.
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("7075100180001 ")], nil, .badRequest, "invalid-input", "data.transactionId"),
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("7.00471509000800E+12")], nil, .badRequest, "invalid-input", "data.transactionId"),
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("e-2").merging(["originalTransactionId": " 70751"]) { $1 }], nil, .badRequest, "invalid-input", "data.originalTransactionId"),
                (.post, "/v1/orders/o-1/events", ["type": "verified", "data": ["transactionId": "\u{A0}7075100180001"]], nil, .badRequest, "invalid-input", "data.transactionId"),
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("007")], nil, .badRequest, "invalid-input", "data.transactionId"),
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("+77019")], nil, .badRequest, "invalid-input", "data.transactionId"),
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("\u{FF17}\u{FF17}")], nil, .badRequest, "invalid-input", "data.transactionId"),
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("e-3").merging(["originalTransactionId": ""]) { $1 }], nil, .badRequest, "invalid-input", "data.originalTransactionId"),
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("e-4").merging(["appTransactionId": ""]) { $1 }], nil, .badRequest, "invalid-input", "data.appTransactionId"),
                // A purchase the App Store cannot have made: the reports would date a sale by it.
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("e-5").merging(["purchaseDate": "9999-12-31T23:59:59Z"]) { $1 }], nil, .badRequest, "invalid-input", "data.purchaseDate"),
                (.post, "/v1/orders/o-1/events", ["type": "receipt-received", "data": receipt("e-6").merging(["purchaseDate": "1970-01-01T00:00:00Z"]) { $1 }], nil, .badRequest, "invalid-input", "data.purchaseDate"),
                (.post, "/v1/orders/o-1/events", ["type": "payment-added", "data": "x"], nil, .badRequest, "invalid-input", "data"),
                (.post, "/v1/orders/o-1/events", ["type": "finished", "eventId": "nope", "data": [:]], nil, .badRequest, "invalid-input", "eventId"),
                (.post, "/v1/orders/o-1/events", ["type": "finished", "expectedVersion": true, "data": [:]], nil, .badRequest, "invalid-input", "expectedVersion"),
                (.post, "/v1/orders/o-1/events", ["type": "finished", "expectedVersion": 1.5, "data": [:]], nil, .badRequest, "invalid-input", "expectedVersion"),
                (.post, "/v1/orders/\(long)/events", ["type": "finished", "data": [:]], nil, .badRequest, "invalid-input", "orderId"),
                (.post, "/v1/orders/o-missing/events", ["type": "finished", "data": [:]], nil, .notFound, "order-not-found", nil),
                (.get, "/v1/orders/o-missing", nil, nil, .notFound, "order-not-found", nil),
                (.get, "/v1/orders?limit=0", nil, nil, .badRequest, "invalid-input", "limit"),
                (.get, "/v1/orders?after=\(long)", nil, nil, .badRequest, "invalid-input", "after"),
                (.get, "/v1/transactions/unmatched?after=\(long)", nil, nil, .badRequest, "invalid-input", "after"),
                (.get, "/v1/orders?state=lost", nil, nil, .badRequest, "invalid-input", "state"),
                (.get, "/v1/events?after=x", nil, nil, .badRequest, "invalid-input", "after"),
                (.get, "/v1/events?limit=5000", nil, nil, .badRequest, "invalid-input", "limit"),
                // Days and times no calendar has are refused, never rolled over into the next ones.
                (.post, "/v1/orders/o-1/events", ["type": "payment-added", "data": ["queuedAt": "2026-11-31T10:00:00Z"]], nil, .badRequest, "invalid-input", "queuedAt"),
                (.post, "/v1/orders/o-1/events", ["type": "payment-added", "data": ["queuedAt": "2026-11-01T25:00:00Z"]], nil, .badRequest, "invalid-input", "queuedAt"),
                (.post, "/v1/orders/o-1/events", ["type": "payment-added", "data": ["queuedAt": "2025-02-29T10:00:00Z"]], nil, .badRequest, "invalid-input", "queuedAt"),
                // In year 10000 once in UTC: the ledger could not read it back.
                (.post, "/v1/orders/o-1/events", ["type": "payment-added", "data": ["queuedAt": "9999-12-31T23:00:00-05:00"]], nil, .badRequest, "invalid-input", "queuedAt"),
                (.get, "/v1/reports/reconciliation?to=2026-11-31", nil, nil, .badRequest, "invalid-input", "to"),
                (.get, "/v1/reports/reconciliation?from=2026-11-01T10:60:00Z", nil, nil, .badRequest, "invalid-input", "from"),
                (.get, "/v1/transactions/unmatched?from=2026-02-30T00:00:00Z", nil, nil, .badRequest, "invalid-input", "from"),
                (.get, "/v1/transactions/unmatched?from=2026-11-30T00:00:00Z&to=2026-11-01T00:00:00Z", nil, nil, .badRequest, "invalid-input", "to"),
            ]
            for (method, uri, body, raw, status, code, field) in cases {
                let (answer, json) = try await http.send(method, uri, json: body, raw: raw)
                #expect(answer == status, "\(method) \(uri) \(String(describing: body ?? raw as Any))")
                #expect(errorOf(json)["code"] as? String == code, "\(uri) \(String(describing: body ?? raw as Any)): \(json)")
                if let field { #expect(errorOf(json)["field"] as? String == field, "\(uri) \(String(describing: body)): \(json)") }
                #expect(errorOf(json)["message"] is String)
            }
            let (_, unknownType) = try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "teleported", "data": [:]])
            let allowed = errorOf(unknownType)["allowed"] as? [String] ?? []
            #expect(allowed.contains("payment-added") && !allowed.contains("created") && !allowed.contains("notification-received"),
                    "only the types a client may post: \(allowed)")
            for type in ["created", "notification-received", "pairing-undone", "consumption-answer"] {
                let (_, ledgers) = try await http.send(.post, "/v1/orders/o-1/events", json: ["type": type, "data": [:]])
                #expect(errorOf(ledgers)["code"] as? String == "unknown-event-type" && errorOf(ledgers)["allowed"] as? [String] == allowed,
                        "a type the ledger writes names those a client may post too: \(ledgers)")
            }
            let (_, badToken) = try await http.send(.post, "/v1/orders", json: ["orderId": "o-9", "userId": "u", "productId": "p", "appAccountToken": "token-1"])
            #expect(errorOf(badToken)["field"] as? String == "appAccountToken", "\(badToken)")
            #expect(errorOf(badToken)["message"] as? String == "appAccountToken must be a UUID (8-4-4-4-12 hexadecimal digits)", "Foundation's words are not the answer: \(badToken)")
            let (leap, _) = try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "payment-added", "data": ["queuedAt": "2024-02-29T10:00:00Z"]])
            #expect(leap == .created, "a leap day is a day")
            let (_, unknownMember) = try await http.send(.post, "/v1/orders", json: ["orderId": "o-9", "userId": "u", "productId": "p", "colour": 1])
            #expect((errorOf(unknownMember)["message"] as? String)?.contains("use orderId, userId, productId") == true, "the members it takes are named: \(unknownMember)")
            #expect(try await http.send(.get, "/v1/orders/o-9").0 == .notFound, "nothing of a refused body is stored")
            // Values only PostgreSQL refuses are still the caller's: 400, not 500.
            let (nul, nulError) = try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "failed", "data": ["reason": "x", "detail": "a\u{0}b"]])
            #expect(nul == .badRequest, "\(nulError)")
            let accented = String(repeating: "e\u{301}\u{301}", count: 100)
            let (combining, combiningError) = try await http.send(.post, "/v1/orders", json: newOrder(accented))
            #expect(combining == .badRequest)
            #expect(errorOf(combiningError)["field"] as? String == "orderId")
            let (ancient, ancientError) = try await http.send(.post, "/v1/orders/o-1/events", json: ["type": "payment-added", "data": ["queuedAt": "0001-06-01T00:00:00Z"]])
            #expect(ancient == .badRequest)
            #expect(errorOf(ancientError)["field"] as? String == "queuedAt")
            let big = "{\"orderId\":\"" + String(repeating: "a", count: 300_000) + "\"}"
            let (tooLarge, error) = try await http.send(.post, "/v1/orders", raw: big)
            #expect(tooLarge == .contentTooLarge)
            #expect(errorOf(error)["code"] as? String == "body-too-large")
            // A proof may be larger (a long subscriber's legacy receipt), up to 1 MiB.
            let receiptBody = #"{"userId":"u","receiptData":""# + String(repeating: "QUJD", count: 100_000) + "\"}"
            let (proof, proofAnswer) = try await http.send(.post, "/v1/receipts", raw: receiptBody)
            #expect(proof != .contentTooLarge, "\(proof) \(proofAnswer)")
            let (hugeProof, hugeAnswer) = try await http.send(.post, "/v1/receipts", raw: #"{"receiptData":""# + String(repeating: "QUJD", count: 300_000) + "\"}")
            #expect(hugeProof == .contentTooLarge && errorOf(hugeAnswer)["message"] as? String == "the body is larger than 1024 KiB", "\(hugeAnswer)")
            // Apple's environment in another case is refused too, naming Apple's spelling: the log
            // keeps data as sent, and a rebuild or the feed would read it so.
            try await http.send(.post, "/v1/orders", json: newOrder("o-env"))
            let claim = receipt("e-2").merging(["environment": "sandbox", "purchaseDate": ISO8601DateFormatter().string(from: Date())]) { $1 }
            let (spelled, spelledAnswer) = try await http.send(.post, "/v1/orders/o-env/events", json: ["type": "receipt-received", "data": claim])
            #expect(spelled == .badRequest && (errorOf(spelledAnswer)["message"] as? String ?? "").contains("write Sandbox"), "\(spelledAnswer)")
            let (exact, exactAnswer) = try await http.send(
                .post, "/v1/orders/o-env/events", json: ["type": "receipt-received", "data": claim.merging(["environment": "Sandbox"]) { $1 }])
            #expect(exact == .created, "\(exactAnswer)")
            #expect(try await http.send(.get, "/v1/orders/o-env").1["environment"] as? String == "Sandbox")
        }
    }
}

extension OrderRoutesTests {
    @Test("a query's + is a space, as every common client's encoder writes one; a time's unencoded +02:00 still reads")
    func plusInQueries() async throws {
        try await withLiveApplication { http, _ in
            for id in ["pg 1", "pg 2"] { try await http.send(.post, "/v1/orders", json: newOrder(id, user: "u p")) }
            // As Python's urlencode, URLSearchParams or http_build_query write the query.
            let (_, first) = try await http.send(.get, "/v1/orders?userId=u+p&limit=1")
            #expect((first["orders"] as? [[String: Any]])?.map { $0["orderId"] as? String } == ["pg 1"], "\(first)")
            #expect(first["next"] as? String == "pg 1", "\(first)")
            let (_, second) = try await http.send(.get, "/v1/orders?userId=u+p&limit=1&after=pg+1")
            #expect((second["orders"] as? [[String: Any]])?.map { $0["orderId"] as? String } == ["pg 2"], "\(second)")
            // A literal + is %2B.
            let (_, none) = try await http.send(.get, "/v1/orders?userId=u%2Bp")
            #expect((none["orders"] as? [[String: Any]])?.count == 0, "\(none)")
            for uri in ["/v1/reports/reconciliation?from=2026-01-01T00:00:00+02:00", "/v1/transactions/unmatched?from=2026-01-01T00:00:00+02:00"] {
                let (status, answer) = try await http.send(.get, uri)
                #expect(status == .ok, "\(uri): \(answer)")
            }
            // A name the route does not take is named as the client wrote it.
            let (refused, error) = try await http.send(.get, "/v1/orders?user+Id=x")
            #expect(refused == .badRequest && errorOf(error)["field"] as? String == "user Id", "\(error)")
        }
    }

    @Test("a price is answered at its creation as every later read shows it; one over 32 characters is refused by name")
    func priceAnsweredAsKept() async throws {
        try await withLiveApplication { http, _ in
            var body = newOrder("o-price")
            body["price"] = "000.990"
            let (status, created) = try await http.send(.post, "/v1/orders", json: body)
            #expect(status == .created && created["price"] as? String == "0.990", "\(created)")
            let (_, read) = try await http.send(.get, "/v1/orders/o-price")
            #expect(read["price"] as? String == "0.990", "\(read)")
            let (retried, again) = try await http.send(.post, "/v1/orders", json: body)
            #expect(retried == .ok && again["price"] as? String == "0.990", "\(again)")
            body["orderId"] = "o-price-long"
            body["price"] = String(repeating: "9", count: 33)
            let (refused, error) = try await http.send(.post, "/v1/orders", json: body)
            #expect(refused == .badRequest && (errorOf(error)["message"] as? String)?.contains("32 characters") == true, "\(error)")
        }
    }
}
