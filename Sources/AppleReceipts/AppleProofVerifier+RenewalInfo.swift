import Foundation
import LedgerCore

/// A subscription's signed renewal info (Apple's JWSRenewalInfoDecodedPayload), the fields the
/// ledger reads. It names no bundle or app: it is checked against the app of the notification or
/// answer that carried it.
public struct SignedRenewalInfoPayload: AppleSignedPayload, Equatable {
    public var dates: KeyValuePairs<String, Int64?> {
        ["signedDate": signedDate, "gracePeriodExpiresDate": gracePeriodExpiresDate, "renewalDate": renewalDate,
         "recentSubscriptionStartDate": recentSubscriptionStartDate]
    }
    public var originalTransactionId: String?
    public var autoRenewProductId: String?
    public var productId: String?
    /// Apple's `autoRenewStatus`: 1 renews at the end of the period, 0 does not.
    public var autoRenewStatus: Int?
    /// 1 cancelled, 2 billing error, 3 price increase refused, 4 product not for sale, 5 other.
    public var expirationIntent: Int?
    /// Milliseconds since 1970, as every date Apple signs.
    public var gracePeriodExpiresDate: Int64?
    public var isInBillingRetryPeriod: Bool?
    /// 0 the customer has not answered a price increase, 1 accepted it.
    public var priceIncreaseStatus: Int?
    public var renewalDate: Int64?
    public var recentSubscriptionStartDate: Int64?
    public var offerType: Int?
    public var offerIdentifier: String?
    public var environment: String?
    public var signedDate: Int64
    public var appAccountToken: String?
    public var appTransactionId: String?
    public var currency: String?
    /// Milli-units of `currency`.
    public var renewalPrice: Int64?

    public init(
        originalTransactionId: String?, autoRenewProductId: String? = nil, productId: String? = nil, autoRenewStatus: Int? = 1,
        expirationIntent: Int? = nil, gracePeriodExpiresDate: Int64? = nil, isInBillingRetryPeriod: Bool? = false,
        priceIncreaseStatus: Int? = nil, renewalDate: Int64? = nil, recentSubscriptionStartDate: Int64? = nil, offerType: Int? = nil,
        offerIdentifier: String? = nil, environment: String?, signedDate: Int64, appAccountToken: String? = nil,
        appTransactionId: String? = nil, currency: String? = nil, renewalPrice: Int64? = nil
    ) {
        self.originalTransactionId = originalTransactionId
        self.autoRenewProductId = autoRenewProductId
        self.productId = productId
        self.autoRenewStatus = autoRenewStatus
        self.expirationIntent = expirationIntent
        self.gracePeriodExpiresDate = gracePeriodExpiresDate
        self.isInBillingRetryPeriod = isInBillingRetryPeriod
        self.priceIncreaseStatus = priceIncreaseStatus
        self.renewalDate = renewalDate
        self.recentSubscriptionStartDate = recentSubscriptionStartDate
        self.offerType = offerType
        self.offerIdentifier = offerIdentifier
        self.environment = environment
        self.signedDate = signedDate
        self.appAccountToken = appAccountToken
        self.appTransactionId = appTransactionId
        self.currency = currency
        self.renewalPrice = renewalPrice
    }

    /// What the ledger keeps of it.
    public var renewalInfo: RenewalInfo {
        RenewalInfo(
            autoRenew: autoRenewStatus.map { $0 == 1 }, autoRenewProductId: autoRenewProductId, productId: productId,
            expirationIntent: expirationIntent, gracePeriodExpiresDate: gracePeriodExpiresDate.map(Date.init(millisecondsSince1970:)),
            isInBillingRetryPeriod: isInBillingRetryPeriod, priceIncreaseStatus: priceIncreaseStatus,
            renewalDate: renewalDate.map(Date.init(millisecondsSince1970:)), signedDate: signedAt)
    }
}

/// Renewal info whose chain, signature and environment verified: the subscription it is about
/// and what it says.
public struct VerifiedRenewalInfo: Sendable, Equatable {
    public var originalTransactionId: String
    public var environment: String
    public var info: RenewalInfo

    public init(originalTransactionId: String, environment: String, info: RenewalInfo) {
        self.originalTransactionId = originalTransactionId
        self.environment = environment
        self.info = info
    }
}

extension AppleProofVerifier {
    /// A subscription's `signedRenewalInfo` (from a notification or Get All Subscription
    /// Statuses), verified with the chain rules of a transaction and checked against `app`, the
    /// app of what carried it (renewal info names no bundle): its environment must be one the app
    /// accepts, as Apple's `verifyAndDecodeRenewalInfo` checks. With `originalTransactionId`, it
    /// must be about that subscription (`renewal-info-mismatch` otherwise): renewal info is only
    /// ever recorded on the subscription it names.
    public func renewalInfo(
        signed jws: String, app: App, originalTransactionId expected: String? = nil
    ) async throws(AppleVerificationError) -> VerifiedRenewalInfo {
        let payload = try await signedData.verify(jws, as: SignedRenewalInfoPayload.self)
        guard let environment = payload.environment, app.accepts(environment) else {
            throw AppleVerificationError(
                code: "wrong-environment",
                message: "the renewal info is from the \(payload.environment ?? "unnamed") environment; \(app.accepting)")
        }
        guard let original = payload.originalTransactionId, !original.isEmpty else {
            throw .malformed("the renewal info has no originalTransactionId, so it names no subscription")
        }
        if let expected, original != expected {
            throw AppleVerificationError(
                code: "renewal-info-mismatch",
                message: "the renewal info is for subscription \(original), and the transaction beside it for \(expected)")
        }
        return VerifiedRenewalInfo(originalTransactionId: original, environment: environment, info: payload.renewalInfo)
    }
}
