import Foundation
import LedgerCore
import LedgerJSON

import Testing

@Suite("The ledger's JSON: event bodies and times")
struct EventCodingTests {
    func decode(_ type: OrderEventType, _ json: String) throws(LedgerInputError) -> OrderEvent {
        try EventCoding.orderEvent(type, from: Data(json.utf8))
    }

    static let samples: [OrderEvent] = [
        .created(OrderCreated(userId: UserID(unchecked: "user \"quoted\" \\ é"), productId: ProductID(unchecked: "p/1"), quantity: 2, price: "4.99", currency: "EUR")),
        .paymentAdded(PaymentAdded(queuedAt: Date(timeIntervalSince1970: 1_800_000_000.25))),
        .receiptReceived(ReceiptReceived(
            transactionId: TransactionID(unchecked: "2000001"), productId: ProductID(unchecked: "gems.100"),
            purchaseDate: Date(timeIntervalSince1970: 1_800_000_000), receiptSha256: String(repeating: "a", count: 64), format: .jws,
            matchedBy: .appAccountToken, appAccountToken: UUID(), environment: "Sandbox")),
        .verified(Verified(transactionId: TransactionID(unchecked: "2000001"), environment: "Production")),
        .delivered, .finished, .refundReversed,
        .refunded(Refunded(
            revocationDate: Date(timeIntervalSince1970: 1_800_000_100), revocationReason: 1, revocationType: .refundProrated,
            revocationPercentage: 25_000, notificationType: "REFUND")),
        .refunded(Refunded(revocationDate: Date(timeIntervalSince1970: 1_800_000_100))),
        .failed(Failed(reason: "cancelled", detail: "by the user")),
        .pairingUndone(PairingUndone(transactionId: TransactionID(unchecked: "2000001"), reason: "wrong recipient", fromState: .receiptReceived)),
        .notificationReceived(NotificationReceived(
            notificationUUID: UUID(), notificationType: "CONSUMPTION_REQUEST", subtype: nil, transactionId: nil,
            signedDate: Date(timeIntervalSince1970: 1_800_000_000.5))),
    ]

