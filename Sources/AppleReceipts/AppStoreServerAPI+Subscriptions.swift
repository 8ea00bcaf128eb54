import Foundation
import NIOHTTP1

extension AppStoreServerAPI {
    /// Get All Subscription Statuses: every auto-renewable subscription of the customer that
    /// `transactionID` (any of their transaction ids) belongs to, by subscription group, each with
    /// Apple's status and its latest signed transaction and renewal info. `statuses`: only those
    /// with these of Apple's statuses (1 active, 2 expired, 3 billing retry, 4 grace period,
    /// 5 revoked); none, all. The signed parts are returned as Apple sent them: the caller checks
    /// them with `AppleProofVerifier.subscriptionStatuses(_:)`.
    public func subscriptionStatuses(_ transactionID: String, statuses: [Int] = []) async throws(AppStoreServerAPIError) -> StatusResponse {
        try await fetch(.GET, "/inApps/v1/subscriptions/\(Self.pathSegment(transactionID))", query: statuses.map { ("status", String($0)) })
    }

    /// Get All Subscription Statuses' answer (Apple's StatusResponse).
    public struct StatusResponse: Codable, Sendable, Equatable {
        public var environment: String?
        public var bundleId: String?
        public var appAppleId: Int64?
        public var data: [SubscriptionGroupIdentifierItem]?

        public init(environment: String?, bundleId: String?, appAppleId: Int64? = nil, data: [SubscriptionGroupIdentifierItem]?) {
            self.environment = environment
            self.bundleId = bundleId
            self.appAppleId = appAppleId
            self.data = data
        }
    }

    /// One subscription group's subscriptions (Apple's SubscriptionGroupIdentifierItem).
    public struct SubscriptionGroupIdentifierItem: Codable, Sendable, Equatable {
        public var subscriptionGroupIdentifier: String?
        public var lastTransactions: [LastTransactionsItem]?

        public init(subscriptionGroupIdentifier: String?, lastTransactions: [LastTransactionsItem]?) {
            self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
            self.lastTransactions = lastTransactions
        }
    }

    /// One subscription of a group, own or family-shared (Apple's LastTransactionsItem).
    public struct LastTransactionsItem: Codable, Sendable, Equatable {
        /// Apple's status: 1 active, 2 expired, 3 billing retry, 4 grace period, 5 revoked.
        public var status: Int?
        public var originalTransactionId: String?
        public var signedTransactionInfo: String?
        public var signedRenewalInfo: String?

        public init(status: Int?, originalTransactionId: String?, signedTransactionInfo: String?, signedRenewalInfo: String?) {
            self.status = status
            self.originalTransactionId = originalTransactionId
            self.signedTransactionInfo = signedTransactionInfo
            self.signedRenewalInfo = signedRenewalInfo
        }
    }
}
