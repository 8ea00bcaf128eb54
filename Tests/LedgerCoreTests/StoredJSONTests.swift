import Foundation
@testable import LedgerCore
import Testing

/// `StoredJSON` must answer exactly what `LedgerJSON.decoder` answers: the same value or the same
/// error, for the bodies the log holds and for anything else.
@Suite("Stored event bodies decode as Foundation decodes them")
struct StoredJSONTests {
    typealias Outcome = Result<OrderEvent, LedgerInputError>

    func foundation(_ type: OrderEventType, _ text: String) -> Outcome {
        Result { () throws(LedgerInputError) in try OrderEvent.decodeThroughFoundation(type: type, data: Data(text.utf8)) }
    }

    /// A client's body, as the API decodes it.
    func client(_ type: OrderEventType, _ text: String) -> Outcome {
        Result { () throws(LedgerInputError) in try OrderEvent.decode(type: type, data: Data(text.utf8)) }
    }

    func stored(_ type: OrderEventType, _ text: String) -> Outcome {
        Result { () throws(LedgerInputError) in try OrderEvent.decodeStored(type: type, text: text) }
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

    @Test("every event type, as the ledger writes it and as jsonb prints it")
    func everyType() {
        for type in OrderEventType.allCases {
            for seed in 0..<50 {
                let compact = String(decoding: sample(type, seed: seed).encodedData(), as: UTF8.self)
                for text in [compact, jsonbStyle(compact)] {
                    let expected = foundation(type, text)
                    #expect(stored(type, text) == expected, "\(type) \(text)")
                    #expect((try? expected.get()) == sample(type, seed: seed))
                    // Read without Foundation: the point of the decoder.
                    #expect(StoredJSON.withoutFoundation(OrderCreated.self, from: text) != nil || type != .created)
                    #expect(StoredJSON.withoutFoundation(ReceiptReceived.self, from: text) != nil || type != .receiptReceived)
                    #expect(StoredJSON.withoutFoundation(NotificationReceived.self, from: text) != nil || type != .notificationReceived)
                    #expect(StoredJSON.withoutFoundation(NoFields.self, from: text) != nil)
                }
            }
        }
    }

    @Test("escapes, non-ASCII text, nulls, numbers and nesting")
    func unusualBodies() {
        let token = "6f1c2a4e-0000-4000-8000-000000000001"
        let cases: [(OrderEventType, String)] = [
            (.failed, #"{"reason": "cancelled", "detail": "said \"no\"\nthen left"}"#),
            (.failed, #"{"reason": "abgebrochen", "detail": "Zahlung über 5 € — storniert 🙂"}"#),
            (.failed, #"{"reason": "c\u0061ncelled"}"#),
            (.failed, #"{"reason": "cancelled", "detail": null}"#),
            (.failed, #"{"reason": null}"#),
            (.refunded, #"{"revocationDate": "2026-11-21T10:00:00Z", "revocationReason": 1.0}"#),
            (.refunded, #"{"revocationDate": "2026-11-21T10:00:00Z", "revocationReason": 1e2}"#),
            (.refunded, #"{"revocationDate": "2026-11-21T10:00:00Z", "revocationReason": -0}"#),
            (.refunded, #"{"revocationDate": "2026-11-21T10:00:00Z", "revocationReason": 99999999999999999999}"#),
            (.refunded, #"{"revocationDate": "2026-11-21T10:00:00+08:00"}"#),
            (.refunded, #"{"revocationDate": "2026-02-30T10:00:00Z"}"#),
            (.refunded, #"{"revocationDate": 1800000000}"#),
            (.created, #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "\#(token)", "extra": {"a": [1, {"b": null}], "c": true}}"#),
            (.created, #"{"userId": "u", "productId": "p", "quantity": "2", "appAccountToken": "\#(token)"}"#),
            (.created, #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "\#(token.uppercased())"}"#),
            (.created, #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "\#(token)"} x"#),
            (.created, #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "6f1c2a4e-0000-4000-8000-00000000000g"}"#),
            (.created, #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "6f1c2a4e0-000-4000-8000-000000000001"}"#),
            (.created, #"{"userId": "u", "productId": "p", "quantity": 2, "appAccountToken": "6F1C2A4E-0000-4000-8000-00000000000A"}"#),
            (.created, #"{"userId": "u", "productId": "p", "quantity": 02, "appAccountToken": "\#(token)"}"#),
            (.created, #"["userId", "u"]"#),
            (.delivered, #"{}"#),
            (.delivered, #"{"grantId": ["g-1", "g-2"]}"#),
            (.delivered, #"[]"#),
            (.delivered, #""#),
            (.receiptReceived, #"{"transactionId": "1", "productId": "p", "purchaseDate": "2026-11-21T10:00:00.123456Z", "receiptSha256": "\#(String(repeating: "ab", count: 32))", "format": "jws", "matchedBy": "reconciler"}"#),
            (.receiptReceived, #"{"transactionId": "1", "productId": "p", "purchaseDate": "2026-11-21T10:00:00Z", "receiptSha256": "\#(String(repeating: "ab", count: 32))", "format": "pdf", "matchedBy": "reconciler"}"#),
        ]
        for (type, text) in cases {
            #expect(stored(type, text) == foundation(type, text), "\(type) \(text)")
        }
        // An escape is left to Foundation; plain non-ASCII text is not.
        #expect(StoredJSON.withoutFoundation(Failed.self, from: cases[0].1) == nil)
        #expect(StoredJSON.withoutFoundation(Failed.self, from: cases[1].1)?.detail == "Zahlung über 5 € — storniert 🙂")
    }

    @Test("random damage to valid bodies: the same value or the same error")
    func damagedBodies() {
        var generator = SeededGenerator(state: 20_261_121)
        let alphabet = Array(#"{}[]":,.-+0123456789eEtrufalsn \u\"é"#)
        var differing = 0
        var decoded = 0
        for round in 0..<4_000 {
            let type = OrderEventType.allCases.randomElement(using: &generator)!
            var characters = Array(jsonbStyle(String(decoding: sample(type, seed: round).encodedData(), as: UTF8.self)))
            for _ in 0..<Int.random(in: 1...3, using: &generator) where !characters.isEmpty {
                let at = Int.random(in: 0..<characters.count, using: &generator)
                switch Int.random(in: 0..<3, using: &generator) {
                case 0: characters.remove(at: at)
                case 1: characters.insert(alphabet.randomElement(using: &generator)!, at: at)
                default: characters[at] = alphabet.randomElement(using: &generator)!
                }
            }
            let text = String(characters)
            let expected = foundation(type, text)
            if (try? expected.get()) != nil { decoded += 1 }
            if stored(type, text) != expected {
                differing += 1
                Issue.record("\(type) \(text): \(stored(type, text)) vs \(expected)")
            }
            let compact = text.replacingOccurrences(of: ": ", with: ":").replacingOccurrences(of: ", ", with: ",")
            if client(type, compact) != foundation(type, compact) {
                differing += 1
                Issue.record("client body \(type) \(compact): \(client(type, compact)) vs \(foundation(type, compact))")
            }
        }
        #expect(differing == 0)
        // The damage must leave a fair share decodable, or the test compares errors only.
        #expect(decoded > 400)
    }

    @Test("a member object cut out of a request body as it was written, or nil where the scanner cannot be sure")
    func objectMembers() {
        func member(_ text: String) -> String? {
            guard case .object(let data)? = StoredJSON.plainMembers(of: Data(text.utf8))?.first(where: { $0.key == "data" })?.value else { return nil }
            return String(decoding: data, as: UTF8.self)
        }
        #expect(member(#"{"type":"verified","data":{"environment":"Sandbox","n":[1,{"a":2}]}}"#) == #"{"environment":"Sandbox","n":[1,{"a":2}]}"#)
        #expect(member(#" { "data" : { } , "type" : "delivered" } "#) == "{ }")
        #expect(member(#"{"data":{"note":"über 5 €"}}"#) == #"{"note":"über 5 €"}"#)
        #expect(member(#"{"type":"delivered"}"#) == nil, "missing")
        #expect(member(#"{"data":[1]}"#) == nil, "not an object")
        #expect(member(#"{"data":null}"#) == nil, "not an object")
        #expect(member(#"{"data":{},"data":{"a":1}}"#) == nil, "given twice: Foundation keeps one, the scanner does not guess which")
        #expect(member(#"{"data":{"a":"\u0041"}}"#) == nil, "an escape")
        #expect(member(#"{"data":{"a":1}"#) == nil, "not JSON")
        #expect(member(#"{"data":{"a":1e3}}"#) == nil, "an exponent: Foundation may read the number otherwise")
        #expect(member(#"{"data":{"a":10.000000000000001}}"#) == nil, "18 characters: Foundation reads it as a decimal number")
        #expect(member(#"{"data":{"a":-1234567890123.12}}"#) != nil, "17 characters")
        #expect(member(#"{"nested":{"data":{"a":1}}}"#) == nil, "only the top level's members")
        #expect(member(#"[{"data":{}}]"#) == nil, "not an object")
        #expect(member(#"{"data":{"queuedAt":"a","n":{"x":1,"x":2},"queuedAt":"b"}}"#) == nil,
                "a key twice inside: decided on the first value, stored (jsonb) with the last")
        #expect(member(#"{"data":{"n":{"x":1,"x":2}}}"#) == nil, "a key twice in a nested object")
        #expect(member(#"{"type":"a","type":"b","data":{"a":1}}"#) == nil, "a key twice elsewhere in the body")
        #expect(member(#"{"data":{"ab":1,"a":2,"b":3,"":4}}"#) == #"{"ab":1,"a":2,"b":3,"":4}"#, "keys alike but not equal")
        let many = (0..<40).map { #""k\#($0)":\#($0)"# }.joined(separator: ",")
        #expect(member(#"{"data":{\#(many)}}"#) == "{\(many)}")
        #expect(member(#"{"data":{\#(many),"k7":0}}"#) == nil, "a key twice among many")
    }

    @Test("a plain object: one this scanner reads by itself, with each key once in every object")
    func plainObjects() {
        let plain = { (text: String) in StoredJSON.plainMembers(of: Data(text.utf8)) != nil }
        #expect(plain(#" {"orderId":"o","userId":"u","n":{"a":[1,2.0]}} "#))
        #expect(!plain(#"{"price":"0.99","price":"9.99"}"#))
        #expect(!plain(#"{"a":{"b":1,"b":2}}"#))
        #expect(!plain(#"{"userId":"\u0041"}"#))
        #expect(!plain("[1]"))
        #expect(!plain("{"))
        var invalid = Data(#"{"userId":"u"#.utf8)
        invalid.append(contentsOf: [0xC3, 0x28])
        invalid.append(contentsOf: Data(#""}"#.utf8))
        #expect(StoredJSON.plainMembers(of: invalid) == nil, "not UTF-8: Foundation refuses it")
        let members = StoredJSON.plainMembers(of: Data(#" {"s":"é","n":-2.5,"i":7,"o":{ "a" : 1 },"a":[],"t":true,"f":false,"z":null} "#.utf8))
        #expect(members?.map(\.key) == ["s", "n", "i", "o", "a", "t", "f", "z"])
        #expect(members?.map(\.value) == [.string("é"), .number(-2.5), .number(7), .object(Data(#"{ "a" : 1 }"#.utf8)), .array, .bool(true), .bool(false), .null])
    }
}
