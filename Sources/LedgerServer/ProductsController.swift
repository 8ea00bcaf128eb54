import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// The product catalog: `GET /v1/products` (read), `PUT /v1/products/{productId}` (admin), each
/// product with its type (and an auto-renewable one's subscription group) where the catalog says it.
struct ProductsController {
    let catalog: ProductCatalog

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/v1/products") { _, context in
            Answer(["products": try await catalog.list(apps: context.keyApps).map(ProductResponse.init)])
        }
        router.put("/v1/products/:productId") { request, context in
            // A product no order can name (orders refuse padded ids) is refused, not catalogued.
            let id = try ProductID(given: pathParameter(context, "productId"))
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
            let type = try body.type.map { text in
                guard let type = ProductType(rawValue: text) else {
                    throw LedgerInputError(field: "type", problem: "must be \(ProductType.allCases.map(\.rawValue).joined(separator: ", ")) or null")
                }
                return type
            }
            // Product ids are per app: the entry is the named app's (as the ledger spells it), else the first app's.
            // A key limited to apps names one of its apps (403 for another, held or not), or is of one app, which is then named.
            var app: BundleID?
            if let named = body.bundleId {
                try context.requireReach(bundleId: named.rawValue)
                guard let found = try await AppCatalog(database: catalog.database).app(named) else {
                    throw APIError(.badRequest, code: "unknown-app", message: "the ledger holds no app \(named)")
                }
                app = found.bundleId
            } else if let keyApps = context.keyApps {
                guard keyApps.count == 1 else {
                    throw APIError(.badRequest, code: "bundle-id-required",
                                   message: "bundleId is missing: the key reaches several apps (\(keyApps.map(\.rawValue).joined(separator: ", "))); name the product's",
                                   details: ["field": .string("bundleId")])
                }
                app = keyApps[0]
            }
            return Answer(ProductResponse(try await catalog.set(
                id, status: status, price: body.price, currency: body.currency, sampleContentProvided: body.sampleContentProvided,
                refundPreference: preference, bundleId: app, type: type, subscriptionGroup: body.subscriptionGroup)))
        }
    }

    /// The body of `PUT /v1/products/{productId}`.
    struct SetProduct: ClosedBody {
        let status: String?
        let price: String?
        let currency: String?
        let sampleContentProvided: Bool?
        let refundPreference: String?
        let bundleId: BundleID?
        let type: String?
        let subscriptionGroup: String?

        enum CodingKeys: String, CodingKey, CaseIterable {
            case status, price, currency, sampleContentProvided, refundPreference, bundleId, type, subscriptionGroup
        }
    }

    struct ProductResponse: Encodable, Sendable {
        let product: ProductCatalog.Product

        init(_ product: ProductCatalog.Product) { self.product = product }

        enum CodingKeys: String, CodingKey {
            case productId, status, price, currency, sampleContentProvided, refundPreference, updatedAt, bundleId, type, subscriptionGroup
        }

        func encode(to encoder: any Encoder) throws {
            var json = encoder.container(keyedBy: CodingKeys.self)
            try json.encode(product.productId, forKey: .productId)
            try json.encode(product.status.rawValue, forKey: .status)
            try json.encode(product.price, forKey: .price)
            try json.encode(product.currency, forKey: .currency)
            try json.encodeIfPresent(product.sampleContentProvided, forKey: .sampleContentProvided)
            try json.encodeIfPresent(product.refundPreference?.rawValue, forKey: .refundPreference)
            try json.encode(product.updatedAt, forKey: .updatedAt)
            try json.encode(product.bundleId, forKey: .bundleId)
            try json.encode(product.type, forKey: .type)
            try json.encode(product.subscriptionGroup, forKey: .subscriptionGroup)
        }
    }
}
