import Foundation
import LedgerCore

/// One subscription of Get All Subscription Statuses' answer, its signed parts verified.
public struct VerifiedSubscriptionStatus: Sendable, Equatable {
    public var subscriptionGroupIdentifier: String?
    /// Apple's status: 1 active, 2 expired, 3 billing retry, 4 grace period, 5 revoked.
    public var status: Int?
    public var originalTransactionId: String
    /// The subscription's latest transaction.
    public var transaction: AppleTransaction?
    public var revocation: Revocation?
    public var renewalInfo: VerifiedRenewalInfo?
}

extension AppleProofVerifier {
    /// Apple's answer to Get All Subscription Statuses, checked as a notification is: the app it
    /// names (bundle id, an environment the app accepts, and in production the app's Apple id),
    /// then each subscription's signed transaction (verified as a client's proof) and renewal info
    /// (`renewalInfo(signed:app:)`), both about the subscription the entry names and from the
    /// answer's environment. Any part that does not verify refuses the whole answer: what Apple
    /// signed is never taken in part.
    public func subscriptionStatuses(
        _ response: AppStoreServerAPI.StatusResponse
    ) async throws(AppleVerificationError) -> [VerifiedSubscriptionStatus] {
        let part = "Apple's subscription statuses are"
        let app = try await heldApp(for: response.bundleId, environment: response.environment, part: part)
        if let expected = app.bundleId, response.bundleId?.lowercased() != expected.lowercased() {
            throw AppleVerificationError(
                code: "wrong-bundle-id", message: "\(part) for bundle \"\(response.bundleId ?? "")\", not \"\(expected)\"")
        }
        guard let environment = response.environment, app.accepts(environment) else {
            throw AppleVerificationError(
                code: "wrong-environment",
                message: "\(part) from the \(response.environment ?? "unnamed") environment; \(app.accepting)")
        }
        if app.checksAppAppleId(environment), let expected = app.appAppleId, response.appAppleId != expected {
            throw AppleVerificationError(
                code: "wrong-app-id", message: "\(part) for app id \(response.appAppleId.map(String.init) ?? "none"), not \(expected)")
        }
        var verified: [VerifiedSubscriptionStatus] = []
        for group in response.data ?? [] {
            for item in group.lastTransactions ?? [] {
                guard let original = item.originalTransactionId, !original.isEmpty else {
                    throw .malformed("an entry of Apple's subscription statuses names no originalTransactionId")
                }
                var status = VerifiedSubscriptionStatus(
                    subscriptionGroupIdentifier: group.subscriptionGroupIdentifier, status: item.status, originalTransactionId: original)
                if let signed = item.signedTransactionInfo {
                    let (transaction, revocation) = try await transactionAndRevocation(signed: signed)
                    guard transaction.originalTransactionId == original else {
                        throw AppleVerificationError(
                            code: "subscription-status-mismatch",
                            message: "Apple's status of subscription \(original) carries a transaction of \(transaction.originalTransactionId ?? "no subscription")")
                    }
                    try Self.sameEnvironment(transaction.environment, environment, "its transaction")
                    (status.transaction, status.revocation) = (transaction, revocation)
                }
                if let signed = item.signedRenewalInfo {
                    let info = try await renewalInfo(signed: signed, app: app, originalTransactionId: original)
                    try Self.sameEnvironment(info.environment, environment, "its renewal info")
                    status.renewalInfo = info
                }
                verified.append(status)
            }
        }
        return verified
    }

    /// A signed part of an answer must come from the answer's environment.
    private static func sameEnvironment(_ signed: String, _ answer: String, _ part: String) throws(AppleVerificationError) {
        guard signed.lowercased() == answer.lowercased() else {
            throw AppleVerificationError(
                code: "wrong-environment", message: "Apple's subscription statuses are from the \(answer) environment, and \(part) from \(signed)")
        }
    }
}
