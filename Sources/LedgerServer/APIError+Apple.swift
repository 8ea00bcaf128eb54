import AppleReceipts
import Hummingbird

extension APIError {
    /// An App Store Server API failure as the ledger's answer: Apple's "no such order" a 404,
    /// Apple busy or away a 503, as is an app's key the ledger cannot use (its own setup: Apple
    /// was not asked, as without a key), anything else Apple refused a 502; the code is the client's.
    static func from(_ error: AppStoreServerAPIError) -> APIError {
        let status: HTTPResponse.Status = if ["apple-order-not-found", "apple-api-not-found"].contains(error.code) {
            .notFound
        } else if ["apple-api-key-invalid", "app-key-unavailable"].contains(error.code) {
            .serviceUnavailable
        } else {
            error.isAppleAway ? .serviceUnavailable : .badGateway
        }
        // When Apple said when it takes requests again, the client is told too.
        let retryAfter = error.retryAt.map { String(max(1, Int($0.timeIntervalSinceNow.rounded(.up)))) }
        return APIError(status, code: error.code, message: error.description, headers: retryAfter.map { [.retryAfter: $0] } ?? [:])
    }

    /// How long an interactive route waits out Apple's rate limit before answering 503 with
    /// Apple's `Retry-After` (`AppStoreServerAPI.patience`).
    static let interactivePatience: Duration = .seconds(10)

    /// The answer of a route that asks Apple when no app has an In-App Purchase key.
    static let appleAPINotConfigured = APIError(
        .serviceUnavailable, code: "apple-api-not-configured",
        message: "the App Store Server API is not configured: no app has a key (LEDGER_APPLE_API_KEY_ID, LEDGER_APPLE_API_ISSUER_ID, LEDGER_APPLE_API_PRIVATE_KEY, or `ledger apps set` with the key)")
}
