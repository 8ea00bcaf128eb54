import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// The product catalog: `GET /v1/products` (read), `PUT /v1/products/{productId}` (admin).
struct ProductsController {
    let catalog: ProductCatalog

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/v1/products") { _, context in
            Answer(["products": try await catalog.list(apps: context.keyApps).map(ProductResponse.init)])
        }
        router.put("/v1/products/:productId") { request, context in
            let id = try ProductID(pathParameter(context, "productId"))
            let body = try await request.decode(as: SetProduct.self, context: context)
            let statusText = body.status ?? "active"
            guard let status = ProductCatalog.Status(rawValue: statusText) else {
                throw LedgerInputError(field: "status", problem: "must be active or retired")
            }
            let preference = try body.refundPreference.map { text in
                guard let preference = RefundPreference(rawValue: text) else {
                    throw LedgerInputError(field: "refundPreference", problem: "must be DECLINE, GRANT_FULL or GRANT_PRORATED")
                }
                return preference
            }
            // Without an app named, the product is the ledger's first app's: a key of one app sets
            // its own app's, a key of several apps cannot say which (docs/apps.md).
            var app: BundleID?
            if let keyApps = context.keyApps {
                guard keyApps.count == 1 else {
                    throw APIError(.forbidden, code: "all-apps-key-required",
                                   message: "a key of several apps cannot say which app's product this is; use a key of one app or of every app",
                                   details: ["apps": .strings(keyApps.map(\.rawValue))])
                }
                app = keyApps[0]
            }
            return Answer(ProductResponse(try await catalog.set(
                id, status: status, price: body.price, currency: body.currency, sampleContentProvided: body.sampleContentProvided,
                refundPreference: preference, bundleId: app)))
        }
    }

    /// The body of `PUT /v1/products/{productId}`.
    struct SetProduct: Decodable {
        let status: String?
        let price: String?
        let currency: String?
        let sampleContentProvided: Bool?
        let refundPreference: String?
    }

    struct ProductResponse: Encodable, Sendable {
        let product: ProductCatalog.Product

        init(_ product: ProductCatalog.Product) { self.product = product }

        enum CodingKeys: String, CodingKey { case productId, status, price, currency, sampleContentProvided, refundPreference, updatedAt }

        func encode(to encoder: any Encoder) throws {
            var json = encoder.container(keyedBy: CodingKeys.self)
            try json.encode(product.productId, forKey: .productId)
            try json.encode(product.status.rawValue, forKey: .status)
            try json.encode(product.price, forKey: .price)
            try json.encode(product.currency, forKey: .currency)
            try json.encodeIfPresent(product.sampleContentProvided, forKey: .sampleContentProvided)
            try json.encodeIfPresent(product.refundPreference?.rawValue, forKey: .refundPreference)
            try json.encode(product.updatedAt, forKey: .updatedAt)
        }
    }
}
