import Foundation
import LedgerCore
import LedgerJSON
import LedgerTestSupport
import Testing

/// `StoredBodyDecoder` must answer exactly what `JSONDecoder` (`EventCoding.decoder`) answers:
/// the same body or the same error, for what the log holds and for anything else.
@Suite("Stored event bodies decode as JSONDecoder decodes them")
struct StoredBodyDecoderTests {
    /// A body or its error, as text: the two paths must agree on both.
    func foundation(_ stream: String, _ type: String, _ text: String) -> String {
        describe { try EventCoding.body(stream: StreamID(unchecked: stream), type: type, data: Data(text.utf8)) }
    }

    func stored(_ stream: String, _ type: String, _ text: String) -> String {
        describe { try EventCoding.body(stream: StreamID(unchecked: stream), type: type, text: text) }
    }

    func describe(_ body: () throws -> EventBody) -> String {
        do { return "\(try body())" } catch { return "error: \(error)" }
    }

    /// A body as PostgreSQL's jsonb prints it: `{"a": 1, "b": [2, 3]}`.
    func jsonbStyle(_ compact: String) -> String {
        var out = ""
        var inString = false
        var escaped = false
        for character in compact {
            out.append(character)
            if inString {
                if escaped { escaped = false } else if character == "\\" { escaped = true } else if character == "\"" { inString = false }
            } else if character == "\"" {
                inString = true
            } else if character == ":" || character == "," {
                out.append(" ")
            }
        }
        return out
    }

    static let token = UUID(uuidString: "6F1C2A4E-0000-4000-8000-000000000001")!
    static let transaction = AppleTransaction(
        transactionId: TransactionID(unchecked: "2000001"), originalTransactionId: "2000000", productId: ProductID(unchecked: "gems.100"),
        purchaseDate: Date(timeIntervalSince1970: 1_800_000_000.125), environment: "Sandbox", bundleId: "com.example.game",
        quantity: 2, appAccountToken: token, appTransactionId: "7000001", price: "0.99", currency: "USD", format: .jws,
        receiptSha256: String(repeating: "ab", count: 32))

    /// Every event body the ledger writes: the order samples of `EventCodingTests` and one of each transaction event.
    static let samples: [(stream: String, body: EventBody)] =
        EventCodingTests.samples.map { ("order-o1", EventBody.order($0)) } + [
            ("transaction-2000001", .transaction(.unmatched(TransactionUnmatched(
                transaction: transaction, userId: UserID(unchecked: "u1"), claimedOrderId: nil, reason: "no-order")))),
            ("transaction-2000001", .transaction(.matched(TransactionMatched(
                orderId: OrderID(unchecked: "o1"), matchedBy: .reconciler, candidates: 2, rule: "queue-order")))),
            ("transaction-2000001", .transaction(.notificationReceived(NotificationReceived(
                notificationUUID: token, notificationType: "REFUND", subtype: nil, transactionId: TransactionID(unchecked: "2000001"),
                signedDate: Date(timeIntervalSince1970: 1_800_000_000.5))))),
        ]

    static func encoded(_ body: EventBody) throws -> String {
        switch body {
        case .order(let event): String(decoding: try EventCoding.encoder.encode(event), as: UTF8.self)
        case .transaction(let event): String(decoding: try EventCoding.encoder.encode(event), as: UTF8.self)
        case .subscription(let event): String(decoding: try EventCoding.encoder.encode(event), as: UTF8.self)
        case .opaque: "{}"
        }
    }

    @Test("every body the ledger writes, compact and as jsonb prints it, read without JSONDecoder")
    func everyBody() throws {
        #expect(Self.samples.count == EventCodingTests.samples.count + 3)
        for (stream, body) in Self.samples {
            let compact = try Self.encoded(body)
            for text in [compact, jsonbStyle(compact)] {
                #expect(stored(stream, body.type, text) == foundation(stream, body.type, text), "\(text)")
                #expect(try EventCoding.body(stream: StreamID(unchecked: stream), type: body.type, text: text) == body, "\(text)")
            }
        }
        // The point of the decoder: these never reach JSONDecoder.
        let created = try Self.encoded(.order(.created(OrderCreated(
            userId: UserID(unchecked: "u1"), productId: ProductID(unchecked: "gems.100"), quantity: 2, price: "0.99", currency: "USD"))))
        #expect(StoredBodyDecoder.withoutFoundation(OrderCreated.self, from: created) != nil)
        let unmatched = try Self.encoded(Self.samples[EventCodingTests.samples.count].body)
        #expect(StoredBodyDecoder.withoutFoundation(TransactionUnmatched.self, from: unmatched) != nil)
    }

