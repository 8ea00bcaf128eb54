import Foundation
import LedgerCore
import Testing

@Suite("Order event bodies")
struct OrderEventDecodingTests {
    func decode(_ type: OrderEventType, _ json: String) throws(LedgerInputError) -> OrderEvent {
        try OrderEvent.decode(type: type, data: Data(json.utf8))
    }

    @Test("each type decodes from its wire fields")
    func decodesWireFields() throws {
        let created = try decode(.created, #"{"userId":"u1","productId":"gems.100","quantity":2,"price":"4.99","currency":"EUR","appAccountToken":"6f1c2a4e-0000-4000-8000-000000000001"}"#)
        guard case .created(let body) = created else { Issue.record("not created"); return }
        #expect(body.userId.rawValue == "u1")
        #expect(body.quantity == 2)
        #expect(body.price == "4.99")
        let queued = try decode(.paymentAdded, #"{"queuedAt":"2026-11-21T10:00:00.250Z"}"#)
        #expect(queued == .paymentAdded(PaymentAdded(queuedAt: LedgerJSON.parseDate("2026-11-21T10:00:00.250Z")!)))
        #expect(try decode(.delivered, #"{"grantId":"g-1"}"#) == .delivered)
        #expect(try decode(.failed, #"{"reason":"cancelled"}"#) == .failed(Failed(reason: "cancelled")))
        #expect(OrderEventType(rawValue: "refund-reversed") == .refundReversed)
        #expect(OrderEventType(rawValue: "payment-added") == .paymentAdded)
    }

    @Test("round trip through the ledger's encoding", arguments: OrderEventType.allCases)
    func roundTrip(type: OrderEventType) throws {
        let event = sample(type, seed: 7)
        #expect(try OrderEvent.decode(type: type, data: event.encodedData()) == event)
    }

    @Test("a creation's body is written as JSONEncoder writes it", arguments: [
        OrderCreated(userId: try! UserID("u1"), productId: try! ProductID("gems.100"), quantity: 2, price: "4.99", currency: "EUR"),
        OrderCreated(userId: try! UserID("user \"quoted\" \\ é"), productId: try! ProductID("p/1")),
        OrderCreated(userId: try! UserID("u"), productId: try! ProductID("p"), quantity: 100, price: "0.99"),
    ])
    func createdWrittenAsEncoded(body: OrderCreated) throws {
        let written = OrderEvent.created(body).encodedData()
        let encoded = try LedgerJSON.encoder.encode(body)
        let parse = { (data: Data) in try JSONSerialization.jsonObject(with: data) as? NSDictionary }
        #expect(try parse(written) == parse(encoded))
        #expect(try parse(written) != nil)
        #expect(try OrderEvent.decode(type: .created, data: written) == .created(body))
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
        ]
        for (type, json, field) in cases {
            do {
                _ = try OrderEvent.decode(type: type, data: Data(json.utf8))
                Issue.record("accepted \(json)")
            } catch {
                #expect(error.field == field, "\(json): \(error)")
            }
        }
    }
}
