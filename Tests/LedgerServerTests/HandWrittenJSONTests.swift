import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import LedgerTestSupport
import NIOCore
import Testing

@testable import LedgerServer

/// The two pieces of JSON written by hand for the order routes (`OrderResponse.text`,
/// `BodyMember`), held to what Foundation's encoder and decoder make of the same values.
@Suite("Hand-written JSON of the order routes")
struct HandWrittenJSONTests {
    static let token = UUID(uuidString: "6F1C2A4E-0000-4000-8000-0000000000A1")!
    static let time = Date(timeIntervalSince1970: 1_795_000_000.123)

    static func order(price: String?, transaction: String?, state: OrderState, user: String = "u-1") throws -> Order {
        Order(
            orderId: try OrderID("o \"1\"/\\ ü"), userId: try UserID(user), productId: try ProductID("gems.100"), quantity: 3,
            price: price, currency: price == nil ? nil : "EUR", appAccountToken: token, state: state, version: 4,
            transactionId: transaction.map { TransactionID(unchecked: $0) }, createdAt: time, updatedAt: time.addingTimeInterval(61.5),
            queuedAt: nil, stateBeforeRefund: nil, failureReason: nil)
    }

    @Test("an order's text is the JSON its encode(to:) gives, with and without optional members and history")
    func orderTextMatchesEncoder() throws {
        let event = RecordedEvent(
            position: 4096, streamID: StreamID(unchecked: "order-o"), streamVersion: 0, id: EventID(UUID()), type: "created",
            data: Data(#"{"note": "a \"b\"", "n": [1, 2.5, null]}"#.utf8), metadata: Data(#"{"requestId":"r\t1"}"#.utf8), recordedAt: Self.time)
        let answers = [
            OrderResponse(try Self.order(price: nil, transaction: nil, state: .created)),
            OrderResponse(try Self.order(price: "0.99", transaction: "t-1", state: .delivered, user: "user\"x\\")),
            OrderResponse(try Self.order(price: "1", transaction: nil, state: .paymentAdded), events: [event, event]),
            OrderResponse(try Self.order(price: nil, transaction: nil, state: .created), events: []),
        ]
        for answer in answers {
            let written = try #require(jsonObject(Data(answer.text.utf8)), "\(answer.text)")
            let encoded = try #require(jsonObject(try EventCoding.encoder.encode(answer)))
            #expect(written == encoded, "\(answer.text)")
        }
    }

    @Test("the feed's and a stream's pages are the JSON their encode(to:) gives, empty or not")
    func eventPagesMatchEncoder() throws {
        let events = [
            RecordedEvent(
                position: 7, streamID: StreamID(unchecked: "order-o \"1\""), streamVersion: 2, id: EventID(UUID()), type: "payment-added",
                data: Data(#"{"note": "a \"b\"", "n": [1, 2.5, null], "deep": {"x": {"y": "\u00fc\n"}}}"#.utf8),
                metadata: Data(#"{"requestId":"r\t1"}"#.utf8), recordedAt: Self.time),
            RecordedEvent(
                position: 9, streamID: StreamID(unchecked: "apple-transaction-1"), streamVersion: 0, id: EventID(UUID()), type: "transaction-unmatched",
                data: Data("{}".utf8), metadata: Data("{}".utf8), recordedAt: Self.time.addingTimeInterval(1)),
        ]
        for page in [events, []] {
            let feed = EventsController.Feed(events: page.map { EventResponse($0, withStream: true) }, next: page.last?.position ?? 3)
            let stream = EventsController.Stream(streamId: StreamID(unchecked: "order-o \"1\""), events: page.map { EventResponse($0) })
            for (text, encoded) in [(feed.text, try EventCoding.encoder.encode(feed)), (stream.text, try EventCoding.encoder.encode(stream))] {
                let written = try #require(jsonObject(Data(text.utf8)), "\(text)")
                #expect(written == (try #require(jsonObject(encoded))), "\(text)")
            }
        }
    }

    @Test("a member is found as written, spaces, nesting and escapes in values included")
    func memberFound() throws {
        let cases: [(body: String, data: String)] = [
            (#"{"type":"x","data":{"a":1}}"#, #"{"a":1}"#),
            (" {\n \"data\" :\t{ \"a\" : [1, {\"b\": \"}]\\\"\"}], \"c\": null } , \"type\":\"x\" } ", #"{ "a" : [1, {"b": "}]\""}], "c": null }"#),
            (#"{"datum":{"x":1},"type":"data","data":{}}"#, "{}"),
            (#"{"data":{"a":{"k":1},"b":{"k":2}}}"#, #"{"a":{"k":1},"b":{"k":2}}"#),
            (#"{"n":-1.5e3,"t":true,"data":{"x":"\u00fc"},"z":false}"#, #"{"x":"\u00fc"}"#),
            (#"{"data":{"n":-12.5,"t":true,"f":false,"z":null}}"#, #"{"n":-12.5,"t":true,"f":false,"z":null}"#),
            ("{\"data\":{" + (0..<40).map { "\"k\($0)\":\($0)" }.joined(separator: ",") + "}}",
             "{" + (0..<40).map { "\"k\($0)\":\($0)" }.joined(separator: ",") + "}"),
        ]
        for (body, data) in cases {
            let found = try #require(BodyMember.text(of: "data", in: ByteBuffer(string: body)), "\(body)")
            #expect(String(decoding: found, as: UTF8.self) == data)
        }
    }

    @Test("no member where the decoder, PostgreSQL and the ledger's reading could differ: given twice, an escaped or repeated key, a number Decimal may not hold")
    func memberRefused() {
        let bodies = [
            #"{"type":"x"}"#,
            #"{"data":{"a":1},"data":{"a":2}}"#,
            #"{"d\u0061ta":{"a":1},"data":{"a":2}}"#,
            #"{"data":{"a":1,"a":2}}"#,
            #"{"data":{"x":{"a":1,"a":2}}}"#,
            #"{"data":{"\u0061":1,"a":2}}"#,
            "{\"data\":{" + (0..<40).map { "\"k\($0)\":1" }.joined(separator: ",") + ",\"k7\":2}}",
            #"{"data":{"x":1e200}}"#,
            #"{"data":{"x":[1.5E3]}}"#,
            #"{"data":{"x":\#(String(repeating: "9", count: 39))}}"#,
        ]
        for body in bodies {
            #expect(BodyMember.text(of: "data", in: ByteBuffer(string: body)) == nil, "\(body)")
        }
    }
}