    @Test("escapes, non-ASCII text, nulls, numbers, nesting and wrong types")
    func unusualBodies() {
        let token = "6f1c2a4e-0000-4000-8000-000000000001"
        let cases: [(String, String)] = [
            ("failed", #"{"reason": "cancelled", "detail": "said \"no\"\nthen left"}"#),
            ("failed", #"{"reason": "abgebrochen", "detail": "Zahlung über 5 € — storniert 🙂"}"#),
            ("failed", #"{"reason": "c\u0061ncelled"}"#),
            ("failed", #"{"reason": "cancelled", "detail": null}"#),
            ("failed", #"{"reason": null}"#),
            ("refunded", #"{"revocationDate": "2026-11-21T10:00:00Z", "revocationReason": 1.0}"#),
            ("refunded", #"{"revocationDate": "2026-11-21T10:00:00Z", "revocationReason": 1e2}"#),
            ("refunded", #"{"revocationDate": "2026-11-21T10:00:00Z", "revocationReason": -0}"#),
            ("refunded", #"{"revocationDate": "2026-11-21T10:00:00Z", "revocationReason": 99999999999999999999}"#),
            ("refunded", #"{"revocationDate": "2026-11-21T10:00:00+08:00"}"#),
            ("refunded", #"{"revocationDate": "2026-02-30T10:00:00Z"}"#),
            ("refunded", #"{"revocationDate": "1969-12-31T23:59:59Z"}"#),
            ("refunded", #"{"revocationDate": 1800000000}"#),
            ("created", #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "\#(token)", "extra": {"a": [1, {"b": null}], "c": true}}"#),
            ("created", #"{"userId": "u", "productId": "p", "quantity": "2", "appAccountToken": "\#(token)"}"#),
            ("created", #"{"userId": "u", "productId": "p", "quantity": 0, "appAccountToken": "\#(token)"}"#),
            ("created", #"{"userId": "", "productId": "p", "quantity": 1, "appAccountToken": "\#(token)"}"#),
            ("created", #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "\#(token.uppercased())"}"#),
            ("created", #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "\#(token)"} x"#),
            ("created", #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "6f1c2a4e-0000-4000-8000-00000000000g"}"#),
            ("created", #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "6f1c2a4e0-000-4000-8000-000000000001"}"#),
            ("created", #"{"userId": "u", "productId": "p", "quantity": 02, "appAccountToken": "\#(token)"}"#),
            ("created", #"["userId", "u"]"#),
            ("delivered", #"{}"#),
            ("delivered", #"{"grantId": ["g-1", "g-2"]}"#),
            ("delivered", #"[]"#),
            ("delivered", #""#),
            ("receipt-received", #"{"transactionId": "1", "productId": "p", "purchaseDate": "2026-11-21T10:00:00.123456Z", "receiptSha256": "\#(String(repeating: "ab", count: 32))", "format": "jws", "matchedBy": "reconciler"}"#),
            ("receipt-received", #"{"transactionId": "1", "productId": "p", "purchaseDate": "2026-11-21T10:00:00Z", "receiptSha256": "\#(String(repeating: "ab", count: 32))", "format": "pdf", "matchedBy": "reconciler"}"#),
        ]
        for (type, text) in cases {
            #expect(stored("order-o1", type, text) == foundation("order-o1", type, text), "\(type) \(text)")
        }
        #expect(foundation("order-o1", "failed", cases[2].1).contains("cancelled"), "an escape read by JSONDecoder")
        #expect(StoredBodyDecoder.withoutFoundation(Failed.self, from: cases[0].1) == nil, "an escape is left to JSONDecoder")
        #expect(StoredBodyDecoder.withoutFoundation(Failed.self, from: cases[1].1)?.detail == "Zahlung über 5 € — storniert 🙂")
    }

    @Test("random damage to valid bodies: the same body or the same error")
    func damagedBodies() throws {
        var generator = SeededGenerator(state: 20_261_125)
        let alphabet = Array(#"{}[]":,.-+0123456789eEtrufalsn \u\"é"#)
        var decoded = 0
        var differing = 0
        for round in 0..<4_000 {
            let (stream, body) = Self.samples[round % Self.samples.count]
            var characters = Array(jsonbStyle(try Self.encoded(body)))
            for _ in 0..<Int.random(in: 1...3, using: &generator) where !characters.isEmpty {
                let at = Int.random(in: 0..<characters.count, using: &generator)
                switch Int.random(in: 0..<3, using: &generator) {
                case 0: characters.remove(at: at)
                case 1: characters.insert(alphabet.randomElement(using: &generator)!, at: at)
                default: characters[at] = alphabet.randomElement(using: &generator)!
                }
            }
            let text = String(characters)
            let expected = foundation(stream, body.type, text)
            if !expected.hasPrefix("error:") { decoded += 1 }
            if stored(stream, body.type, text) != expected {
                differing += 1
                Issue.record("\(body.type) \(text): \(stored(stream, body.type, text)) vs \(expected)")
            }
        }
        #expect(differing == 0)
        // The damage must leave a fair share decodable, or the test compares errors only.
        #expect(decoded > 400)
    }
}
