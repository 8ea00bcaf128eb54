import Foundation
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerServices
import LedgerStore

/// Support's routes on the pool: `GET /v1/transactions/unmatched` (read) and
/// `POST /v1/transactions/{transactionId}/match` and `…/unmatch` (admin).
struct TransactionsController {
    let pool: TransactionPool
    let desk: SupportDesk
    let orders: OrderLedger
    let catalog: AppCatalog

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/v1/transactions/unmatched") { request, context in try await search(request, context) }
        router.post("/v1/transactions/:transactionId/match") { request, context in try await match(request, context) }
        router.post("/v1/transactions/:transactionId/unmatch") { request, context in try await unmatch(request, context) }
    }

    func search(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<Page<Pooled>> {
        let query = request.uri.queryParameters
        let user = try query["userId"].map { try UserID(String($0)) }
        let product = try query["productId"].map { try ProductID(String($0)) }
        let transaction = try query["transactionId"].map { try TransactionID(String($0)) }
        let after = try query["after"].map { TransactionID(unchecked: try Identifier.validate(String($0), field: "after")) }
        let from = try query["from"].map { try Self.date(String($0), field: "from") }
        let to = try query["to"].map { try Self.date(String($0), field: "to") }
        if let from, let to, to < from { throw LedgerInputError(field: "to", problem: "must not be before from") }
        let limit = try OrdersController.limit(query["limit"], default: 100, maximum: 1000)
        let bundle = try await context.namedApp(query["bundleId"], catalog: catalog)
        let found = try await pool.unmatched(
            userId: user, productId: product, from: from, to: to, transactionId: transaction, after: after, limit: limit, bundleId: bundle,
            apps: context.keyApps)
        return Answer(Page(name: "transactions", items: found.map(Pooled.init), next: found.count == limit ? found.last?.transactionId.rawValue : nil))
    }

    /// A transaction waiting in the pool, as the API shows it.
    struct Pooled: Encodable, Sendable {
        let pooled: TransactionPool.PooledTransaction

        init(_ pooled: TransactionPool.PooledTransaction) { self.pooled = pooled }

        enum CodingKeys: String, CodingKey {
            case transactionId, userId, productId, purchaseDate, environment, appAccountToken, receivedAt, verification, bundleId, status
        }

        func encode(to encoder: any Encoder) throws {
            var json = encoder.container(keyedBy: CodingKeys.self)
            try json.encode(pooled.transactionId, forKey: .transactionId)
            try json.encode(pooled.userId, forKey: .userId)
            try json.encode(pooled.productId, forKey: .productId)
            try json.encode(pooled.purchaseDate, forKey: .purchaseDate)
            try json.encode(pooled.environment, forKey: .environment)
            try json.encode(pooled.appAccountToken?.uuidString.lowercased(), forKey: .appAccountToken)
            try json.encode(pooled.receivedAt, forKey: .receivedAt)
            try json.encode(pooled.verification.map { JSONValue(json: $0) }, forKey: .verification)
            try json.encode(pooled.bundleId, forKey: .bundleId)
            try json.encode(pooled.status, forKey: .status)
        }
    }

    /// The body of `POST /v1/transactions/{transactionId}/match`.
    struct Match: ClosedBody {
        let orderId: OrderID
        let force: Bool?
        let reason: String?

        enum CodingKeys: String, CodingKey, CaseIterable { case orderId, force, reason }
    }

    func match(_ request: Request, _ context: LedgerRequestContext) async throws -> OrderResponse {
        let id = try TransactionID(pathParameter(context, "transactionId"))
        let body = try await request.decode(as: Match.self, context: context)
        // Another app's transaction or order is answered as one that does not exist.
        if context.keyApps != nil {
            guard try await reaches(id, context) else { throw SupportMatchError.transactionNotFound(id) }
            guard try await context.reaches(orders.order(body.orderId)?.bundleId) else { throw OrderDecisionError.noSuchOrder }
        }
        let matched = try await desk.match(id, to: body.orderId, force: body.force ?? false, reason: body.reason, metadata: context.eventMetadata)
        return OrderResponse(matched)
    }

    /// The body of `POST /v1/transactions/{transactionId}/unmatch`.
    struct Unmatch: ClosedBody {
        let reason: String

        enum CodingKeys: String, CodingKey, CaseIterable { case reason }
    }

    func unmatch(_ request: Request, _ context: LedgerRequestContext) async throws -> OrderResponse {
        let id = try TransactionID(pathParameter(context, "transactionId"))
        let body = try await request.decode(as: Unmatch.self, context: context)
        if context.keyApps != nil, try await !reaches(id, context) { throw SupportUnmatchError.transactionNotFound(id) }
        return OrderResponse(try await desk.unmatch(id, reason: body.reason, metadata: context.eventMetadata))
    }

    /// Whether the key reaches the app of the transaction `id` (false when the ledger has none).
    func reaches(_ id: TransactionID, _ context: LedgerRequestContext) async throws -> Bool {
        guard let app = try await pool.apps(of: [id])[id] else { return false }
        return context.reaches(app)
    }

    static func date(_ text: String, field: String) throws(LedgerInputError) -> Date {
        // A time's `+02:00` written in a query unencoded arrives as a space (a query's `+`).
        guard let date = EventCoding.parseDate(text.replacingOccurrences(of: " ", with: "+")) else {
            throw LedgerInputError(field: field, problem: "must be an ISO 8601 time such as 2026-11-21T10:00:00Z (a real day and time, from 1970 on)")
        }
        return date
    }
}
