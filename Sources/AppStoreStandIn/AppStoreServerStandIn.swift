// AppStoreStandIn: a stand-in App Store Server API on a local port, for the tests and `ledger demo`.

import AppleReceipts
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import JWTKit
import Logging
import NIOCore

/// A stand-in for Apple's App Store Server API on a local port, for the tests and for
/// `ledger demo` (Apple is not reachable from either). It checks every request's JWT as
/// Apple does (ES256 with the key's public half, `kid`, `iss`, `aud`, `bid`, at most an hour
/// between `iat` and `exp`, not expired), serves the transaction history and order lookups a test
/// scripted, refuses what Apple refuses in the requests it checks (consumption answers, the dates
/// and tokens of notification history) with Apple's status and `errorCode`, and plays the faults
/// a test queued (429 with or without `Retry-After`, 500, a slow answer, a malformed page, any of
/// Apple's error codes) on the next requests.
public final class AppStoreServerStandIn: Sendable {
    public enum Fault: Sendable {
        /// 429 with `Retry-After` this long from now.
        case tooManyRequests(after: Duration)
        /// 429 without `Retry-After` (Apple documents the header, but a client must not wait on it).
        case tooManyRequestsWithoutRetryAfter
        /// 429 with this `Retry-After` as given (a proxy's delay in seconds, a time already past).
        case tooManyRequestsRetryAfter(String)
        case serverError
        /// Answers after this long.
        case slow(Duration)
        /// Answers once the test calls `release()` (or `run` ends): a request in flight for as
        /// long as a race needs.
        case held
        case malformed
        /// Answers 200 with this body (a page with fields left out, as Apple's models allow).
        case answer(String)
        /// Apple refuses the request: `status` with its `errorCode`.
        case refused(status: Int, errorCode: Int)

        /// Apple's `errorCode` with the HTTP status Apple answers it with (404 for 404xxxx, and
        /// so on: the status is the code's first three digits).
        public static func appleError(_ errorCode: Int) -> Fault {
            .refused(status: errorCode / 10_000, errorCode: errorCode)
        }
    }

    public struct Page: Sendable {
        public var revision: String
        public var hasMore: Bool
        public var signedTransactions: [String]
        public init(revision: String, hasMore: Bool, signedTransactions: [String]) {
            self.revision = revision
            self.hasMore = hasMore
            self.signedTransactions = signedTransactions
        }
    }

    public static let keyID = "STANDIN01"
    public static let issuerID = "57246542-96fe-1a63-e053-0824d011072a"

    /// The In-App Purchase key the ledger is configured with (PEM) and its public half.
    public let privateKeyPEM: String
    let publicKey: P256.Signing.PublicKey
    public let bundleID: String
    /// The environment it plays, as Apple names it: `Sandbox` (the default) keeps 30 days of
    /// notification history, `Production` 180.
    public let environment: String
    let state = State()
    let subscriptionBook = SubscriptionStatusBook()

    public convenience init(bundleID: String, environment: String = "Sandbox") {
        self.init(bundleID: bundleID, environment: environment, key: P256.Signing.PrivateKey())
    }

    private init(bundleID: String, environment: String, key: P256.Signing.PrivateKey) {
        privateKeyPEM = key.pemRepresentation
        publicKey = key.publicKey
        self.bundleID = bundleID
        self.environment = environment
    }

    /// The same app with the same key in `environment`: Apple's other host, which takes the
    /// app's key too, with a history of its own.
    public func twin(in environment: String) throws -> AppStoreServerStandIn {
        AppStoreServerStandIn(bundleID: bundleID, environment: environment, key: try P256.Signing.PrivateKey(pemRepresentation: privateKeyPEM))
    }

    /// How far back Get Notification History goes in `environment`.
    public var notificationHistoryDays: Int { environment == "Production" ? 180 : 30 }

    /// The client settings for this stand-in at `baseURL`. The time-out is generous: a loaded
    /// machine can take seconds to answer, and a try given up early would take a fault queued for
    /// the next one. A test about time-outs holds an answer (`.held`) past a shorter one. Every
    /// endpoint gets `requestsPerSecond` (the stand-in has none of Apple's limits, and tests stay
    /// fast); a test of the budgets passes its own.
    public func settings(
        baseURL: String, requestsPerSecond: Double = 100, budgets: AppStoreServerAPI.RequestBudgets? = nil, timeout: TimeAmount = .seconds(30),
        attempts: Int = 4, backoff: Duration = .milliseconds(500), longestBackoff: Duration = .seconds(8)
    ) -> AppStoreServerAPI.Settings {
        .init(keyID: Self.keyID, issuerID: Self.issuerID, privateKeyPEM: privateKeyPEM, bundleID: bundleID, baseURL: baseURL,
              requestsPerSecond: requestsPerSecond, budgets: budgets ?? .uniform(requestsPerSecond), timeout: timeout, attempts: attempts,
              longestWait: .seconds(10), backoff: backoff, longestBackoff: longestBackoff)
    }

