import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// The product catalog: `GET /v1/products` (read), `PUT /v1/products/{productId}` (admin).
struct ProductsController {
    let catalog: ProductCatalog

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/v1/products") { _, _ in
            Rendering.response(.ok, ["products": try await catalog.list().map(Self.json)])
        }
        router.put("/v1/products/:productId") { request, context in
            let id = try ProductID(pathParameter(context, "productId"))
            let body = try await JSONBody.read(request, context: context)
            let statusText = try body.string("status") ?? "active"
            guard let status = ProductCatalog.Status(rawValue: statusText) else {
                throw LedgerInputError(field: "status", problem: "must be active or retired")
            }
            let product = try await catalog.set(id, status: status, price: try body.string("price"), currency: try body.string("currency"))
            return Rendering.response(.ok, Self.json(product))
        }
    }

    static func json(_ product: ProductCatalog.Product) -> [String: Any] {
        [
            "productId": product.productId.rawValue, "status": product.status.rawValue,
            "price": product.price ?? NSNull(), "currency": product.currency ?? NSNull(),
            "updatedAt": LedgerJSON.formatDate(product.updatedAt),
        ]
    }
}
