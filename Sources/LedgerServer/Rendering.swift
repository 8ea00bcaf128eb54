import Foundation
import Hummingbird
import LedgerCore

/// JSON shapes of the API, built as JSON objects so that stored event bodies pass through as
/// they were written.
enum Rendering {
    static func order(_ order: Order, events: [RecordedEvent]? = nil) -> [String: Any] {
        var json: [String: Any] = [
            "orderId": order.orderId.rawValue, "userId": order.userId.rawValue, "productId": order.productId.rawValue,
            "quantity": order.quantity, "price": order.price ?? NSNull(), "currency": order.currency ?? NSNull(),
            "appAccountToken": order.appAccountToken.uuidString.lowercased(), "state": order.state.rawValue,
            "version": order.version, "transactionId": order.transactionId?.rawValue ?? NSNull(),
            "createdAt": LedgerJSON.formatDate(order.createdAt), "updatedAt": LedgerJSON.formatDate(order.updatedAt),
            // DESIGN.md promise 11: every answer says whether the client may finish the StoreKit transaction.
            "finishTransaction": order.state.clientMayFinish,
        ]
        if let events { json["events"] = events.map { event($0) } }
        return json
    }

    static func event(_ event: RecordedEvent, withStream: Bool = false) -> [String: Any] {
        var json: [String: Any] = [
            "position": event.position, "version": event.streamVersion, "type": event.type, "eventId": event.id.description,
            "data": parse(event.data), "metadata": parse(event.metadata), "recordedAt": LedgerJSON.formatDate(event.recordedAt),
        ]
        if withStream { json["streamId"] = event.streamID.rawValue }
        return json
    }

    static func parse(_ data: Data) -> Any {
        (try? JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])) ?? NSNull()
    }

    static func response(_ status: HTTPResponse.Status, _ json: [String: Any]) -> Response {
        let data = (try? JSONSerialization.data(withJSONObject: json, options: [.withoutEscapingSlashes])) ?? Data("{}".utf8)
        return Response(status: status, headers: [.contentType: "application/json; charset=utf-8"], body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }
}