    public func setHistory(_ anyID: String, _ pages: [Page]) async { await state.setHistory(anyID, pages) }
    /// Refund history pages of an account (`revision` and `signedTransactions` as for history).
    public func setRefunds(_ anyID: String, _ pages: [Page]) async { await state.setRefunds(anyID, pages) }
    /// Notification history: pages of signed payloads, each page's `revision` its pagination token.
    public func setNotifications(_ pages: [Page]) async { await state.setNotifications(pages) }
    /// Every notification-history pagination token handed out so far expires: asked with one,
    /// the stand-in answers 400 `4000017` (PaginationTokenExpired) until it hands it out again.
    public func expireNotificationTokens() async { await state.expireNotificationTokens() }
    /// Each Get Notification History request that passed the token check, in order.
    public var notificationRequests: [NotificationRequest] { get async { await state.notificationRequests } }

    /// A Get Notification History request: its dates (nil when absent or not a number) and token.
    public struct NotificationRequest: Sendable, Equatable {
        public var startDate: Date?
        public var endDate: Date?
        public var paginationToken: String?
    }
    /// Apple's refusal of Set App Account Token for a transaction (its `errorCode`, such as
    /// 4000185 for a family-shared one).
    public func refuseAccountToken(_ transactionID: String, errorCode: Int) async { await state.refuseToken(transactionID, errorCode) }
    /// The writes that reached Apple with a valid token: method, path and body, in order.
    public var writes: [Write] { get async { await state.writes } }

    public struct Write: Sendable {
        public var method: String
        public var path: String
        public var body: String
    }
    public func setOrder(_ orderID: String, _ signedTransactions: [String]) async { await state.setOrder(orderID, signedTransactions) }
    /// The transaction ids this app's environment holds: once set, a write about any other
    /// (finish, consumption, token) is refused as Apple refuses it, 404 `4040010`
    /// (TransactionIdNotFound): a sandbox transaction is unknown to production's host, and the
    /// other way round.
    public func setTransactions(_ ids: [String]) async { await state.setTransactions(ids) }
    /// Transactions of auto-renewable subscriptions: a consumption answer about one with a
    /// `consumptionPercentage` is refused, as Apple refuses it.
    public func setAutoRenewable(_ ids: [String]) async { await state.setAutoRenewable(ids) }
    public func queue(_ faults: [Fault]) async { await state.queue(faults) }
    /// How many requests wait on a `held` fault.
    public var holding: Int { get async { await state.held.count } }
    /// Waits until a request waits on a `held` fault, two minutes at most (however slow the
    /// machine, no test races a sleep against it); answers how many wait.
    public func untilHolding() async throws -> Int {
        var holding = 0
        for _ in 0..<2400 where holding == 0 {
            try await Task.sleep(for: .milliseconds(50))
            holding = await self.holding
        }
        return holding
    }
    /// Lets every request held by a `held` fault go on.
    public func release() async { await state.release() }
    /// Requests that reached a route, with a valid token or not.
    public var requests: Int { get async { await state.requests } }
    /// The distinct tokens presented, and the refusals of bad ones.
    public var tokens: Set<String> { get async { await state.tokens } }
    public var refusedTokens: Int { get async { await state.refusedTokens } }
    /// The query of each history request, in order.
    public var historyQueries: [[String: String]] { get async { await state.historyQueries } }

