import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// Asks Apple about subscription `originalTransactionId` (of app `bundleId`, in `environment`,
/// Apple's name, where the ledger knows it) and records what the ledger missed, once: the
/// catch-up `GET /v1/subscriptions/{originalTransactionId}?refresh=true` runs before it reads.
typealias SubscriptionRefresh = @Sendable (_ originalTransactionId: String, _ bundleId: BundleID?, _ environment: String?) async throws -> Void

/// A user's subscriptions and entitlements (read scope, issue 40): `GET /v1/users/{userId}/subscriptions`,
/// `GET /v1/subscriptions/{originalTransactionId}` and `GET /v1/users/{userId}/entitlements`. A
/// status is computed from the projection's facts at the time of the request
/// (`Subscription.status(at:)`), so a missed `EXPIRED` never keeps one active past its expiry.
struct SubscriptionsController {
    let store: SubscriptionStore
    let entitlements: EntitlementStore
    /// The apps the ledger holds: a copy, for a request that names none; the catalog, for one that names one.
    let apps: OrderApps
    let catalog: AppCatalog
    /// The catch-up `refresh=true` runs (a server without a key for Apple's API answers 503).
    let refresh: SubscriptionRefresh

    /// The statuses that entitle the user now: a paid period, or its grace period. Billing retry
    /// past the grace period does not: Apple says service may stop once a failed renewal has no
    /// grace period, and should stop when the grace period expires (`GRACE_PERIOD_EXPIRED`).
    static let entitling: Set<Subscription.Status> = [.active, .gracePeriod]

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/v1/users/:userId/subscriptions") { request, context in try await userSubscriptions(request, context) }
        router.get("/v1/subscriptions/:originalTransactionId") { request, context in try await subscription(request, context) }
        router.get("/v1/users/:userId/entitlements") { request, context in try await userEntitlements(request, context) }
    }

    func userSubscriptions(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<SubscriptionList> {
        let user = try UserID(pathParameter(context, "userId"))
        let apps = try await userApps(request, context)
        let now = Date()
        let found = try await store.subscriptions(of: user, apps: apps)
        let orders = try await entitlements.purchaseOrders(of: found.map(\.originalTransactionId))
        return Answer(SubscriptionList(userId: user, subscriptions: found.map {
            SubscriptionResponse($0, orderId: orders[$0.originalTransactionId], at: now)
        }))
    }

    func subscription(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<SubscriptionResponse> {
        let id = try Identifier.validate(pathParameter(context, "originalTransactionId"), field: "originalTransactionId")
        if try Self.flag(request.uri.queryParameters["refresh"], field: "refresh") {
            try await refreshFromApple(id, context)
        }
        // Another app's subscription is answered as one that does not exist.
        guard let found = try await store.subscription(id), context.reaches(found.bundleId) else { throw Self.notFound(id) }
        let order = try await entitlements.purchaseOrders(of: [id])[id]
        return Answer(SubscriptionResponse(found, orderId: order, at: Date(), withPeriods: true))
    }

    func userEntitlements(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<EntitlementList> {
        let user = try UserID(pathParameter(context, "userId"))
        let apps = try await userApps(request, context)
        let now = Date()
        let current = try await store.subscriptions(of: user, apps: apps).filter { Self.entitling.contains($0.status(at: now)) }
        let orders = try await entitlements.purchaseOrders(of: current.map(\.originalTransactionId))
        return Answer(EntitlementList(
            userId: user,
            subscriptions: current.map { SubscriptionResponse($0, orderId: orders[$0.originalTransactionId], at: now) },
            nonConsumables: try await entitlements.nonConsumables(of: user, apps: apps).map(NonConsumableResponse.init)))
    }

    /// Asks Apple (the catch-up) about subscription `id` in the app and environment the ledger
    /// knows it by: its own, else those of a transaction of it the ledger holds. One the ledger
    /// knows nothing of, or of an app the key does not reach, is not found, and Apple is not asked.
    func refreshFromApple(_ id: String, _ context: LedgerRequestContext) async throws {
        let origin: (bundleId: BundleID?, environment: String?)
        if let known = try await store.subscription(id) {
            origin = (known.bundleId, known.environment)
        } else if let found = try await entitlements.origin(of: id) {
            origin = found
        } else {
            throw Self.notFound(id)
        }
        guard context.reaches(origin.bundleId) else { throw Self.notFound(id) }
        do {
            try await AppStoreServerAPI.$patience.withValue(APIError.interactivePatience) {
                try await refresh(id, origin.bundleId, origin.environment)
            }
        } catch let error as AppStoreServerAPIError {
            if error.code == "apple-api-no-key" { throw APIError.appleAPINotConfigured }
            throw APIError.from(error)
        } catch let error as AppleVerificationError {
            // What Apple answered did not verify: Apple's answer refused, named by the check's
            // code (verification that cannot run now: try again later).
            throw APIError(error.isRetryable ? .serviceUnavailable : .badGateway, code: error.code, message: "Apple's answer did not verify: \(error.message)")
        }
    }

    func userApps(_ request: Request, _ context: LedgerRequestContext) async throws -> [BundleID]? {
        try await context.userApps(named: request.uri.queryParameters["bundleId"], apps: apps, catalog: catalog)
    }

    /// `true` or `false` (absent: false); anything else is a 400 naming `field`.
    static func flag(_ text: Substring?, field: String) throws(LedgerInputError) -> Bool {
        guard let text else { return false }
        switch text {
        case "false": return false
        case "true": return true
        default: throw LedgerInputError(field: field, problem: "must be true or false")
        }
    }

    static func notFound(_ id: String) -> APIError {
        APIError(.notFound, code: "subscription-not-found", message: "the ledger holds no subscription \(id)")
    }
}
