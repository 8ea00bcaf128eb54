import HTTPTypes
import Hummingbird
import Logging
import LedgerStore
import Synchronization

/// Gives every request an id (the caller's `X-Request-Id` when usable), puts it in the logger's
/// metadata and the response headers, and turns every error into the JSON error shape: unexpected
/// errors are logged at error level with the request id instead of becoming an empty 500.
struct RequestIDMiddleware: RouterMiddleware {
    typealias Context = LedgerRequestContext

    /// The routes served, to answer 405 (not 404) for a known path with another method.
    let routes: RouteTable

    static let header = HTTPField.Name("X-Request-Id")!

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var context = context
        let requestID = Self.usableID(request.headers[Self.header]) ?? context.id
        context.requestID = requestID
        context.logger[metadataKey: "request.id"] = .string(requestID)
        var response: Response
        do {
            response = try await next(request, context)
        } catch {
            response = Self.errorResponse(error, request: request, context: context, routes: routes)
        }
        response.headers[Self.header] = requestID
        return response
    }

    /// A caller's id is used when it is short printable ASCII; anything else is replaced.
    static func usableID(_ value: String?) -> String? {
        guard let value, !value.isEmpty, value.utf8.count <= 128,
              value.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else { return nil }
        return value
    }

    static func errorResponse(_ error: any Error, request: Request, context: Context, routes: RouteTable) -> Response {
        if let mapped = APIError.from(error) {
            return mapped.response(requestID: context.requestID)
        }
        switch error {
        case let error as APIError:
            return error.response(requestID: context.requestID)
        case let error as HTTPError where error.status == .notFound:
            let allowed = routes.methods(for: request.uri.path)
            guard !allowed.isEmpty else {
                return APIError(.notFound, code: "not-found", message: "no route \(request.method) \(request.uri.path)")
                    .response(requestID: context.requestID)
            }
            return APIError(.methodNotAllowed, code: "method-not-allowed",
                            message: "\(request.method) is not allowed on \(request.uri.path); allowed: \(allowed.joined(separator: ", "))",
                            headers: [.allow: allowed.joined(separator: ", ")])
                .response(requestID: context.requestID)
        case let error as HTTPError:
            let message = error.body ?? error.status.reasonPhrase
            return APIError(error.status, code: code(for: error.status), message: message, headers: error.headers)
                .response(requestID: context.requestID)
        case let error as any HTTPResponseError:
            return APIError(error.status, code: code(for: error.status), message: error.status.reasonPhrase)
                .response(requestID: context.requestID)
        case let error where isConnectionFailure(error):
            context.logger.warning("database unavailable", metadata: ["error": "\(String(reflecting: error))"])
            return APIError.databaseUnavailable.response(requestID: context.requestID)
        case let error where isTransientConflict(error):
            // Writers about one purchase deadlocked (past the store's tries, where it retries):
            // the transaction PostgreSQL ended wrote nothing, and every write here is idempotent.
            context.logger.warning("writers deadlocked", metadata: ["error": "\(String(reflecting: error))"])
            return APIError(.serviceUnavailable, code: "contention",
                            message: "requests about the same purchase got in each other's way; retry the same request",
                            headers: [.retryAfter: "1"])
                .response(requestID: context.requestID)
        default:
            context.logger.error("unexpected error", metadata: [
                "error": "\(String(reflecting: error))", "http.method": "\(request.method)", "http.path": "\(request.uri.path)",
            ])
            return APIError(.internalServerError, code: "internal",
                            message: "internal error; the server log has the details under request id \(context.requestID)")
                .response(requestID: context.requestID)
        }
    }

    static func code(for status: HTTPResponse.Status) -> String {
        switch status.code {
        case 400: "bad-request"
        case 401: "unauthorized"
        case 403: "forbidden"
        case 404: "not-found"
        case 405: "method-not-allowed"
        case 409: "conflict"
        case 413: "body-too-large"
        case 415: "unsupported-media-type"
        case 503: "unavailable"
        default: status.reasonPhrase.lowercased().replacingOccurrences(of: " ", with: "-")
        }
    }
}

/// The routes a router serves, as method and path pattern (`/v1/orders/{orderId}`), filled in
/// once the router is built; HEAD wherever GET is, as the router answers it.
final class RouteTable: Sendable {
    private let entries = Mutex<[(method: String, segments: [Substring])]>([])

    func set(_ routes: [(method: String, path: String)]) {
        let heads = routes.filter { $0.method == "GET" }.map { (method: "HEAD", path: $0.path) }
        entries.withLock { $0 = (routes + heads).map { ($0.method, $0.path.split(separator: "/")) } }
    }

    /// The methods served on a path, sorted; empty when no route has this path.
    func methods(for path: String) -> [String] {
        let segments = path.split(separator: "/")
        let methods = entries.withLock { entries in
            entries.filter { Self.matches($0.segments, segments) }.map(\.method)
        }
        return Set(methods).sorted()
    }

    /// Whether a path's segments fit a route pattern's (`{name}` takes any one segment).
    static func matches(_ pattern: [Substring], _ segments: [Substring]) -> Bool {
        pattern.count == segments.count
            && zip(pattern, segments).allSatisfy { pattern, segment in
                (pattern.hasPrefix("{") && pattern.hasSuffix("}")) || pattern == segment
            }
    }
}