    actor State {
        var histories: [String: [Page]] = [:]
        var orders: [String: [String]] = [:]
        var faults: [Fault] = []
        var requests = 0
        var tokens = Set<String>()
        var refusedTokens = 0
        var historyQueries: [[String: String]] = []
        var refunds: [String: [Page]] = [:]
        var notifications: [Page] = []
        var notificationTokens = Set<String>()
        var expiredNotificationTokens = Set<String>()
        var notificationRequests: [NotificationRequest] = []
        var tokenRefusals: [String: Int] = [:]
        var transactions: Set<String>?
        var autoRenewable = Set<String>()
        var writes: [Write] = []
        var held: [CheckedContinuation<Void, Never>] = []

        func hold() async { await withCheckedContinuation { held.append($0) } }
        func release() {
            held.forEach { $0.resume() }
            held = []
        }
        func setRefunds(_ id: String, _ pages: [Page]) { refunds[id] = pages }
        func setNotifications(_ pages: [Page]) { notifications = pages }
        func refuseToken(_ id: String, _ code: Int) { tokenRefusals[id] = code }
        func setTransactions(_ ids: [String]) { transactions = Set(ids) }
        func setAutoRenewable(_ ids: [String]) { autoRenewable.formUnion(ids) }
        func knows(_ id: String) -> Bool { transactions?.contains(id) ?? true }
        func wrote(_ write: Write) { writes.append(write) }
        func refund(_ id: String, revision: String?) -> Page? { Self.page(refunds[id], after: revision) }
        /// Whether the id has a history (or refund history) set: a revision it does not hold is
        /// then Apple's InvalidRequestRevisionError, not an unknown transaction.
        func knowsHistory(_ id: String) -> Bool { histories[id] != nil }
        func knowsRefunds(_ id: String) -> Bool { refunds[id] != nil }
        func notificationPage(after token: String?) -> Page? {
            // No history set: an empty first page, as Apple answers for a quiet period.
            if token == nil, notifications.isEmpty { return Page(revision: "", hasMore: false, signedTransactions: []) }
            guard let page = Self.page(notifications, after: token) else { return nil }
            // Handed out (again): good until the test expires it.
            notificationTokens.insert(page.revision)
            expiredNotificationTokens.remove(page.revision)
            return page
        }
        func expireNotificationTokens() { expiredNotificationTokens.formUnion(notificationTokens) }
        func askedForNotifications(_ request: NotificationRequest) { notificationRequests.append(request) }

        /// The page after the one `revision` names (the first without one); from the last page's
        /// revision, an empty page with it (nothing new yet).
        static func page(_ pages: [Page]?, after revision: String?) -> Page? {
            guard let pages else { return nil }
            guard let revision else { return pages.first }
            guard let index = pages.firstIndex(where: { $0.revision == revision }) else { return nil }
            return index + 1 < pages.count ? pages[index + 1] : Page(revision: revision, hasMore: false, signedTransactions: [])
        }

        func setHistory(_ id: String, _ pages: [Page]) { histories[id] = pages }
        func setOrder(_ id: String, _ signed: [String]) { orders[id] = signed }
        func queue(_ more: [Fault]) { faults += more }
        func arrived(token: String?) -> Fault? {
            requests += 1
            if let token { tokens.insert(token) }
            return faults.isEmpty ? nil : faults.removeFirst()
        }
        func refused() { refusedTokens += 1 }
        func history(_ id: String, query: [String: String]) -> Page? {
            historyQueries.append(query)
            return Self.page(histories[id], after: query["revision"])
        }
        func order(_ id: String) -> [String]? { orders[id] }
    }

    /// Why a token is refused, or nil when Apple would take it.
    func problem(with token: String) async -> String? {
        let keys = JWTKeyCollection()
        do {
            await keys.add(ecdsa: try ES256PublicKey(backing: publicKey), kid: JWKIdentifier(string: Self.keyID))
            let (header, _, _) = try DefaultJWTParser().parse(Array(token.utf8), as: AppStoreServerAPI.Claims.self)
            guard header.kid == Self.keyID, header.alg == "ES256", header.typ == "JWT" else { return "header" }
            let claims = try await keys.verify(token, as: AppStoreServerAPI.Claims.self)
            guard claims.iss == Self.issuerID, claims.aud == "appstoreconnect-v1", claims.bid == bundleID,
                  claims.exp - claims.iat <= 3600, claims.iat <= Int(Date().timeIntervalSince1970) + 60 else { return "claims" }
            return nil
        } catch {
            return "\(error)"
        }
    }

