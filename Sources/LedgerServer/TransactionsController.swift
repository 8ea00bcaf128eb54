import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// Support's routes on the pool: `GET /v1/transactions/unmatched` (read) and
/// `POST /v1/transactions/{transactionId}/match` (admin).
struct TransactionsController {
    let desk: SupportDesk

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/v1/transactions/unmatched") { request, _ in try await search(request) }
        router.post("/v1/transactions/:transactionId/match") { request, context in try await match(request, context) }
    }

    func search(_ request: Request) async throws -> Response {
        let query = request.uri.queryParameters
        let user = try query["userId"].map { try UserID(String($0)) }
        let product = try query["productId"].map { try ProductID(String($0)) }
        let transaction = try query["transactionId"].map { try TransactionID(String($0)) }
        let after = try query["after"].map { try TransactionID(String($0)) }
        let from = try query["from"].map { try Self.date(String($0), field: "from") }
        let to = try query["to"].map { try Self.date(String($0), field: "to") }
        let limit = try OrdersController.limit(query["limit"], default: 100, maximum: 1000)
        let found = try await desk.unmatched(userId: user, productId: product, from: from, to: to, transactionId: transaction, after: after, limit: limit)
        var json: [String: Any] = ["transactions": found.map { pooled -> [String: Any] in
            [
                "transactionId": pooled.transactionId.rawValue, "userId": pooled.userId?.rawValue ?? NSNull(),
                "productId": pooled.productId.rawValue, "purchaseDate": LedgerJSON.formatDate(pooled.purchaseDate),
                "environment": pooled.environment ?? NSNull(), "appAccountToken": pooled.appAccountToken?.uuidString.lowercased() ?? NSNull(),
                "receivedAt": LedgerJSON.formatDate(pooled.receivedAt),
                "verification": pooled.verification.map(Rendering.parse) ?? NSNull(),
            ]
        }]
        json["next"] = found.count == limit ? found.last?.transactionId.rawValue ?? NSNull() : NSNull()
        return Rendering.response(.ok, json)
    }

    func match(_ request: Request, _ context: LedgerRequestContext) async throws -> Response {
        let id = try TransactionID(pathParameter(context, "transactionId"))
        let body = try await JSONBody.read(request, context: context)
        let order = try OrderID(body.requiredString("orderId"))
        let force = try body.bool("force") ?? false
        let reason = try body.string("reason")
        let matched = try await desk.match(id, to: order, force: force, reason: reason, metadata: metadata(context))
        return Rendering.response(.ok, text: Rendering.order(matched))
    }

    static func date(_ text: String, field: String) throws(LedgerInputError) -> Date {
        guard let date = LedgerJSON.parseDate(text) else {
            throw LedgerInputError(field: field, problem: "must be an ISO 8601 time such as 2026-11-21T10:00:00Z")
        }
        return date
    }
}
