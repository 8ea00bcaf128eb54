import Foundation
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerStore

/// An order answer written by hand rather than through `JSONEncoder`: the order routes answer
/// every event with one, and Foundation's encoder took 15 µs of the server's CPU per answer
/// (this takes 2). Lists of orders (`Page`) still go through `encode(to:)`; a test holds the two
/// to the same JSON.
extension OrderResponse: ResponseGenerator {
    func response(from request: Request, context: some RequestContext) throws -> Response { textAnswer(text) }

    /// The answer's JSON: the members of `encode(to:)`, keys sorted; an event's data and metadata
    /// as stored (JSON text already).
    var text: String {
        var json = "{"
        json.reserveCapacity(400)
        json += #""appAccountToken":"\#(order.appAccountToken.uuidString.lowercased())","#
        json += #""bundleId":\#(JSONString(order.bundleId?.rawValue)),"#
        json += #""createdAt":"\#(EventCoding.formatDate(order.createdAt))","#
        json += #""currency":\#(JSONString(order.currency)),"#
        json += #""environment":\#(JSONString(order.environment)),"#
        if let events { json += #""events":\#(eventsText(events.map { EventResponse($0) })),"# }
        json += #""finishTransaction":\#(order.state.clientMayFinish),"orderId":\#(JSONString(order.orderId.rawValue)),"#
        json += #""price":\#(JSONString(order.price)),"#
        json += #""productId":\#(JSONString(order.productId.rawValue)),"quantity":\#(order.quantity),"#
        json += #""state":"\#(order.state.rawValue)","#
        json += #""transactionId":\#(JSONString(order.transactionId?.rawValue)),"#
        json += #""updatedAt":"\#(EventCoding.formatDate(order.updatedAt))","userId":\#(JSONString(order.userId.rawValue)),"version":\#(order.version)}"#
        return json
    }
}

/// `text` as a JSON string, or `null` when there is none.
func JSONString(_ text: String?) -> String { text.map { JSONString($0) } ?? "null" }

/// `text` as a JSON string: quoted, with `"`, `\` and control characters escaped.
func JSONString(_ text: String) -> String {
    guard text.utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) else { return "\"\(text)\"" }
    var quoted = "\""
    for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": quoted += "\\\""
        case "\\": quoted += "\\\\"
        case "\n": quoted += "\\n"
        case "\r": quoted += "\\r"
        case "\t": quoted += "\\t"
        case _ where scalar.value < 0x20: quoted += String(format: "\\u%04x", scalar.value)
        default: quoted.unicodeScalars.append(scalar)
        }
    }
    return quoted + "\""
}

/// The event feed's and a stream's pages written by hand, as an order's answer is: each event's
/// data and metadata as stored (JSON text already). Through `JSONEncoder` every event's data was
/// parsed into `JSONValue` and encoded again, on the shared executor: a page of 100 events of
/// 240 KiB took 18 s, and stalled every other answer meanwhile.
extension EventResponse {
    /// The event's JSON: the members of `encode(to:)`, keys sorted.
    func write(into json: inout String) {
        json += #"{"data":\#(String(decoding: stored.data, as: UTF8.self)),"eventId":"\#(eventId)","#
        json += #""metadata":\#(String(decoding: stored.metadata, as: UTF8.self)),"position":\#(position),"#
        json += #""recordedAt":"\#(EventCoding.formatDate(recordedAt))","#
        if let streamId { json += #""streamId":\#(JSONString(streamId.rawValue)),"# }
        json += #""type":\#(JSONString(type)),"version":\#(version)}"#
    }
}

/// `events` as a JSON array.
func eventsText(_ events: [EventResponse]) -> String {
    var json = "["
    json.reserveCapacity(events.reduce(2) { $0 + $1.stored.data.count + $1.stored.metadata.count + 200 })
    for (index, event) in events.enumerated() {
        if index > 0 { json += "," }
        event.write(into: &json)
    }
    return json + "]"
}

/// A hand-written JSON answer: 200 with `text`.
func textAnswer(_ text: String) -> Response {
    let buffer = ByteBuffer(string: text)
    return Response(
        status: .ok, headers: [.contentType: jsonContentType, .contentLength: String(buffer.readableBytes)],
        body: ResponseBody(byteBuffer: buffer))
}

extension EventsController.Feed: ResponseGenerator {
    var text: String { #"{"events":\#(eventsText(events)),"next":\#(next)}"# }

    func response(from request: Request, context: some RequestContext) throws -> Response { textAnswer(text) }
}

extension EventsController.Stream: ResponseGenerator {
    var text: String { #"{"events":\#(eventsText(events)),"streamId":\#(JSONString(streamId.rawValue))}"# }

    func response(from request: Request, context: some RequestContext) throws -> Response { textAnswer(text) }
}
