import Foundation

extension AppStoreServerAPI {
    /// An endpoint of the App Store Server API the client calls: Apple limits requests per
    /// endpoint, so each has a budget of its own.
    public enum Endpoint: String, CaseIterable, Sendable {
        case transactionHistory, lookUpOrder, consumption, notificationHistory, refundHistory, finishTransaction, setAppAccountToken
        case subscriptionStatuses

        /// Apple's documented production limit in requests per second (enforced per hour, per
        /// app), from "Identifying rate limits"; the sandbox allows a tenth.
        public var productionLimit: Double {
            switch self {
            case .transactionHistory, .consumption, .notificationHistory, .finishTransaction, .subscriptionStatuses: 50
            case .setAppAccountToken: 20
            case .lookUpOrder, .refundHistory: 10
            }
        }

        /// The endpoint a request path is for. Derived from the path, the one thing every
        /// request has, so that no endpoint can be called outside its budget; an unknown path
        /// takes the tightest budget.
        public init(path: String) {
            self = if path.hasPrefix("/inApps/v2/history/") { .transactionHistory }
                else if path.hasPrefix("/inApps/v1/lookup/") { .lookUpOrder }
                else if path.hasPrefix("/inApps/v2/transactions/consumption/") || path.hasPrefix("/inApps/v1/transactions/consumption/") { .consumption }
                else if path.hasPrefix("/inApps/v1/notifications/history") { .notificationHistory }
                else if path.hasPrefix("/inApps/v2/refund/lookup/") || path.hasPrefix("/inApps/v1/refund/lookup/") { .refundHistory }
                else if path.hasSuffix("/appAccountToken") { .setAppAccountToken }
                else if path.hasSuffix("/finish") { .finishTransaction }
                // Extend a Subscription Renewal Date shares the prefix, not the budget.
                else if path.hasPrefix("/inApps/v1/subscriptions/"), !path.hasPrefix("/inApps/v1/subscriptions/extend/") { .subscriptionStatuses }
                else { .lookUpOrder }
        }
    }

    /// Requests per second each endpoint may take from one client.
    public struct RequestBudgets: Sendable, Equatable {
        public var perSecond: [Endpoint: Double]

        public init(perSecond: [Endpoint: Double]) {
            self.perSecond = perSecond
        }

        /// Apple's documented limits in `environment` (the sandbox's a tenth of production's),
        /// none above `ceiling`.
        public static func apple(_ environment: AppleEnvironment, atMost ceiling: Double = .infinity) -> Self {
            let share = environment == .production ? 1.0 : 0.1
            return Self(perSecond: Dictionary(uniqueKeysWithValues: Endpoint.allCases.map { ($0, min($0.productionLimit * share, ceiling)) }))
        }

        /// The same rate for every endpoint (a stand-in's, which has no limits of Apple's).
        public static func uniform(_ perSecond: Double) -> Self {
            Self(perSecond: Dictionary(uniqueKeysWithValues: Endpoint.allCases.map { ($0, perSecond) }))
        }

        public func rate(_ endpoint: Endpoint) -> Double { perSecond[endpoint] ?? Endpoint.lookUpOrder.productionLimit / 10 }
    }
}

/// Spaces the starts of each endpoint's requests `1 / rate` apart, across every caller of one
/// client; one endpoint's queue never delays another's.
public actor RequestPace {
    private let budgets: AppStoreServerAPI.RequestBudgets
    private var nextStart: [AppStoreServerAPI.Endpoint: ContinuousClock.Instant] = [:]

    public init(_ budgets: AppStoreServerAPI.RequestBudgets) {
        self.budgets = budgets
    }

    /// Takes the next start for `endpoint` and says how long from now it is.
    public func reserve(_ endpoint: AppStoreServerAPI.Endpoint) -> Duration {
        let now = ContinuousClock.now
        let start = max(now, nextStart[endpoint] ?? now)
        nextStart[endpoint] = start + .seconds(1 / max(budgets.rate(endpoint), 0.001))
        return start - now
    }

    /// Waits for `endpoint`'s next start.
    func next(_ endpoint: AppStoreServerAPI.Endpoint) async {
        let wait = reserve(endpoint)
        if wait > .zero { try? await Task.sleep(for: wait) }
    }
}
