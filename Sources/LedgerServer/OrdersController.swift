import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// The order routes: create, append an event, read one, search.
struct OrdersController {
    let ledger: OrderLedger

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/orders") { request, context in try await create(request, context) }
        router.post("/v1/orders/:orderId/events") { request, context in try await appendEvent(request, context) }
        router.get("/v1/orders/:orderId") { _, context in try await read(context) }
        router.get("/v1/orders") { request, _ in try await search(request) }
    }

    /// `POST /v1/orders`: 201 with the new order, 200 with the same order created before.
    func create(_ request: Request, _ context: LedgerRequestContext) async throws -> Response {
        let body = try await JSONBody.read(request, context: context)
        let id = try OrderID(body.requiredString("orderId"))
        let tokenGiven = body.has("appAccountToken") && !body.isNull("appAccountToken")
        for required in ["userId", "productId"] where !body.has(required) {
            throw LedgerInputError(field: required, problem: "is missing")
        }
        let data = try Self.creationFields(body, token: tokenGiven ? nil : UUID.random())
        guard case .created(let created) = try OrderEvent.decode(type: .created, data: data) else {
            throw LedgerInputError(field: "body", problem: "is not an order")
        }
        let outcome = try await ledger.create(id, created, tokenGiven: tokenGiven, metadata: metadata(context))
        var events = outcome.events
        if events == nil { events = try await ledger.store.readStream(id.streamID) }
        return Rendering.response(outcome.appended ? .created : .ok, text: Rendering.order(outcome.order, events: events))
    }

    /// A creation's body as the fields of `created`, a generated token (`token`) and the default
    /// quantity added when it has none: the body itself with the missing members written in front
    /// (its `orderId` is a member the decoder skips); written again from the parsed object when
    /// one of them is given as null, or when the body is not plain (`JSONBody.isPlain`: of a key
    /// given twice, the parsed object keeps the last value and the decoder would read the
    /// first). (Writing every creation again with JSONSerialization cost 4% of the server's CPU.)
    static func creationFields(_ body: JSONBody, token: UUID?) throws -> Data {
        guard body.isPlain, !body.isNull("appAccountToken"), !body.isNull("quantity"),
              let open = body.text.firstIndex(of: UInt8(ascii: "{")) else {
            var fields = body.object
            fields.removeValue(forKey: "orderId")
            if let token { fields["appAccountToken"] = token.uuidString.lowercased() }
            if fields["quantity"] == nil || fields["quantity"] is NSNull { fields["quantity"] = 1 }
            return try JSONSerialization.data(withJSONObject: fields)
        }
        var added = ""
        if let token { added += #""appAccountToken":"\#(token.uuidString.lowercased())","# }
        if !body.has("quantity") { added += #""quantity":1,"# }
        guard !added.isEmpty else { return body.text }
        // The body has members (an orderId at least), so the added ones end with a comma.
        var data = body.text
        data.insert(contentsOf: Data(added.utf8), at: data.index(after: open))
        return data
    }

    /// `POST /v1/orders/{orderId}/events`: `{type, eventId?, expectedVersion?, data}`.
    func appendEvent(_ request: Request, _ context: LedgerRequestContext) async throws -> Response {
        let id = try orderID(context)
        let body = try await JSONBody.read(request, context: context)
        let typeName = try body.requiredString("type")
        guard let type = OrderEventType(rawValue: typeName) else {
            throw APIError(.badRequest, code: "unknown-event-type", message: "unknown event type \(typeName)",
                           details: ["allowed": OrderEventType.allCases.map(\.rawValue)])
        }
        guard type != .created else {
            throw APIError(.badRequest, code: "unknown-event-type", message: "orders are created with POST /v1/orders")
        }
        guard type.isWrittenByClients else {
            throw APIError(.badRequest, code: "unknown-event-type", message: "\(typeName) is recorded by the ledger from Apple's notifications (POST /v1/notifications/apple)")
        }
        let eventID = try body.string("eventId").map { text throws(LedgerInputError) in try EventID(text) } ?? EventID()
        let expected = try body.integer("expectedVersion").map { version throws(LedgerInputError) -> ExpectedVersion in
            guard version >= -1 else { throw LedgerInputError(field: "expectedVersion", problem: "must be -1 (no order) or more") }
            return version < 0 ? .noStream : .exact(version)
        }
        let data = body.has("data") ? try body.objectData("data") : Data("{}".utf8)
        let event = try OrderEvent.decode(type: type, data: data)
        let outcome = try await ledger.append(id, event: event, eventID: eventID, expected: expected, data: data, metadata: metadata(context))
        return Rendering.response(outcome.appended ? .created : .ok, text: Rendering.order(outcome.order))
    }

    /// `GET /v1/orders/{orderId}`: the order and its whole history.
    func read(_ context: LedgerRequestContext) async throws -> Response {
        let id = try orderID(context)
        guard let order = try await ledger.order(id) else {
            throw APIError(.notFound, code: "order-not-found", message: "order \(id) does not exist")
        }
        let events = try await ledger.store.readStream(id.streamID)
        return Rendering.response(.ok, text: Rendering.order(order, events: events))
    }

    /// `GET /v1/orders?userId=&productId=&state=&after=&limit=`; `state=open`: not finished, failed or refunded.
    func search(_ request: Request) async throws -> Response {
        let query = request.uri.queryParameters
        let user = try query["userId"].map { try UserID(String($0)) }
        let product = try query["productId"].map { try ProductID(String($0)) }
        let after = try query["after"].map { try OrderID(String($0)) }
        let states: [OrderState]? = try query["state"].map { text in
            if text == "open" { return OrderState.allCases.filter { ![.finished, .failed, .refunded].contains($0) } }
            guard let state = OrderState(rawValue: String(text)) else {
                throw LedgerInputError(field: "state", problem: "must be open or one of \(OrderState.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            return [state]
        }
        let limit = try Self.limit(query["limit"], default: 100, maximum: 1000)
        let orders = try await ledger.orders(userID: user, productID: product, states: states, after: after, limit: limit)
        var json = JSONText()
        json.add("orders", raw: JSONText.array(orders.map { Rendering.order($0) }))
        json.add("next", orders.count == limit ? orders.last?.orderId.rawValue : nil)
        return Rendering.response(.ok, text: json.result)
    }

    func orderID(_ context: LedgerRequestContext) throws -> OrderID {
        try OrderID(pathParameter(context, "orderId"))
    }

    static func limit(_ text: Substring?, default value: Int, maximum: Int) throws(LedgerInputError) -> Int {
        guard let text else { return value }
        guard let limit = Int(text), (1...maximum).contains(limit) else {
            throw LedgerInputError(field: "limit", problem: "must be a whole number from 1 to \(maximum)")
        }
        return limit
    }
}

/// A path parameter, percent-decoded (an order id may hold characters a path must escape).
func pathParameter(_ context: LedgerRequestContext, _ name: String) throws(LedgerInputError) -> String {
    let raw = context.parameters.get(name) ?? ""
    guard raw.utf8.contains(UInt8(ascii: "%")) else { return raw }
    guard let decoded = raw.removingPercentEncoding else {
        throw LedgerInputError(field: name, problem: "is not valid percent-encoding")
    }
    return decoded
}

/// The metadata recorded with every event appended through the API.
func metadata(_ context: LedgerRequestContext) -> Data {
    var json = JSONText()
    json.add("requestId", context.requestID)
    if let key = context.apiKeyName { json.add("appendedBy", key) }
    return Data(json.result.utf8)
}
