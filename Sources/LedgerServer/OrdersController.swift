import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// The order routes: create, append an event, read one, search.
struct OrdersController {
    let ledger: OrderLedger
    let events: EventStore
    let catalog: AppCatalog

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/orders") { request, context in try await create(request, context) }
        router.post("/v1/orders/:orderId/events") { request, context in try await appendEvent(request, context) }
        router.get("/v1/orders/:orderId") { _, context in try await read(context) }
        router.get("/v1/orders") { request, context in try await search(request, context) }
    }

    /// `POST /v1/orders`: 201 with the new order, 200 with the same order created before.
    func create(_ request: Request, _ context: LedgerRequestContext) async throws -> EditedResponse<OrderResponse> {
        let body = try await request.decode(as: CreateOrder.self, context: context)
        var created = body.created
        if let keyApps = context.keyApps {
            // A key limited to apps creates orders of its apps (403 for another, known or not);
            // a key of one app names it for the caller.
            if let app = created.bundleId { try context.requireReach(bundleId: app.rawValue) } else if keyApps.count == 1 { created.bundleId = keyApps[0] }
        }
        let outcome = try await ledger.create(body.orderId, created, tokenGiven: body.tokenGiven, metadata: context.eventMetadata)
        // Order ids are the ledger's: another app's order with this id makes it taken, and its
        // order is not shown.
        guard context.reaches(outcome.order.bundleId) else { throw OrderDecisionError.orderExists(body.orderId) }
        var events = outcome.events
        if events == nil { events = try await self.events.readStream(body.orderId.streamID) }
        return EditedResponse(status: outcome.appended ? .created : .ok, response: OrderResponse(outcome.order, events: events))
    }

    /// `POST /v1/orders/{orderId}/events`: `{type, eventId?, expectedVersion?, data}`.
    func appendEvent(_ request: Request, _ context: LedgerRequestContext) async throws -> EditedResponse<OrderResponse> {
        let id = try orderID(context)
        let (body, data) = try AppendEvent.read(try await LedgerRequestDecoder.body(of: request, context: context))
        // Another app's order is answered as one that does not exist (an order's app never
        // changes, so the read before the append decides). Keys of every app skip the read.
        if context.keyApps != nil, try await !context.reaches(ledger.order(id)?.bundleId) {
            throw OrderDecisionError.noSuchOrder
        }
        let outcome = try await ledger.append(
            id, event: body.event, eventID: body.eventId ?? EventID(), expected: body.expectedVersion, data: data,
            metadata: context.eventMetadata)
        return EditedResponse(status: outcome.appended ? .created : .ok, response: OrderResponse(outcome.order))
    }

    /// `GET /v1/orders/{orderId}`: the order and its whole history.
    func read(_ context: LedgerRequestContext) async throws -> OrderResponse {
        let id = try orderID(context)
        // Another app's order is answered as one that does not exist.
        guard let order = try await ledger.order(id), context.reaches(order.bundleId) else {
            throw APIError(.notFound, code: "order-not-found", message: "order \(id) does not exist")
        }
        return OrderResponse(order, events: try await events.readStream(id.streamID))
    }

    /// `GET /v1/orders?userId=&productId=&state=&after=&limit=`; `state=open`: not finished, failed or refunded.
    func search(_ request: Request, _ context: LedgerRequestContext) async throws -> Page<OrderResponse> {
        let query = request.uri.queryParameters
        let user = try query["userId"].map { try UserID(String($0)) }
        let product = try query["productId"].map { try ProductID(String($0)) }
        // Named as the query names it (an order id's problem would say orderId).
        let after = try query["after"].map { OrderID(unchecked: try Identifier.validate(String($0), field: "after")) }
        let states: [OrderState]? = try query["state"].map { text in
            if text == "open" { return OrderState.allCases.filter { ![.finished, .failed, .refunded].contains($0) } }
            guard let state = OrderState(rawValue: String(text)) else {
                throw LedgerInputError(field: "state", problem: "must be open or one of \(OrderState.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            return [state]
        }
        let limit = try Self.limit(query["limit"], default: 100, maximum: 1000)
        let bundle = try await context.namedApp(query["bundleId"], catalog: catalog)
        let orders = try await ledger.orders(userID: user, productID: product, states: states, after: after, limit: limit, bundleID: bundle,
                                              apps: context.keyApps)
        return Page(name: "orders", items: orders.map { OrderResponse($0) }, next: orders.count == limit ? orders.last?.orderId.rawValue : nil)
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
    guard let decoded = percentDecoded(raw) else {
        throw LedgerInputError(field: name, problem: "is not valid percent-encoding of UTF-8 text")
    }
    return decoded
}

/// `text` with its `%XX` escapes decoded, byte for byte: Foundation's `removingPercentEncoding`
/// drops a leading byte-order mark, which would take `%EF%BB%BFa` for another id's path (`a`).
/// Nil for a `%` not followed by two hex digits, or bytes that are not UTF-8.
func percentDecoded(_ text: String) -> String? {
    func hex(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
    var bytes: [UInt8] = []
    bytes.reserveCapacity(text.utf8.count)
    var input = text.utf8.makeIterator()
    while let byte = input.next() {
        guard byte == UInt8(ascii: "%") else { bytes.append(byte); continue }
        guard let high = input.next().flatMap(hex), let low = input.next().flatMap(hex) else { return nil }
        bytes.append(high << 4 | low)
    }
    return String(validating: bytes, as: UTF8.self)
}
