import Foundation

extension AppStoreServerAPI {
    /// What an answer of Apple's means for its request.
    public enum Verdict: Sendable, Equatable {
        case success
        /// 429: after its `Retry-After`, or with backoff when it gives none.
        case rateLimited
        /// 5xx, or an `errorCode` Apple documents as worth trying again: with backoff.
        case retryable
        /// 401: the token (key, ids, bundle id) is wrong; no retry helps until the operator mends it.
        case unauthorized
        /// Any other refusal: Apple's answer to this request.
        case final
    }

    /// Apple's error codes that say "try again" whatever their HTTP status (404 for the first
    /// three, 500 for the last): AccountNotFoundRetryableError, AppNotFoundRetryableError,
    /// OriginalTransactionIdNotFoundRetryableError, GeneralInternalRetryableError.
    public static let retryableErrorCodes: Set<Int> = [4_040_002, 4_040_004, 4_040_006, 5_000_001]

    /// How the client treats an answer with `status` and Apple's `errorCode`.
    public static func verdict(status: Int, appleErrorCode: Int?) -> Verdict {
        if (200...299).contains(status) { return .success }
        if let code = appleErrorCode, retryableErrorCodes.contains(code) { return .retryable }
        switch status {
        case 429: return .rateLimited
        case 500...599: return .retryable
        // Apple's 404s always name an errorCode: one without is no answer of Apple's about the
        // request (a proxy's, a base URL mistyped), to be asked again rather than taken as final.
        case 404 where appleErrorCode == nil: return .retryable
        case 401: return .unauthorized
        default: return .final
        }
    }

    /// The wait after the `failures`-th failure in a row: `settings.backoff`, doubled with each
    /// failure after the first, at most `settings.longestBackoff`.
    public static func backoff(after failures: Int, _ settings: Settings) -> Duration {
        AppleReceipts.backoff(after: failures, first: settings.backoff, cap: settings.longestBackoff)
    }

    /// ", Apple error N (its message)" for an answer that carried Apple's error, else nothing.
    static func naming(_ apple: AppleError?) -> String {
        guard let apple, apple.errorCode != nil || apple.errorMessage != nil else { return "" }
        let code = apple.errorCode.map { ", Apple error \($0)" } ?? ", Apple error without a code"
        return code + (apple.errorMessage.map { " (\($0))" } ?? "")
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}
