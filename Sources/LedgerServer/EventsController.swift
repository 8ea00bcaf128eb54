import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// The log's read routes: the gap-safe global feed and one stream.
struct EventsController {
    let store: EventStore
    let orders: OrderLedger

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/v1/events") { request, _ in try await feed(request) }
        router.get("/v1/streams/:streamId/events") { request, context in try await stream(request, context) }
    }

    /// `GET /v1/events?after=&limit=`: events after a position, in position order, never
    /// skipping one that commits later (docs/architecture.md).
    func feed(_ request: Request) async throws -> Feed {
        let query = request.uri.queryParameters
        let after = try Self.position(query["after"], field: "after")
        let limit = try OrdersController.limit(query["limit"], default: 100, maximum: 1000)
        let events = try await store.readAll(after: after, limit: limit)
        return Feed(events: events.map { EventResponse($0, withStream: true) }, next: events.last?.position ?? after)
    }

    struct Feed: Encodable, Sendable {
        let events: [EventResponse]
        /// The position to read after next.
        let next: Int64
    }

    /// `GET /v1/streams/{streamId}/events?from=&limit=`.
    func stream(_ request: Request, _ context: LedgerRequestContext) async throws -> Stream {
        let stream = try StreamID(pathParameter(context, "streamId"))
        let query = request.uri.queryParameters
        let from = try Self.position(query["from"], field: "from")
        let limit = try OrdersController.limit(query["limit"], default: 1000, maximum: 10_000)
        if let keyApps = context.keyApps {
            // A key limited to apps reads its apps' orders' streams; another app's is answered as
            // a stream with no events, as any stream that does not exist. The other streams (the
            // pool's, rejected proofs', Apple accounts', calls to Apple) need a key of every app.
            guard let orderID = stream.orderID else {
                throw APIError(.forbidden, code: "all-apps-key-required",
                               message: "only a key of every app reads the stream \(stream); the key \(context.apiKeyName ?? "") reads its apps' order streams alone",
                               details: ["apps": .strings(keyApps.map(\.rawValue))])
            }
            guard let order = try await orders.order(orderID), context.reaches(order.bundleId) else {
                return Stream(streamId: stream, events: [])
            }
        }
        let events = try await store.readStream(stream, from: from, limit: limit)
        return Stream(streamId: stream, events: events.map { EventResponse($0) })
    }

    struct Stream: Encodable, Sendable {
        let streamId: StreamID
        let events: [EventResponse]
    }

    static func position(_ text: Substring?, field: String) throws(LedgerInputError) -> Int64 {
        guard let text else { return 0 }
        guard let value = Int64(text), value >= 0 else {
            throw LedgerInputError(field: field, problem: "must be a whole number, 0 or more")
        }
        return value
    }
}
