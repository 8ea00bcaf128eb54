import AsyncHTTPClient
import Foundation
import JWTKit
import Logging
import NIOCore
import NIOHTTP1
import NIOFoundationCompat

/// A client of Apple's App Store Server API: each request authorised by an ES256 JWT made with
/// the app's In-App Purchase key (reused until shortly before it expires), paced to its
/// endpoint's request budget (Apple's limits per endpoint, shared by every caller of one client),
/// and retried as Apple means its answers: 429 after its `Retry-After` (or with backoff when it
/// gives none), 5xx, time-outs and Apple's retryable "not found" codes with backoff, all within a
/// bounded number of tries. Apple's other refusals are final `AppStoreServerAPIError`s with
/// Apple's `errorCode`. Signed transactions in its answers are returned as Apple sent them: the
/// caller checks them with the verifier a client's proof goes through
/// (`AppleProofVerifier.transaction(signed:)`).
public final class AppStoreServerAPI: Sendable {
    public struct Settings: Sendable {
        /// The In-App Purchase key's id (the JWT header's `kid`).
        public var keyID: String
        /// The issuer id of the App Store Connect team (`iss`).
        public var issuerID: String
        /// The key itself, a PKCS #8 PEM (the `.p8` file's text).
        public var privateKeyPEM: String
        /// The app (`bid`).
        public var bundleID: String
        /// Apple's base URL for the environment, or a stand-in's.
        public var baseURL: String
        /// The environment spoken to when `baseURL` is not one of Apple's hosts (a stand-in's or
        /// a proxy's); Apple's host names its own. Apple's sandbox allows a tenth of production's
        /// requests and keeps 30 days of notification history, production 180.
        public var environment: AppleEnvironment?
        /// The most requests per second to any one endpoint (each endpoint has its own budget,
        /// Apple's limit for it when that is lower), across every caller of this client.
        public var requestsPerSecond: Double
        /// Each endpoint's requests per second, when not Apple's limits (a stand-in's).
        public var budgets: RequestBudgets?
        public var timeout: TimeAmount
        /// Tries per request (the first and its retries) for 429, 5xx, time-outs and Apple's
        /// retryable codes.
        public var attempts: Int
        /// The longest `Retry-After` waited for; a later one is an error.
        public var longestWait: Duration
        /// The wait after a first failure, doubled after each failure in a row up to `longestBackoff`.
        public var backoff: Duration
        public var longestBackoff: Duration

        public init(
            keyID: String, issuerID: String, privateKeyPEM: String, bundleID: String, baseURL: String, environment: AppleEnvironment? = nil,
            requestsPerSecond: Double = 10, budgets: RequestBudgets? = nil, timeout: TimeAmount = .seconds(30), attempts: Int = 5,
            longestWait: Duration = .seconds(300), backoff: Duration = .milliseconds(500), longestBackoff: Duration = .seconds(8)
        ) {
            self.keyID = keyID
            self.issuerID = issuerID
            self.privateKeyPEM = privateKeyPEM
            self.bundleID = bundleID
            self.baseURL = baseURL
            self.environment = environment
            self.requestsPerSecond = requestsPerSecond
            self.budgets = budgets
            self.timeout = timeout
            self.attempts = attempts
            self.longestWait = longestWait
            self.backoff = backoff
            self.longestBackoff = longestBackoff
        }

        /// The environment whose limits apply: that of Apple's host in `baseURL`, else
        /// `environment`, else production's.
        public var rateLimitEnvironment: AppleEnvironment {
            AppStoreServerAPI.environment(ofHost: baseURL) ?? environment ?? .production
        }

        /// The budgets the client paces each endpoint to.
        public var effectiveBudgets: RequestBudgets {
            budgets ?? .apple(rateLimitEnvironment, atMost: requestsPerSecond)
        }
    }

    /// The environment of Apple's host in `baseURL` (today's or the older `itunes.apple.com`
    /// one); nil for any other host, such as a stand-in or a proxy.
    public static func environment(ofHost baseURL: String) -> AppleEnvironment? {
        let host = URLComponents(string: baseURL)?.host?.lowercased() ?? ""
        if host == "api.storekit-sandbox.apple.com" || host == "api.storekit-sandbox.itunes.apple.com" { return .sandbox }
        if host == "api.storekit.apple.com" || host == "api.storekit.itunes.apple.com" { return .production }
        return nil
    }

