import AsyncHTTPClient
import Foundation
import JWTKit
import Logging
import NIOCore
import NIOHTTP1

/// A client of the App Store Connect API's sales reports (`GET /v1/salesReports`): each request
/// authorised by an ES256 JWT made with a Team API key of the Sales or Finance role (audience
/// `appstoreconnect-v1`, at most 20 minutes, reused until shortly before it expires), retried as
/// the App Store Server API client retries: 429 after its `Retry-After` (seconds, or an HTTP date;
/// backoff when it gives none), 5xx and no answer with backoff, within a bounded number of tries.
/// Apple's "no sales for the date" is an empty day and "not available yet" a day asked again
/// later, not errors.
public final class AppStoreConnectAPI: Sendable {
    public struct Settings: Sendable {
        /// The Team API key's id (`kid`), its issuer id (`iss`) and the key (PKCS #8 PEM).
        public var keyID: String
        public var issuerID: String
        public var privateKeyPEM: String
        /// The vendor number the reports are of.
        public var vendorNumber: String
        /// The sales report's version (`filter[version]`).
        public var version: String
        /// Apple's base URL, or a stand-in's.
        public var baseURL: String
        public var timeout: TimeAmount
        public var attempts: Int
        public var longestWait: Duration
        public var backoff: Duration
        public var longestBackoff: Duration

        public init(
            keyID: String, issuerID: String, privateKeyPEM: String, vendorNumber: String, version: String = "1_0",
            baseURL: String = AppStoreConnectAPI.appleURL, timeout: TimeAmount = .seconds(60), attempts: Int = 5,
            longestWait: Duration = .seconds(300), backoff: Duration = .milliseconds(500), longestBackoff: Duration = .seconds(8)
        ) {
            self.keyID = keyID
            self.issuerID = issuerID
            self.privateKeyPEM = privateKeyPEM
            self.vendorNumber = vendorNumber
            self.version = version
            self.baseURL = baseURL
            self.timeout = timeout
            self.attempts = attempts
            self.longestWait = longestWait
            self.backoff = backoff
            self.longestBackoff = longestBackoff
        }
    }

    /// Apple's host.
    public static let appleURL = "https://api.appstoreconnect.apple.com"
    /// Apple refuses a token of this API that expires more than 20 minutes into the future by
    /// its own clock: one of 15 minutes, issued a minute back, is taken from a server whose clock
    /// is up to five minutes ahead of Apple's.
    static let tokenLifetime: TimeInterval = 15 * 60
    static let tokenBackdated: TimeInterval = 60

    /// A day's daily sales report, as Apple answered.
    public enum DailyReport: Sendable, Equatable {
        /// The report file as Apple sent it (gzip'd, tab-separated).
        case report(Data)
        /// Apple counted no sales that day.
        case noSales
        /// Apple has not published the day yet (it does the next morning, Pacific time).
        case notYetPublished
    }

    public let settings: Settings
    let httpClient: HTTPClient
    let logger: Logger
    private let token: AppleAPIToken

    /// Fails when the key is not a P-256 private key in PEM.
    public init(settings: Settings, httpClient: HTTPClient = .apple, logger: Logger) async throws(AppStoreConnectError) {
        self.settings = settings
        self.httpClient = httpClient
        self.logger = logger
        let key: ES256PrivateKey
        do { key = try ES256PrivateKey(pem: settings.privateKeyPEM) } catch {
            throw AppStoreConnectError(code: "app-store-connect-key-invalid", message: "the App Store Connect API key is not a P-256 private key in PEM (\(SignedDataVerifier.reason(error)))")
        }
        token = await AppleAPIToken(keyID: settings.keyID, key: key)
    }

