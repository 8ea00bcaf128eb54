import Foundation
import Hummingbird
import LedgerCore

/// JSON shapes of the API. Orders and events, on every hot path, are written as text directly
/// (stored event bodies pass through as PostgreSQL stored them); other answers are built as JSON
/// objects.
enum Rendering {
    static func order(_ order: Order, events: [RecordedEvent]? = nil) -> String {
        var json = JSONText(capacity: events == nil ? 512 : 2048)
        json.add("orderId", order.orderId.rawValue)
        json.add("userId", order.userId.rawValue)
        json.add("productId", order.productId.rawValue)
        json.add("quantity", order.quantity)
        json.add("price", order.price)
        json.add("currency", order.currency)
        json.add("appAccountToken", order.appAccountToken.uuidString.lowercased())
        json.add("state", order.state.rawValue)
        json.add("version", order.version)
        json.add("transactionId", order.transactionId?.rawValue)
        json.add("createdAt", LedgerJSON.formatDate(order.createdAt))
        json.add("updatedAt", LedgerJSON.formatDate(order.updatedAt))
        // DESIGN.md promise 11: every answer says whether the client may finish the StoreKit transaction.
        json.add("finishTransaction", order.state.clientMayFinish)
        if let events { json.add("events", raw: JSONText.array(events.map { event($0) })) }
        return json.result
    }

    /// An event as the API shows it; its data and metadata pass through as PostgreSQL stored them.
    static func event(_ event: RecordedEvent, withStream: Bool = false) -> String {
        var json = JSONText()
        json.add("position", event.position)
        if withStream { json.add("streamId", event.streamID.rawValue) }
        json.add("version", event.streamVersion)
        json.add("type", event.type)
        json.add("eventId", event.id.description)
        json.add("data", raw: String(decoding: event.data, as: UTF8.self))
        json.add("metadata", raw: String(decoding: event.metadata, as: UTF8.self))
        json.add("recordedAt", LedgerJSON.formatDate(event.recordedAt))
        return json.result
    }

    static func parse(_ data: Data) -> Any {
        (try? JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])) ?? NSNull()
    }

    /// An answer whose body is JSON text already written.
    static func response(_ status: HTTPResponse.Status, text: String) -> Response {
        Response(status: status, headers: [.contentType: "application/json; charset=utf-8"], body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    static func response(_ status: HTTPResponse.Status, _ json: [String: Any]) -> Response {
        let data = (try? JSONSerialization.data(withJSONObject: json, options: [.withoutEscapingSlashes])) ?? Data("{}".utf8)
        return Response(status: status, headers: [.contentType: "application/json; charset=utf-8"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }
}