    /// Apple's hosts, as Apple's App Store Server Libraries name them.
    public static let productionURL = "https://api.storekit.apple.com"
    public static let sandboxURL = "https://api.storekit-sandbox.apple.com"
    /// How long a token is made for (Apple takes at most 60 minutes), and how long before its
    /// expiry a new one is made.
    static let tokenLifetime: TimeInterval = 20 * 60

    public let settings: Settings
    let httpClient: HTTPClient
    let logger: Logger
    private let token: AppleAPIToken
    private let pace: RequestPace

    /// Fails when the key is not a P-256 private key in PEM.
    public init(settings: Settings, httpClient: HTTPClient = .apple, logger: Logger) async throws(AppStoreServerAPIError) {
        self.settings = settings
        self.httpClient = httpClient
        self.logger = logger
        token = await AppleAPIToken(keyID: settings.keyID, key: try Self.key(settings.privateKeyPEM))
        pace = RequestPace(settings.effectiveBudgets)
    }

    /// The In-App Purchase key in `pem`, or why it is none.
    @discardableResult
    public static func key(_ pem: String) throws(AppStoreServerAPIError) -> ES256PrivateKey {
        do {
            return try ES256PrivateKey(pem: pem)
        } catch {
            throw AppStoreServerAPIError(code: "apple-api-key-invalid", message: "the In-App Purchase key is not a P-256 private key in PEM (\(SignedDataVerifier.reason(error)))")
        }
    }

    // MARK: Endpoints

    /// One page of Get Transaction History v2 for any transaction id of the account (or, since
    /// API 1.20, its `appTransactionId`): from `revision` (the previous page's) or from the start,
    /// purchases from `startDate` on, oldest first.
    public func transactionHistory(
        _ anyID: String, revision: String? = nil, startDate: Date? = nil, productIDs: [String] = [], productTypes: [ProductType] = []
    ) async throws(AppStoreServerAPIError) -> HistoryPage {
        var query: [(String, String)] = [("sort", "ASCENDING")]
        if let revision { query.append(("revision", revision)) }
        if let startDate { query.append(("startDate", String(startDate.millisecondsSince1970))) }
        for product in productIDs { query.append(("productId", product)) }
        for type in productTypes { query.append(("productType", type.rawValue)) }
        return try await fetch(.GET, "/inApps/v2/history/\(Self.pathSegment(anyID))", query: query)
    }

    /// Get Transaction History's `productType` filter, as Apple's libraries name its values.
    public enum ProductType: String, Sendable, CaseIterable {
        case autoRenewable = "AUTO_RENEWABLE", nonRenewable = "NON_RENEWABLE", consumable = "CONSUMABLE", nonConsumable = "NON_CONSUMABLE"
    }

    /// Look Up Order ID: the purchases behind the order id on a customer's receipt e-mail.
    /// Apple's status 1 (no such order) is the error `apple-order-not-found`.
    public func lookUpOrder(_ orderID: String) async throws(AppStoreServerAPIError) -> [String] {
        let answer = try await fetch(.GET, "/inApps/v1/lookup/\(Self.pathSegment(orderID))", as: OrderLookup.self)
        guard answer.status == 0 else {
            throw AppStoreServerAPIError(code: "apple-order-not-found", message: "Apple knows no order \(orderID)", status: 404)
        }
        return answer.signedTransactions ?? []
    }

    /// Send Consumption Information (v2): what the ledger knows of a consumable whose refund a
    /// customer asked for, answering Apple's `CONSUMPTION_REQUEST`.
    public func sendConsumptionInformation(_ transactionID: String, _ information: ConsumptionInformation) async throws(AppStoreServerAPIError) {
        try await send(.PUT, "/inApps/v2/transactions/consumption/\(Self.pathSegment(transactionID))", body: Self.json(information))
    }

