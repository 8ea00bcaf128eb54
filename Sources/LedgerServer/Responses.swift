import Foundation
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerStore

/// An order as the API shows it (every answer about an order says whether the client may
/// finish the StoreKit transaction, promise 11).
/// A single order is answered as `text` (`OrderResponse+Text`), a list of them through `encode(to:)`.
struct OrderResponse: Encodable, Sendable {
    let order: Order
    /// The order's history, where the answer gives it.
    var events: [RecordedEvent]?

    init(_ order: Order, events: [RecordedEvent]? = nil) {
        self.order = order
        self.events = events
    }

    enum CodingKeys: String, CodingKey {
        case orderId, userId, productId, quantity, price, currency, appAccountToken, bundleId, state, version, transactionId
        case environment, createdAt, updatedAt, finishTransaction, events
    }

    func encode(to encoder: any Encoder) throws {
        var json = encoder.container(keyedBy: CodingKeys.self)
        try json.encode(order.orderId, forKey: .orderId)
        try json.encode(order.userId, forKey: .userId)
        try json.encode(order.productId, forKey: .productId)
        try json.encode(order.quantity, forKey: .quantity)
        try json.encode(order.price, forKey: .price)
        try json.encode(order.currency, forKey: .currency)
        try json.encode(order.appAccountToken.uuidString.lowercased(), forKey: .appAccountToken)
        try json.encode(order.bundleId, forKey: .bundleId)
        try json.encode(order.state, forKey: .state)
        try json.encode(order.version, forKey: .version)
        try json.encode(order.transactionId, forKey: .transactionId)
        try json.encode(order.environment, forKey: .environment)
        try json.encode(order.createdAt, forKey: .createdAt)
        try json.encode(order.updatedAt, forKey: .updatedAt)
        try json.encode(order.state.clientMayFinish, forKey: .finishTransaction)
        try json.encodeIfPresent(events?.map { EventResponse($0) }, forKey: .events)
    }
}

/// An event as the API shows it; its data and metadata as the log stores them.
/// The feed and the stream routes write it by hand (`write(into:)`); `encode(to:)` is what a test
/// holds that to.
struct EventResponse: Encodable, Sendable {
    let stored: RecordedEvent
    /// Only in the global feed, which mixes streams.
    let streamId: StreamID?
    var position: Int64 { stored.position }
    var version: Int64 { stored.streamVersion }
    var type: String { stored.type }
    var eventId: EventID { stored.id }
    var recordedAt: Date { stored.recordedAt }

    init(_ event: RecordedEvent, withStream: Bool = false) {
        stored = event
        streamId = withStream ? event.streamID : nil
    }

    enum CodingKeys: String, CodingKey { case position, streamId, version, type, eventId, data, metadata, recordedAt }

    func encode(to encoder: any Encoder) throws {
        var json = encoder.container(keyedBy: CodingKeys.self)
        try json.encode(position, forKey: .position)
        try json.encodeIfPresent(streamId, forKey: .streamId)
        try json.encode(version, forKey: .version)
        try json.encode(type, forKey: .type)
        try json.encode(eventId, forKey: .eventId)
        try json.encode(JSONValue(json: stored.data), forKey: .data)
        try json.encode(JSONValue(json: stored.metadata), forKey: .metadata)
        try json.encode(recordedAt, forKey: .recordedAt)
    }
}

/// A page of a list: the items under `name`, and `next`, the last item's key when the page is
/// full (else null), for `after=`.
struct Page<Item: Encodable & Sendable>: ResponseEncodable {
    let name: String
    let items: [Item]
    let next: String?

    func encode(to encoder: any Encoder) throws {
        var json = encoder.container(keyedBy: MemberKey.self)
        try json.encode(items, forKey: MemberKey(stringValue: name))
        try json.encode(next, forKey: MemberKey(stringValue: "next"))
    }
}

/// A JSON object's member of any name.
struct MemberKey: CodingKey {
    let stringValue: String
    var intValue: Int? { nil }
    init(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
}

/// The content type of every JSON answer.
let jsonContentType = "application/json; charset=utf-8"

/// Any `Encodable` as an answer with `status`.
struct Answer<Value: Encodable & Sendable>: ResponseGenerator {
    let status: HTTPResponse.Status
    let value: Value

    init(_ status: HTTPResponse.Status, _ value: Value) {
        self.status = status
        self.value = value
    }

    init(_ value: Value) {
        self.init(.ok, value)
    }

    func response(from request: Request, context: some RequestContext) throws -> Response {
        var response = try EventCoding.encoder.encode(value, from: request, context: context)
        response.status = status
        return response
    }
}
