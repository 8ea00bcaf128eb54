import Hummingbird
import LedgerCore

/// Refuses a `/v1/` request whose query names a parameter its route does not take, or names one
/// twice (400 `invalid-input` naming it), so that a misspelt `frm=` or `bundleID=` is refused
/// rather than ignored: a report of the default 30 days, or of every app, would look like an answer.
struct QueryParameterMiddleware: RouterMiddleware {
    typealias Context = LedgerRequestContext

    /// The query parameters of the routes that take any (docs/openapi.yaml), by method and path
    /// pattern; every other route takes none.
    static let parameters: [Rule] = [
        Rule(.get, "/v1/orders", ["userId", "productId", "bundleId", "state", "after", "limit"]),
        Rule(.get, "/v1/transactions/unmatched", ["userId", "productId", "bundleId", "transactionId", "from", "to", "after", "limit"]),
        Rule(.post, "/v1/apple-orders/{appleOrderId}/lookup", ["bundleId"]),
        Rule(.post, "/v1/recover", ["bundleId"]),
        Rule(.get, "/v1/users/{userId}/subscriptions", ["bundleId"]),
        Rule(.get, "/v1/users/{userId}/entitlements", ["bundleId"]),
        Rule(.get, "/v1/subscriptions/{originalTransactionId}", ["refresh"]),
        Rule(.get, "/v1/reports/reconciliation", ["from", "to"]),
        Rule(.get, "/v1/reports/apple", ["from", "to"]),
        Rule(.post, "/v1/imports", ["source"]),
        Rule(.get, "/v1/events", ["after", "limit"]),
        Rule(.get, "/v1/streams/{streamId}/events", ["from", "limit"]),
    ]

    /// A route's query parameters.
    struct Rule: Sendable {
        let method: HTTPRequest.Method
        let pattern: [Substring]
        let names: [String]

        init(_ method: HTTPRequest.Method, _ path: String, _ names: [String]) {
            self.method = method
            self.pattern = path.split(separator: "/")
            self.names = names
        }
    }

    /// The routes served: a path no route serves is left to the router's 404 or 405.
    let routes: RouteTable

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let request = Self.plusAsSpace(request)
        let query = request.uri.queryParameters
        let segments = request.uri.path.split(separator: "/")
        // Apple's notification URL is the operator's to write in App Store Connect: a query
        // there (a tag) must never cost a notification.
        guard !query.isEmpty, segments.first == "v1", segments.dropFirst().first != "notifications", routes.methods(for: request.uri.path).contains("\(request.method)") else {
            return try await next(request, context)
        }
        // Hummingbird reads `%FF` as U+FFFD and keeps `%zz` as written: a filter on either would
        // be on text the client never sent. Decoded as a path id is, or refused.
        for piece in (request.uri.query ?? "").split(separator: "&") {
            let parts = piece.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.allSatisfy({ percentDecoded(String($0)) != nil }) else {
                throw LedgerInputError(field: percentDecoded(String(parts[0])) ?? String(parts[0]), problem: "is not valid percent-encoding of UTF-8 text")
            }
        }
        let names = Self.names(request.method, segments)
        var seen = Set<Substring>()
        // An empty name (`?&limit=3`, a trailing `&` from a URL builder) names nothing.
        for (name, _) in query where !name.isEmpty {
            // Named as the client wrote it (a `+` it sent is `%20` here, an escape unread).
            let written = percentDecoded(String(name)) ?? String(name)
            guard names.contains(String(name)) else {
                let taken = names.isEmpty ? "this route takes no query parameters" : "use \(names.joined(separator: ", "))"
                throw LedgerInputError(field: written, problem: "is not a query parameter of \(request.method) \(request.uri.path); \(taken)")
            }
            guard seen.insert(name).inserted else {
                throw LedgerInputError(field: written, problem: "is given more than once; give it once")
            }
        }
        return try await next(request, context)
    }

    /// `request` with each `+` of its query read as a space, as HTML forms and every common
    /// client's query encoder write one (Python's urlencode, URLSearchParams, Go's url.Values,
    /// PHP's http_build_query; a `+` itself they write `%2B`): a `next` of `"pg 1"` handed back
    /// as `after=pg+1` finds the next page, not an order `pg+1`. Hummingbird keeps `+` as it is.
    static func plusAsSpace(_ request: Request) -> Request {
        guard let path = request.head.path, let mark = path.firstIndex(of: "?"), path[mark...].contains("+") else { return request }
        var head = request.head
        head.path = String(path[...mark]) + path[path.index(after: mark)...].replacingOccurrences(of: "+", with: "%20")
        return Request(head: head, body: request.body)
    }

    /// The query parameters `method` takes on the path of `segments`. HEAD takes GET's but
    /// `refresh`, which asks Apple and records what it answers: a HEAD changes nothing.
    static func names(_ method: HTTPRequest.Method, _ segments: [Substring]) -> [String] {
        let names = parameters.first { $0.method == (method == .head ? .get : method) && RouteTable.matches($0.pattern, segments) }?.names ?? []
        return method == .head ? names.filter { $0 != "refresh" } : names
    }
}