    /// Get Notification History: one page of the notifications Apple sent (or tried to send)
    /// between `startDate` and `endDate` (at most 180 days back in production, 30 in the sandbox),
    /// from `paginationToken` on.
    public func notificationHistory(
        startDate: Date, endDate: Date, paginationToken: String? = nil
    ) async throws(AppStoreServerAPIError) -> NotificationHistoryPage {
        let request = NotificationHistoryRequest(startDate: startDate.millisecondsSince1970, endDate: endDate.millisecondsSince1970)
        let query = paginationToken.map { [("paginationToken", $0)] } ?? []
        return try await fetch(.POST, "/inApps/v1/notifications/history", query: query, body: Self.json(request))
    }

    /// Get Refund History (v2): one page of an account's refunded transactions, from `revision`.
    public func refundHistory(_ anyID: String, revision: String? = nil) async throws(AppStoreServerAPIError) -> RefundHistoryPage {
        try await fetch(.GET, "/inApps/v2/refund/lookup/\(Self.pathSegment(anyID))", query: revision.map { [("revision", $0)] } ?? [])
    }

    /// Finish Transaction: tells Apple the app's server delivered what the transaction bought.
    public func finishTransaction(_ transactionID: String) async throws(AppStoreServerAPIError) {
        try await send(.POST, "/inApps/v1/transactions/\(Self.pathSegment(transactionID))/finish")
    }

    /// Set App Account Token: the order's token on a transaction (by its original id), so that
    /// Apple's later notifications about it carry it.
    public func setAppAccountToken(_ originalTransactionID: String, _ token: UUID) async throws(AppStoreServerAPIError) {
        try await send(.PUT, "/inApps/v1/transactions/\(Self.pathSegment(originalTransactionID))/appAccountToken",
                           body: Self.json(["appAccountToken": token.uuidString.lowercased()]))
    }

    /// The body of Send Consumption Information (v2), as Apple names its fields.
    public struct ConsumptionInformation: Codable, Sendable, Equatable {
        public var customerConsented: Bool
        /// `DELIVERED`, or why not: `UNDELIVERED_QUALITY_ISSUE`, `UNDELIVERED_WRONG_ITEM`,
        /// `UNDELIVERED_SERVER_OUTAGE`, `UNDELIVERED_OTHER`.
        public var deliveryStatus: String
        /// Required by Apple, as `customerConsented` and `deliveryStatus` are.
        public var sampleContentProvided: Bool
        /// `DECLINE`, `GRANT_FULL` or `GRANT_PRORATED` (optional).
        public var refundPreference: String?
        /// Of the purchase consumed, in thousandths of a percent (0 to 100,000; optional).
        public var consumptionPercentage: Int?

        public init(customerConsented: Bool, deliveryStatus: String, sampleContentProvided: Bool, refundPreference: String? = nil, consumptionPercentage: Int? = nil) {
            self.customerConsented = customerConsented
            self.deliveryStatus = deliveryStatus
            self.sampleContentProvided = sampleContentProvided
            self.refundPreference = refundPreference
            self.consumptionPercentage = consumptionPercentage
        }
    }

    /// The longest a 429's `Retry-After` is waited out by the calls of this task, where shorter
    /// than the settings' (`longestWait`): a person waiting on an answer (support's lookup, a
    /// subscription's refresh) is answered that Apple is busy, and when it takes requests again,
    /// rather than kept waiting for minutes.
    @TaskLocal public static var patience: Duration?

    struct NotificationHistoryRequest: Encodable {
        var startDate: Int64
        var endDate: Int64
    }

    // The pages below read as Apple's own libraries read them, where every field is optional: a
    // list left out is empty, and `hasMore` left out is false. A `revision` is required: the
    // cursor goes on from it, and a page without one cannot be followed.

    /// A page of notification history as Apple sends it.
    public struct NotificationHistoryPage: Decodable, Sendable {
        public var paginationToken: String?
        public var hasMore: Bool
        public var notificationHistory: [Item]

        /// One notification: its signed payload, as it would have arrived (nil: none was sent,
        /// and there is nothing to apply).
        public struct Item: Decodable, Sendable {
            public var signedPayload: String?
        }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            paginationToken = try container.decodeIfPresent(String.self, forKey: .paginationToken)
            hasMore = try container.decodeIfPresent(Bool.self, forKey: .hasMore) ?? false
            notificationHistory = try container.decodeIfPresent([Item].self, forKey: .notificationHistory) ?? []
        }