    @Test("each type decodes from its wire fields")
    func decodesWireFields() throws {
        let created = try decode(.created, #"{"userId":"u1","productId":"gems.100","quantity":2,"price":"4.99","currency":"EUR","appAccountToken":"6f1c2a4e-0000-4000-8000-000000000001"}"#)
        guard case .created(let body) = created else { Issue.record("not created"); return }
        #expect(body.userId.rawValue == "u1")
        #expect(body.quantity == 2)
        #expect(body.price == "4.99")
        let queued = try decode(.paymentAdded, #"{"queuedAt":"2026-11-21T10:00:00.250Z"}"#)
        #expect(queued == .paymentAdded(PaymentAdded(queuedAt: try #require(EventCoding.parseDate("2026-11-21T10:00:00.250Z")))))
        #expect(try decode(.delivered, #"{"grantId":"g-1"}"#) == .delivered)
        #expect(try decode(.failed, #"{"reason":"cancelled"}"#) == .failed(Failed(reason: "cancelled")))
    }

    @Test("every event type as the ledger writes it reads back the same", arguments: samples)
    func roundTrip(event: OrderEvent) throws {
        let stored = try EventCoding.newEvent(event, id: EventID(), metadata: Data("{}".utf8))
        #expect(stored.type == event.type.rawValue)
        #expect(stored.data == (try EventCoding.encoder.encode(event)), "what the encoder writes, a body without fields too")
        #expect(stored.body == .order(event))
        #expect(try EventCoding.body(stream: OrderID(unchecked: "o-1").streamID, type: stored.type, data: stored.data) == .order(event))
        // The token is written in lower case, as the API shows it.
        if case .created(let body) = event {
            #expect(String(decoding: stored.data, as: UTF8.self).contains(body.appAccountToken.uuidString.lowercased()))
        }
    }

    @Test("streams other than orders' and transactions' hold events no projection reads")
    func opaqueBodies() throws {
        #expect(try EventCoding.body(stream: StreamID("proof-abc"), type: "proof-rejected", data: Data("{}".utf8)) == .opaque(type: "proof-rejected"))
        #expect(try EventCoding.body(stream: StreamID("order-o-1"), type: "no-such-type", data: Data("{}".utf8)) == .opaque(type: "no-such-type"))
    }

    @Test("a failure's reason with a control character is refused from a client, and still read from the log, which may hold one from before the rule")
    func controlCharacterInReason() throws {
        let body = #"{"reason":"card\tdeclined"}"#
        #expect(throws: LedgerInputError(field: "reason", problem: "contains a control character")) { try decode(.failed, body) }
        let stored = try EventCoding.body(stream: StreamID(unchecked: "order-o-1"), type: "failed", data: Data(body.utf8))
        #expect(stored == .order(.failed(Failed(reason: "card\tdeclined"))))
    }

    @Test("bad bodies are refused naming the field")
    func badBodies() {
        let cases: [(OrderEventType, String, String)] = [
            (.created, #"{"productId":"p","appAccountToken":"6f1c2a4e-0000-4000-8000-000000000001","quantity":1}"#, "userId"),
            (.created, #"{"userId":"","productId":"p","appAccountToken":"6f1c2a4e-0000-4000-8000-000000000001","quantity":1}"#, "userId"),
            (.created, #"{"userId":"u","productId":"p","appAccountToken":"6f1c2a4e-0000-4000-8000-000000000001","quantity":0}"#, "quantity"),
            (.created, #"{"userId":"u","productId":"p","appAccountToken":"6f1c2a4e-0000-4000-8000-000000000001","quantity":1,"price":"1,99"}"#, "price"),
            (.created, #"{"userId":"u","productId":"p","appAccountToken":"6f1c2a4e-0000-4000-8000-000000000001","quantity":1,"currency":"usd"}"#, "currency"),
            (.created, #"{"userId":"u","productId":"p","appAccountToken":"x","quantity":1}"#, "appAccountToken"),
            (.paymentAdded, #"{"queuedAt":"yesterday"}"#, "queuedAt"),
            (.paymentAdded, #"{"queuedAt":5}"#, "queuedAt"),
            (.failed, #"{"reason":""}"#, "reason"),
            (.failed, "[1,2]", "data"),
            (.delivered, "{not json", "data"),
            (.refunded, #"{"revocationDate":"2026-11-21T10:00:00Z","revocationPercentage":100001}"#, "revocationPercentage"),
            (.refunded, #"{"revocationDate":"2026-11-21T10:00:00Z","revocationPercentage":-1}"#, "revocationPercentage"),
            (.refunded, #"{"revocationDate":"2026-11-21T10:00:00Z","revocationType":"HALF","notificationType":"REFUND"}"#, "revocationType"),
        ]
        for (type, json, field) in cases {
            do {
                _ = try decode(type, json)
                Issue.record("accepted \(json)")
            } catch {
                #expect(error.field == field, "\(json): \(error)")
            }
        }
    }

    @Test("a refunded event stored before Apple's revocationType was read: its notification type moves to notificationType")
    func refundedOfBefore() throws {
        let stored = #"{"revocationDate":"2026-11-21T10:00:00.000Z","revocationReason":1,"revocationType":"REFUND"}"#
        let date = try #require(EventCoding.parseDate("2026-11-21T10:00:00Z"))
        let expected = OrderEvent.refunded(Refunded(revocationDate: date, revocationReason: 1, notificationType: "REFUND"))
        let stream = OrderID(unchecked: "o-1").streamID
        // Both readers of the log: Foundation's and the one the rebuild uses.
        #expect(try EventCoding.body(stream: stream, type: "refunded", data: Data(stored.utf8)) == .order(expected))
        #expect(try EventCoding.body(stream: stream, type: "refunded", text: stored) == .order(expected))
        let revoked = #"{"revocationDate":"2026-11-21T10:00:00Z","revocationType":"REVOKE"}"#
        #expect(try EventCoding.body(stream: stream, type: "refunded", text: revoked) == .order(.refunded(Refunded(revocationDate: date, notificationType: "REVOKE"))))
        // Written again, it takes the new shape: Apple's type absent (a full refund), the notification's under its own name.
        let written = try EventCoding.newEvent(expected, id: EventID(), metadata: Data("{}".utf8))
        #expect(String(decoding: written.data, as: UTF8.self) == #"{"notificationType":"REFUND","revocationDate":"2026-11-21T10:00:00.000Z","revocationReason":1}"#)
        // Apple's own names read as such.
        let now = #"{"revocationDate":"2026-11-21T10:00:00Z","revocationType":"REFUND_PRORATED","revocationPercentage":33333,"notificationType":"REFUND"}"#
        #expect(try decode(.refunded, now) == .refunded(Refunded(
            revocationDate: date, revocationType: .refundProrated, revocationPercentage: 33_333, notificationType: "REFUND")))
    }

    @Test("times: written in UTC with milliseconds, read with or without a fraction, in UTC or with an offset")
    func times() throws {
        let date = try #require(EventCoding.parseDate("2026-11-21T10:00:00.123+01:00"))
        #expect(EventCoding.formatDate(date) == "2026-11-21T09:00:00.123Z")
        #expect(EventCoding.parseDate("2026-11-21T10:00:00Z")?.timeIntervalSince1970 == 1_795_255_200)
        #expect(EventCoding.parseDate("2026-11-21T10:00:00.123456Z").map { abs($0.timeIntervalSince1970 - 1_795_255_200.123456) < 0.000_001 } == true)
        #expect(EventCoding.parseDate("2024-02-29T12:00:00-05:30")?.timeIntervalSince1970 == 1_709_227_800)
        for text in ["", "2026-11-21", "2026-11-21 10:00:00Z", "2026-13-01T10:00:00Z", "yesterday"] {
            #expect(EventCoding.parseDate(text) == nil, "\(text)")
        }
        for seconds in stride(from: 0.0, to: 4_000_000_000, by: 123_456_789.125) {
            let original = Date(timeIntervalSince1970: seconds)
            #expect(EventCoding.parseDate(EventCoding.formatDate(original)) == original)
        }
    }

    @Test("Apple's milliseconds are written as Apple signed them, never a millisecond early")
    func applesMilliseconds() throws {
        var wrong: [String] = []
        for ms in Int64(1_795_255_200_000)..<1_795_255_202_000 {
            // As a signed transaction's date is read: milliseconds since 1970, as a Date.
            let text = EventCoding.formatDate(Date(timeIntervalSince1970: Double(ms) / 1000))
            if !text.hasSuffix(String(format: ".%03dZ", Int(ms % 1000))) { wrong.append(text) }
        }
        #expect(wrong.isEmpty, "\(wrong.count) of 2000 written otherwise, e.g. \(wrong.prefix(3))")
    }
}
