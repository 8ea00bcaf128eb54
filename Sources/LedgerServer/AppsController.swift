import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// The apps the ledger serves (admin scope): `GET /v1/apps` (a key limited to apps lists those),
/// `POST /v1/apps`, `PATCH /v1/apps/{bundleId}` (a key of every app). No answer holds a secret: an app's shared secret and private key
/// are shown as `hasSharedSecret` and `hasApiKey`, the key by its ids and where it is kept.
struct AppsController {
    let catalog: AppCatalog
    /// The apps new orders are checked against, told when they change.
    let directory: OrderApps
    /// Told after each change, so that this server's verifier reads the apps again at once.
    var changed: @Sendable () -> Void = {}

    func addRoutes(to router: Router<LedgerRequestContext>) {
        // A key limited to apps sees those alone; changing apps needs a key of every app (AuthMiddleware).
        router.get("/v1/apps") { _, context in
            Answer(["apps": try await catalog.list(only: context.keyApps).map(AppResponse.init)])
        }
        router.post("/v1/apps") { request, context in
            let body = try await request.decode(as: AppRequest.self, context: context)
            guard let id = body.bundleId else { throw LedgerInputError(field: "bundleId", problem: "is missing") }
            defer { directory.forget(); changed() }
            return Answer(.created, AppResponse(try await catalog.add(id, body.changes)))
        }
        router.patch("/v1/apps/:bundleId") { request, context in
            let id = try BundleID(pathParameter(context, "bundleId"))
            let body = try await request.decode(as: AppRequest.self, context: context)
            if body.bundleId != nil {
                throw LedgerInputError(field: "bundleId", problem: "cannot be changed: an app is its bundle id (add the other one as an app of its own)")
            }
            defer { directory.forget(); changed() }
            return Answer(AppResponse(try await catalog.change(id, body.changes)))
        }
    }
}

/// An app as the API shows it.
struct AppResponse: Encodable, Sendable {
    let app: App

    init(_ app: App) { self.app = app }

    enum CodingKeys: String, CodingKey {
        case bundleId, appAppleId, environments, refundPreference, appAccountTokens, sku, retired, hasSharedSecret, hasApiKey, apiKey, createdAt, updatedAt
    }

    enum KeyCodingKeys: String, CodingKey { case issuerId, keyId, privateKeySource }

    func encode(to encoder: any Encoder) throws {
        var json = encoder.container(keyedBy: CodingKeys.self)
        try json.encode(app.bundleId, forKey: .bundleId)
        try json.encode(app.appAppleId, forKey: .appAppleId)
        try json.encode(app.environments.map(\.rawValue), forKey: .environments)
        try json.encode(app.refundPreference?.rawValue, forKey: .refundPreference)
        try json.encode(app.appAccountTokens.rawValue, forKey: .appAccountTokens)
        try json.encode(app.sku, forKey: .sku)
        try json.encode(app.retired, forKey: .retired)
        try json.encode(app.hasSharedSecret, forKey: .hasSharedSecret)
        try json.encode(app.apiKey != nil, forKey: .hasApiKey)
        if let key = app.apiKey {
            var nested = json.nestedContainer(keyedBy: KeyCodingKeys.self, forKey: .apiKey)
            try nested.encode(key.issuerId, forKey: .issuerId)
            try nested.encode(key.keyId, forKey: .keyId)
            try nested.encode(key.privateKeyReference?.description ?? "stored", forKey: .privateKeySource)
        } else {
            try json.encodeNil(forKey: .apiKey)
        }
        try json.encode(app.createdAt, forKey: .createdAt)
        try json.encode(app.updatedAt, forKey: .updatedAt)
    }
}