        enum CodingKeys: String, CodingKey { case paginationToken, hasMore, notificationHistory }
    }

    /// A page of refund history as Apple sends it.
    public struct RefundHistoryPage: Decodable, Sendable {
        public var revision: String
        public var hasMore: Bool
        public var signedTransactions: [String]

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            revision = try container.decode(String.self, forKey: .revision)
            hasMore = try container.decodeIfPresent(Bool.self, forKey: .hasMore) ?? false
            signedTransactions = try container.decodeIfPresent([String].self, forKey: .signedTransactions) ?? []
        }

        enum CodingKeys: String, CodingKey { case revision, hasMore, signedTransactions }
    }

    /// A page of transaction history as Apple sends it.
    public struct HistoryPage: Decodable, Sendable {
        public var revision: String
        public var hasMore: Bool
        public var bundleId: String?
        public var environment: String?
        public var signedTransactions: [String]

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            revision = try container.decode(String.self, forKey: .revision)
            hasMore = try container.decodeIfPresent(Bool.self, forKey: .hasMore) ?? false
            bundleId = try container.decodeIfPresent(String.self, forKey: .bundleId)
            environment = try container.decodeIfPresent(String.self, forKey: .environment)
            signedTransactions = try container.decodeIfPresent([String].self, forKey: .signedTransactions) ?? []
        }

        enum CodingKeys: String, CodingKey { case revision, hasMore, bundleId, environment, signedTransactions }
    }

    struct OrderLookup: Decodable {
        var status: Int
        var signedTransactions: [String]?
    }

    // MARK: Requests

    /// A request of `path` with the pacing, the token and the retries; the body of Apple's 2xx
    /// answer. (Every call here is safe to send again: reads, and writes Apple applies as a whole.)
    @discardableResult
    func send(
        _ method: HTTPMethod, _ path: String, query: [(String, String)] = [], body requestBody: ByteBuffer? = nil
    ) async throws(AppStoreServerAPIError) -> ByteBuffer {
        var components = URLComponents()
        components.queryItems = query.isEmpty ? nil : query.map { URLQueryItem(name: $0.0, value: $0.1) }
        let url = settings.baseURL.trimmingSuffix("/") + path + (components.percentEncodedQuery.map { "?" + $0 } ?? "")
        let endpoint = Endpoint(path: path)
        var failures = 0
        while true {
            let wait = await pace.reserve(endpoint)
            if wait > .zero { try await sleep(wait) }
            let bearer = try await bearerToken()
            var request = HTTPClientRequest(url: url)
            request.method = method
            request.headers.add(name: "Authorization", value: "Bearer \(bearer)")
            request.headers.add(name: "Accept", value: "application/json")
            if let requestBody {
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(requestBody)
            }
            let answer: HTTPClient.AppleAnswer
            do {
                answer = try await httpClient.answer(request, timeout: settings.timeout, limit: 16 * 1024 * 1024, logger: logger)
            } catch {
                failures += 1
                guard failures < settings.attempts else {
                    if let error = error as? HTTPClientError, error == .connectTimeout {
                        throw AppStoreServerAPIError(code: "apple-api-unreachable", message: "the App Store Server API could not be connected to in 10 s, \(failures) times")
                    }
                    if let error = error as? HTTPClientError, [.deadlineExceeded, .readTimeout].contains(error) {
                        throw AppStoreServerAPIError(code: "apple-api-timeout", message: "the App Store Server API did not answer \(path) within \(settings.timeout.nanoseconds / 1_000_000) ms, \(failures) times")
                    }
                    throw AppStoreServerAPIError(code: "apple-api-unreachable", message: "the App Store Server API could not be reached (\(SignedDataVerifier.reason(error)))")
                }
                try await backOff(after: failures)
                continue
            }
            let (status, retryAfter, body) = (answer.status, answer.retryAfter, answer.body)
            let apple = (200...299).contains(status) ? nil : try? JSONDecoder().decode(AppleError.self, from: body)
            switch Self.verdict(status: status, appleErrorCode: apple?.errorCode) {
            case .success:
                return body
            case .unauthorized:
                await token.clear()
                throw AppStoreServerAPIError(code: "apple-api-unauthorized", message: "the App Store Server API refused the token of app \(settings.bundleID) (check its key id, issuer id and key: `ledger apps set`, or LEDGER_APPLE_API_KEY_ID, LEDGER_APPLE_API_ISSUER_ID and LEDGER_APPLE_API_PRIVATE_KEY for the configured app)", status: 401)
            case .rateLimited:
                failures += 1
                // Without a usable Retry-After, the client's own backoff, which grows to its cap.
                let until = Self.retryAt(retryAfter)
                let wait = until.map { Duration.seconds($0.timeIntervalSinceNow) } ?? Self.backoff(after: failures, settings)
                guard wait <= min(settings.longestWait, Self.patience ?? settings.longestWait), failures < settings.attempts else {
                    let when = until.map { "until \($0)" } ?? "after \(failures) tries"
                    throw AppStoreServerAPIError(
                        code: "apple-api-rate-limited", message: "Apple takes no more requests to \(endpoint.rawValue) \(when)",
                        status: 429, appleErrorCode: apple?.errorCode, retryAt: until)
                }
                logger.info("App Store Server API rate limit: waiting", metadata: [
                    "apple.endpoint": "\(endpoint.rawValue)", "apple.wait_seconds": "\(String(format: "%.1f", Self.seconds(wait)))"])
                try await sleep(wait)
            case .retryable:
                failures += 1
                guard failures < settings.attempts else {
                    throw AppStoreServerAPIError(
                        code: status >= 500 ? "apple-api-unavailable" : "apple-api-not-found-retryable",
                        message: "the App Store Server API answered \(method) \(path) with HTTP \(status)\(Self.naming(apple)), \(failures) times",
                        status: status, appleErrorCode: apple?.errorCode)
                }
                try await backOff(after: failures)
            case .final:
                throw AppStoreServerAPIError(
                    code: status == 404 ? "apple-api-not-found" : "apple-api-refused",
                    message: "the App Store Server API refused \(method) \(path): HTTP \(status)\(Self.naming(apple))",
                    status: status, appleErrorCode: apple?.errorCode)
            }
        }
    }

    /// When a 429's `Retry-After` lets requests in again: Apple sends the Unix time in
    /// milliseconds; a number too small to be one is HTTP's delay in seconds (as a proxy in front
    /// of Apple would send it). A time already past, or no number, is no usable answer.
    public static func retryAt(_ retryAfter: String?, now: Date = Date()) -> Date? {
        guard let text = retryAfter?.trimmingCharacters(in: .whitespaces), let value = Double(text), value.isFinite, value >= 0 else { return nil }
        // 10^11 ms is March 1973: no time Apple would name; 10^11 s is no delay anyone would.
        let until = value < 1e11 ? now.addingTimeInterval(value) : Date(timeIntervalSince1970: value / 1000)
        return until > now ? until : nil
    }

    /// `send`, and Apple's answer as the JSON it documents.
    func fetch<Answer: Decodable>(
        _ method: HTTPMethod, _ path: String, query: [(String, String)] = [], body: ByteBuffer? = nil, as _: Answer.Type = Answer.self
    ) async throws(AppStoreServerAPIError) -> Answer {
        let answer = try await send(method, path, query: query, body: body)
        do {
            return try JSONDecoder().decode(Answer.self, from: answer)
        } catch {
            throw AppStoreServerAPIError(code: "apple-api-answer-malformed", message: "the App Store Server API's answer to \(path) is not the JSON it documents", status: 200)
        }
    }

    static func json(_ value: some Encodable) -> ByteBuffer {
        // The ledger's own values, always encodable.
        ByteBuffer(data: (try? JSONEncoder().encode(value)) ?? Data("{}".utf8))
    }

    struct AppleError: Decodable {
        var errorCode: Int?
        var errorMessage: String?
    }

    /// Waits `settings.backoff` after a first failure, doubling with each failure in a row up to
    /// `settings.longestBackoff`.
    private func backOff(after failures: Int) async throws(AppStoreServerAPIError) {
        try await sleep(Self.backoff(after: failures, settings))
    }

    private func sleep(_ duration: Duration) async throws(AppStoreServerAPIError) {
        do {
            try await Task.sleep(for: duration)
        } catch {
            throw AppStoreServerAPIError(code: "cancelled", message: "the request to the App Store Server API was cancelled")
        }
    }

    /// The token of the moment: the cached one until shortly before it expires.
    func bearerToken() async throws(AppStoreServerAPIError) -> String {
        do {
            return try await token.bearer(lifetime: Self.tokenLifetime) { issued, expires in
                Claims(iss: settings.issuerID, iat: issued, exp: expires, aud: "appstoreconnect-v1", bid: settings.bundleID)
            }
        } catch {
            throw AppStoreServerAPIError(code: "apple-api-key-invalid", message: "the API token could not be signed (\(SignedDataVerifier.reason(error)))")
        }
    }

    /// The claims the token carries (`AppleAPIClaims`).
    public typealias Claims = AppleAPIClaims

    /// A path segment with everything but unreserved characters percent-encoded.
    static func pathSegment(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~"))) ?? text
    }
}

