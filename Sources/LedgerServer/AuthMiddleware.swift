import Hummingbird
import LedgerStore

/// Requires `Authorization: Bearer <key>` on the API routes, with the scope the route needs:
/// 401 without a key or with an unknown or revoked one, 403 with a key that lacks the scope, and
/// 403 `all-apps-key-required` with a key limited to apps on a route that reaches every app.
struct AuthMiddleware: RouterMiddleware {
    typealias Context = LedgerRequestContext

    let keys: APIKeyCache

    init(keys: APIKeyStore, cacheTTL: Duration = .seconds(5)) {
        self.keys = APIKeyCache(keys: keys, ttl: cacheTTL)
    }

    /// A 401 saying `problem`; or, for a request with several Authorization headers (read as one
    /// list, so no key: which one was meant is not guessed), saying that. Asked only once the
    /// header found no key, so that an admitted request counts no headers.
    static func unauthorized(_ problem: String, _ request: Request) -> APIError {
        let several = request.headers[values: .authorization].count > 1
        return APIError(.unauthorized, code: "unauthorized", message: several ? "send one Authorization header; this request has several" : problem,
                        headers: [.wwwAuthenticate: "Bearer"])
    }

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard let scope = Self.requiredScope(request.method, request.uri.path) else {
            return try await next(request, context)
        }
        // The scheme's name in any case (RFC 9110: `bearer` is `Bearer`).
        guard let header = request.headers[.authorization], header.utf8.count > 7,
              header.utf8.prefix(6).map({ $0 | 0x20 }).elementsEqual("bearer".utf8), header.utf8.dropFirst(6).first == UInt8(ascii: " "),
              case let key = Self.trimmed(header.utf8.dropFirst("Bearer ".count)), !key.isEmpty, key.utf8.count <= 256
        else {
            throw Self.unauthorized("send an API key as Authorization: Bearer <key>", request)
        }
        guard let record = try await keys.find(key: key) else {
            throw Self.unauthorized("the API key is unknown or revoked", request)
        }
        guard record.allows(scope) else {
            throw APIError(.forbidden, code: "forbidden", message: "the key \(record.name) lacks the \(scope.rawValue) scope",
                           details: ["requiredScope": .string(scope.rawValue)])
        }
        if let apps = record.apps, Self.reachesEveryApp(request.method, request.uri.path) {
            throw APIError(.forbidden, code: "all-apps-key-required",
                           message: "\(request.method) \(request.uri.path) reaches every app; the key \(record.name) reaches only \(apps.map(\.rawValue).joined(separator: ", "))",
                           details: ["apps": .strings(apps.map(\.rawValue))])
        }
        var context = context
        context.apiKeyName = record.name
        context.keyApps = record.apps
        context.logger[metadataKey: "api.key"] = .string(record.name)
        return try await next(request, context)
    }

    /// The key without the spaces and tabs around it (Foundation's trimming, through NSString,
    /// cost 2% of the server's CPU).
    static func trimmed(_ bytes: Substring.UTF8View) -> String {
        let blank: (UInt8) -> Bool = { $0 == 0x20 || $0 == 0x09 }
        guard let first = bytes.firstIndex(where: { !blank($0) }), let last = bytes.lastIndex(where: { !blank($0) }) else { return "" }
        return String(Substring(bytes[first...last]))
    }

    /// Whether a route reaches every app, and so needs a key of every app: the global feed (its
    /// events carry no app to filter on), changes to the apps, and admin's work on every app
    /// (a reconciler pass, a history sweep, an Apple order-id lookup, an import, none of them per app yet).
    /// Decided on the path as `requiredScope` is.
    static func reachesEveryApp(_ method: HTTPRequest.Method, _ path: String) -> Bool {
        let segments = path.split(separator: "/", omittingEmptySubsequences: true)
        guard segments.first == "v1", segments.count >= 2 else { return false }
        switch segments[1] {
        case "events": return segments.count == 2
        case "apps": return method != .get && method != .head
        case "reconcile", "recover", "imports": return segments.count == 2
        case "apple-orders": return segments.count == 4 && segments[3] == "lookup"
        default: return false
        }
    }

    /// The scope a route needs, or nil for routes open to all (health, metrics).
    ///
    /// Decided on the path as the router sees it: the router ignores empty segments, so
    /// `//v1/orders` and `/v1//orders/` reach the same handlers as `/v1/orders` and must need
    /// the same key. Everything under `/v1` needs a key unless listed here as open.
    static func requiredScope(_ method: HTTPRequest.Method, _ path: String) -> APIScope? {
        let segments = path.split(separator: "/", omittingEmptySubsequences: true)
        guard segments.first == "v1" else { return nil }
        // Apple signs these instead (the one URL of every app, and each app's own).
        if (3...4).contains(segments.count) && segments[1] == "notifications" && segments[2] == "apple" { return nil }
        if (segments.count == 2 && ["reconcile", "recover", "imports"].contains(segments[1])) || (segments.count == 4 && segments[1] == "transactions" && ["match", "unmatch"].contains(segments[3]))
            || (segments.count == 4 && segments[1] == "apple-orders" && segments[3] == "lookup") {
            return .admin
        }
        // The apps, their keys and secrets among them, are the admins' alone.
        if segments.count >= 2, segments[1] == "apps" { return .admin }
        // The catalog is read by anyone with a key; changed by admins only.
        if segments.count >= 2, segments[1] == "products", method != .get, method != .head { return .admin }
        return method == .get || method == .head ? .read : .append
    }
}