    /// Apple's answer to a `revision` it does not take (InvalidRequestRevisionError).
    static let invalidRevision = (400, #"{"errorCode": 4000005, "errorMessage": "Invalid request revision."}"#)

    /// Runs the stand-in for the duration of `body`, which gets its base URL.
    public func run<T: Sendable>(_ body: @Sendable (_ baseURL: String) async throws -> T) async throws -> T {
        try await Self.run([self], body)
    }

    /// Runs several apps' stand-ins of one environment on one base URL, as Apple's one host
    /// serves every app: each request goes to the stand-in of the app its token's `bid` names,
    /// which checks the token with that app's key (a token for an app none serves is refused by
    /// the first, as Apple refuses it). Two environments are two runs, at two base URLs.
    public static func run<T: Sendable>(_ standIns: [AppStoreServerStandIn], _ body: @Sendable (_ baseURL: String) async throws -> T) async throws -> T {
        precondition(!standIns.isEmpty, "a stand-in serves at least one app")
        @Sendable func serving(_ request: Request) -> AppStoreServerStandIn {
            let bid = Self.bundleID(inTokenOf: request)
            return standIns.first { $0.bundleID == bid } ?? standIns[0]
        }
        let router = Router()
        router.get("/inApps/v2/history/:id") { request, context -> Response in
            let standIn = serving(request)
            return try await standIn.answer(request) {
                let query = Dictionary(request.uri.queryParameters.map { (String($0.key), String($0.value)) }, uniquingKeysWith: { a, _ in a })
                // As Apple refuses a product type it does not know (InvalidProductTypeError).
                for (key, value) in request.uri.queryParameters where key == "productType" {
                    guard AppStoreServerAPI.ProductType(rawValue: String(value)) != nil else {
                        return (400, #"{"errorCode": 4000022, "errorMessage": "Invalid request. The product type parameter is invalid."}"#)
                    }
                }
                guard let page = await standIn.state.history(context.parameters.get("id") ?? "", query: query) else {
                    return await standIn.state.knowsHistory(context.parameters.get("id") ?? "")
                        ? Self.invalidRevision : (404, #"{"errorCode": 4040010, "errorMessage": "Transaction id not found."}"#)
                }
                let body: [String: Any] = [
                    "revision": page.revision, "hasMore": page.hasMore, "bundleId": standIn.bundleID, "environment": standIn.environment,
                    "signedTransactions": page.signedTransactions,
                ]
                return (200, String(decoding: try JSONSerialization.data(withJSONObject: body), as: UTF8.self))
            }
        }
        router.get("/inApps/v1/lookup/:orderId") { request, context -> Response in
            let standIn = serving(request)
            return try await standIn.answer(request) {
                guard let signed = await standIn.state.order(context.parameters.get("orderId") ?? "") else { return (200, #"{"status": 1}"#) }
                let body: [String: Any] = ["status": 0, "signedTransactions": signed]
                return (200, String(decoding: try JSONSerialization.data(withJSONObject: body), as: UTF8.self))
            }
        }
        router.get("/inApps/v2/refund/lookup/:id") { request, context -> Response in
            let standIn = serving(request)
            return try await standIn.answer(request) {
                guard let page = await standIn.state.refund(context.parameters.get("id") ?? "", revision: request.uri.queryParameters["revision"].map(String.init)) else {
                    return await standIn.state.knowsRefunds(context.parameters.get("id") ?? "")
                        ? Self.invalidRevision : (404, #"{"errorCode": 4040010, "errorMessage": "Transaction id not found."}"#)
                }
                let body: [String: Any] = ["revision": page.revision, "hasMore": page.hasMore, "signedTransactions": page.signedTransactions]
                return (200, String(decoding: try JSONSerialization.data(withJSONObject: body), as: UTF8.self))
            }
        }
        addSubscriptionRoutes(to: router, serving: serving)
        router.post("/inApps/v1/notifications/history") { request, _ -> Response in
            var request = request
            let standIn = serving(request)
            let token = request.uri.queryParameters["paginationToken"].map(String.init)
            let body = try await request.collectBody(upTo: 1 << 20)
            return try await standIn.answer(request) {
                if let refusal = await standIn.refusal(ofNotificationHistory: body, token: token) { return refusal }
                guard let page = await standIn.state.notificationPage(after: token) else {
                    return Self.refusal(4000014, "Invalid pagination token.")
                }
                let body: [String: Any] = [
                    "paginationToken": page.revision, "hasMore": page.hasMore,
                    "notificationHistory": page.signedTransactions.map { ["signedPayload": $0] },
                ]
                return (200, String(decoding: try JSONSerialization.data(withJSONObject: body), as: UTF8.self))
            }
        }
        router.put("/inApps/v2/transactions/consumption/:id") { request, context -> Response in
            let standIn = serving(request)
            let autoRenewable = await standIn.state.autoRenewable.contains(context.parameters.get("id") ?? "")
            return try await standIn.recordWrite(request, status: 202, check: { Self.refusal(ofConsumption: $0, autoRenewable: autoRenewable) })
        }
        router.post("/inApps/v1/transactions/:id/finish") { request, _ -> Response in
            try await serving(request).recordWrite(request, status: 200)
        }
        router.put("/inApps/v1/transactions/:id/appAccountToken") { request, context -> Response in
            let standIn = serving(request)
            if let code = await standIn.state.tokenRefusals[context.parameters.get("id") ?? ""] {
                return try await standIn.answer(request) { (400, #"{"errorCode": \#(code), "errorMessage": "Refused."}"#) }
            }
            return try await standIn.recordWrite(request, status: 200)
        }
        return try await serveStandIn(router) { bound in
            // Requests still held when `body` ends, however it ends, are let go: the server stops.
            do {
                let result = try await body("http://127.0.0.1:\(bound)")
                for standIn in standIns { await standIn.state.release() }
                return result
            } catch {
                for standIn in standIns { await standIn.state.release() }
                throw error
            }
        }
    }

    /// The `bid` claim of the request's bearer token, read without checking it (the stand-in it
    /// picks checks it).
    static func bundleID(inTokenOf request: Request) -> String? {
        let authorization = request.headers[.authorization] ?? ""
        guard authorization.hasPrefix("Bearer ") else { return nil }
        let parts = authorization.dropFirst(7).split(separator: ".")
        guard parts.count == 3 else { return nil }
        var payload = parts[1].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        payload += String(repeating: "=", count: (4 - payload.count % 4) % 4)
        guard let data = Data(base64Encoded: payload),
              let claims = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return nil }
        return claims["bid"] as? String
    }

    /// A write Apple takes: recorded (once it passes the token, the faults and `check`, which
    /// answers Apple's refusal of the body if it has one), answered `status`.
    private func recordWrite(
        _ request: Request, status: Int, check: @Sendable (ByteBuffer) -> (Int, String)? = { _ in nil }
    ) async throws -> Response {
        var request = request
        let buffer = try await request.collectBody(upTo: 1 << 20)
        let body = String(buffer: buffer)
        // The transaction id: the path's segment after `transactions/` (and `consumption/`).
        let segments = request.uri.path.split(separator: "/").map(String.init)
        let id = segments.last == "finish" || segments.last == "appAccountToken" ? segments.dropLast().last ?? "" : segments.last ?? ""
        return try await answer(request) {
            guard await self.state.knows(id.removingPercentEncoding ?? id) else {
                return (404, #"{"errorCode": 4040010, "errorMessage": "Transaction id not found."}"#)
            }
            if let refusal = check(buffer) { return refusal }
            await self.state.wrote(Write(method: request.method.rawValue, path: request.uri.path, body: body))
            return (status, "")
        }
    }

    /// The token checked, the next fault played, else `route`'s status and JSON.
    func answer(_ request: Request, _ route: () async throws -> (Int, String)) async throws -> Response {
        let authorization = request.headers[.authorization] ?? ""
        let token = authorization.hasPrefix("Bearer ") ? String(authorization.dropFirst(7)) : nil
        let fault = await state.arrived(token: token)
        guard let token, await problem(with: token) == nil else {
            await state.refused()
            return Self.json(401, #"{"errorCode": 4010000, "errorMessage": "Unauthenticated"}"#)
        }
        switch fault {
        case .tooManyRequests(let after)?:
            let until = Date().addingTimeInterval(Double(after.components.seconds) + Double(after.components.attoseconds) / 1e18)
            var response = Self.json(429, #"{"errorCode": 4290000, "errorMessage": "Rate limit exceeded."}"#)
            response.headers[.retryAfter] = String(Int64(until.timeIntervalSince1970 * 1000))
            return response
        case .tooManyRequestsWithoutRetryAfter?:
            return Self.json(429, #"{"errorCode": 4290000, "errorMessage": "Rate limit exceeded."}"#)
        case .tooManyRequestsRetryAfter(let value)?:
            var response = Self.json(429, #"{"errorCode": 4290000, "errorMessage": "Rate limit exceeded."}"#)
            response.headers[.retryAfter] = value
            return response
        case .serverError?:
            return Self.json(500, #"{"errorCode": 5000000, "errorMessage": "An unknown error occurred."}"#)
        case .slow(let duration)?:
            try await Task.sleep(for: duration)
        case .held?:
            await state.hold()
        case .malformed?:
            return Self.json(200, #"{"revision": 12, "signedTransactions": "#)
        case .answer(let body)?:
            return Self.json(200, body)
        case .refused(let status, let code)?:
            return Self.json(status, #"{"errorCode": \#(code), "errorMessage": "Refused."}"#)
        case nil:
            break
        }
        let (status, body) = try await route()
        return Self.json(status, body)
    }

    static func json(_ status: Int, _ body: String) -> Response {
        Response(status: .init(code: status), headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: body)))
    }
}