/// A refusal or failure of the App Store Server API, with a stable code.
public struct AppStoreServerAPIError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Apple's InvalidRequestRevisionError (HTTP 400): a history or refund history `revision`
    /// Apple does not take.
    public static let invalidRequestRevision = 4000005

    public var code: String
    public var message: String
    /// Apple's HTTP status, when it answered.
    public var status: Int?
    /// Apple's `errorCode`, when its answer carried one.
    public var appleErrorCode: Int?
    /// When Apple takes requests again (its `Retry-After`), when it said.
    public var retryAt: Date?

    public init(code: String, message: String, status: Int? = nil, appleErrorCode: Int? = nil, retryAt: Date? = nil) {
        self.code = code
        self.message = message
        self.status = status
        self.appleErrorCode = appleErrorCode
        self.retryAt = retryAt
    }

    public var description: String {
        guard let appleErrorCode, !message.contains(String(appleErrorCode)) else { return message }
        return "\(message) (Apple error \(appleErrorCode))"
    }

    /// Apple busy or away (rate-limited past the client's tries or longest wait, 5xx answers,
    /// Apple's retryable "not found" codes past the client's tries, no answer): the same request
    /// may well succeed later, so work that asks Apple tries it again later rather than taking it
    /// as Apple's refusal.
    public var isAppleAway: Bool {
        ["apple-api-rate-limited", "apple-api-unavailable", "apple-api-not-found-retryable", "apple-api-timeout", "apple-api-unreachable"].contains(code)
    }

    /// Stops a read of Apple's pages whose answer says more follow but names the position it was
    /// asked from again (`revision`, `paginationToken`): asking on would get the same page until
    /// the read's page limit, and again at every run.
    public static func requireMoved(_ answered: String?, from asked: String?, hasMore: Bool, reading what: String) throws {
        var seen = Set<String>()
        try requireMoved(answered, from: asked, hasMore: hasMore, reading: what, seen: &seen)
    }

    /// `requireMoved`, and no position of this read's asked again (`seen`: those asked so far):
    /// positions that go round (A, B, A) would be read until the page limit at every run.
    public static func requireMoved(_ answered: String?, from asked: String?, hasMore: Bool, reading what: String, seen: inout Set<String>) throws {
        if let asked { seen.insert(asked) }
        guard hasMore, let answered, seen.contains(answered) else { return }
        let again = answered == asked ? "the position it was asked from (\(answered)) again" : "a position it was asked from before (\(answered))"
        throw AppStoreServerAPIError(
            code: "apple-api-position-unmoved",
            message: "Apple's \(what) said more pages follow but named \(again); the read stopped there")
    }
}

/// The current API token.
actor TokenCache {
    private var token: String?
    private var expires = Date.distantPast

    func valid(at date: Date) -> String? { date < expires ? token : nil }
    func set(_ token: String, expires: Date) { (self.token, self.expires) = (token, expires) }
    func clear() { (token, expires) = (nil, .distantPast) }
}

extension String {
    /// The text without `suffix` at its end (a base URL's trailing slash).
    func trimmingSuffix(_ suffix: String) -> String {
        hasSuffix(suffix) ? String(dropLast(suffix.count)) : self
    }
}