    /// The SALES / SUMMARY / DAILY report of `day` (`YYYY-MM-DD`, the report's own day).
    public func dailySalesReport(_ day: String) async throws(AppStoreConnectError) -> DailyReport {
        let query = [
            ("filter[frequency]", "DAILY"), ("filter[reportDate]", day), ("filter[reportSubType]", "SUMMARY"),
            ("filter[reportType]", "SALES"), ("filter[vendorNumber]", settings.vendorNumber), ("filter[version]", settings.version),
        ]
        // The filters' brackets as Apple's documentation writes them; the values percent-encoded.
        let allowed = CharacterSet.alphanumerics.union(CharacterSet(charactersIn: "-._~"))
        let url = settings.baseURL.trimmingSuffix("/") + "/v1/salesReports?"
            + query.map { "\($0.0)=\($0.1.addingPercentEncoding(withAllowedCharacters: allowed) ?? $0.1)" }.joined(separator: "&")
        var failures = 0
        while true {
            let bearer = try await bearerToken()
            var request = HTTPClientRequest(url: url)
            request.method = .GET
            request.headers.add(name: "Authorization", value: "Bearer \(bearer)")
            request.headers.add(name: "Accept", value: "application/a-gzip")
            let answer: HTTPClient.AppleAnswer
            do {
                answer = try await httpClient.answer(request, timeout: settings.timeout, limit: 256 * 1024 * 1024, logger: logger)
            } catch {
                failures += 1
                guard failures < settings.attempts else {
                    throw AppStoreConnectError(code: "app-store-connect-unreachable", message: "the App Store Connect API could not be reached for \(day) (\(SignedDataVerifier.reason(error))), \(failures) times")
                }
                try await sleep(backoff(after: failures))
                continue
            }
            let (status, retryAfter, body) = (answer.status, answer.retryAfter, answer.body)
            if (200...299).contains(status) { return .report(Data(buffer: body)) }
            let detail = Self.detail(of: body)
            switch status {
            case 404 where detail.lowercased().contains("no sales"):
                return .noSales
            case 404 where detail.lowercased().contains("not available yet"):
                return .notYetPublished
            case 401:
                await token.clear()
                throw AppStoreConnectError(code: "app-store-connect-unauthorized", message: "the App Store Connect API refused the token (check LEDGER_APP_STORE_CONNECT_KEY_ID, _ISSUER_ID and the key)\(detail.isEmpty ? "" : ": \(detail)")", status: status)
            case 403:
                throw AppStoreConnectError(code: "app-store-connect-forbidden", message: "the App Store Connect API key may not read sales reports (it needs the Sales or Finance role)\(detail.isEmpty ? "" : ": \(detail)")", status: status)
            case 429:
                failures += 1
                let wait = Self.wait(retryAfter) ?? backoff(after: failures)
                guard wait <= settings.longestWait, failures < settings.attempts else {
                    throw AppStoreConnectError(code: "app-store-connect-rate-limited", message: "the App Store Connect API takes no more requests for now (\(failures) tries for \(day))", status: 429)
                }
                logger.info("App Store Connect API rate limit: waiting", metadata: ["apple.wait_seconds": "\(AppStoreServerAPI.seconds(wait))"])
                try await sleep(wait)
            case 500...599:
                failures += 1
                guard failures < settings.attempts else {
                    throw AppStoreConnectError(code: "app-store-connect-unavailable", message: "the App Store Connect API answered HTTP \(status) for \(day), \(failures) times", status: status)
                }
                try await sleep(backoff(after: failures))
            default:
                throw AppStoreConnectError(code: "app-store-connect-refused", message: "the App Store Connect API refused the sales report of \(day): HTTP \(status)\(detail.isEmpty ? "" : ": \(detail)")", status: status)
            }
        }
    }

    /// The `detail` (else `title`) of the first of Apple's errors (`{"errors": [...]}`).
    static func detail(of body: ByteBuffer) -> String {
        struct Errors: Decodable {
            struct Item: Decodable {
                var code: String?
                var title: String?
                var detail: String?
            }
            var errors: [Item]
        }
        guard let errors = try? JSONDecoder().decode(Errors.self, from: Data(buffer: body)), let first = errors.errors.first else { return "" }
        return first.detail ?? first.title ?? first.code ?? ""
    }

    /// A `Retry-After`: delta-seconds, or an HTTP date.
    static func wait(_ header: String?) -> Duration? {
        guard let header = header?.trimmingCharacters(in: .whitespaces), !header.isEmpty else { return nil }
        if let seconds = Double(header) { return .milliseconds(Int64(max(0, seconds) * 1000)) }
        let format = DateFormatter()
        format.locale = Locale(identifier: "en_US_POSIX")
        format.timeZone = TimeZone(identifier: "GMT")
        format.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = format.date(from: header) else { return nil }
        return .milliseconds(Int64(max(0, date.timeIntervalSinceNow) * 1000))
    }

    private func backoff(after failures: Int) -> Duration {
        AppleReceipts.backoff(after: failures, first: settings.backoff, cap: settings.longestBackoff)
    }

    private func sleep(_ duration: Duration) async throws(AppStoreConnectError) {
        do { try await Task.sleep(for: duration) } catch {
            throw AppStoreConnectError(code: "cancelled", message: "the request to the App Store Connect API was cancelled")
        }
    }

    /// The token of the moment: the cached one until shortly before it expires.
    func bearerToken() async throws(AppStoreConnectError) -> String {
        do {
            return try await token.bearer(lifetime: Self.tokenLifetime, backdated: Self.tokenBackdated) { issued, expires in
                Claims(iss: settings.issuerID, iat: issued, exp: expires, aud: "appstoreconnect-v1")
            }
        } catch {
            throw AppStoreConnectError(code: "app-store-connect-key-invalid", message: "the App Store Connect token could not be signed (\(SignedDataVerifier.reason(error)))")
        }
    }

    /// The claims the token carries (`AppleAPIClaims`).
    public typealias Claims = AppleAPIClaims
}

/// A refusal or failure of the App Store Connect API, with a stable code.
public struct AppStoreConnectError: Error, Sendable, Equatable, CustomStringConvertible {
    public var code: String
    public var message: String
    public var status: Int?

    public init(code: String, message: String, status: Int? = nil) {
        self.code = code
        self.message = message
        self.status = status
    }

    public var description: String { message }

    /// Apple busy or away: the day is asked again on a later run.
    public var isAppleAway: Bool {
        ["app-store-connect-rate-limited", "app-store-connect-unavailable", "app-store-connect-unreachable"].contains(code)
    }
}
