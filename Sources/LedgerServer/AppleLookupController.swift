import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerServices
import LedgerStore
import Logging

/// `POST /v1/apple-orders/{appleOrderId}/lookup?bundleId=` (admin): support's lookup of the order
/// id on a customer's Apple receipt e-mail. Apple's Look Up Order ID names the purchases; each
/// signed transaction is checked as a client's proof is and taken through the same intake (tied
/// by its `appAccountToken`, else into the pool with the user given), and the answer says what
/// became of each. Apple answers per app, with the app's key: `bundleId` names it, required once
/// the ledger holds several apps.
struct AppleLookupController {
    let lookup: AppleOrderLookup
    let api: LazyAppStoreServerAPI
    let apps: AppCatalog

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/apple-orders/:appleOrderId/lookup") { request, context in try await look(request, context) }
    }

    func look(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<AppleOrderLookup.Found> {
        let orderID = try pathParameter(context, "appleOrderId")
        try AppleOrderLookup.check(orderID)
        let userID = try await OptionalUserBody.user(of: request, context)
        let app = try await Self.app(request.uri.queryParameters["bundleId"].map(String.init), in: apps)
        guard try await api.anyKey() else { throw APIError.appleAPINotConfigured }
        do {
            return Answer(try await AppStoreServerAPI.$patience.withValue(APIError.interactivePatience) {
                try await lookup.look(up: orderID, user: userID, app: app, metadata: context.eventMetadata)
            })
        } catch let error as AppStoreServerAPIError {
            if error.code == "apple-api-no-key" {
                throw APIError(.serviceUnavailable, code: "apple-api-not-configured", message: error.description)
            }
            throw APIError.from(error)
        }
    }

    /// The app a request that asks Apple names (`bundleId`, any case): optional while the ledger
    /// holds at most one app (nil: that one), required once it holds several (400
    /// `bundle-id-required`); an app it does not hold is 400 `unknown-app`.
    static func app(_ given: String?, in apps: AppCatalog) async throws -> BundleID? {
        guard let given else {
            let held = try await apps.list()
            guard held.count <= 1 else {
                throw APIError(.badRequest, code: "bundle-id-required", message: "the ledger holds \(held.count) apps: name one with bundleId (\(held.map(\.bundleId.rawValue).joined(separator: ", ")))")
            }
            return held.first?.bundleId
        }
        let id = try BundleID(given)
        guard let app = try await apps.app(id) else {
            throw APIError(.badRequest, code: "unknown-app", message: "the ledger holds no app \(given)")
        }
        return app.bundleId
    }
}
