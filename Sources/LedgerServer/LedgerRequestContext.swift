import Foundation
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerStore
import NIOCore
import NIOFoundationCompat

/// The request context of every ledger route: Hummingbird's core plus the request id, with the
/// ledger's JSON conventions for bodies in (`LedgerRequestDecoder`) and out (`EventCoding.encoder`).
public struct LedgerRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// The caller's `X-Request-Id` when it sent a usable one, else one made here.
    public var requestID: String
    /// The name of the API key the request came with, once authenticated.
    public var apiKeyName: String?
    /// The apps the request's key may reach, as the apps table spells them; nil: every app (a key
    /// of every app, or a route that needs no key).
    public var keyApps: [BundleID]?

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        requestID = ""
    }

    /// The largest body the API reads.
    public static let maximumBodyBytes = 256 * 1024
    public var maxUploadSize: Int { Self.maximumBodyBytes }
    public var requestDecoder: LedgerRequestDecoder { LedgerRequestDecoder() }
    public var responseEncoder: JSONEncoder { EventCoding.encoder }

    /// The metadata recorded with every event appended through the API: the request id and the
    /// name of the key it came with.
    var eventMetadata: Data {
        // By hand, as `OrderResponse.text`: every event appended through the API carries it.
        let appendedBy = apiKeyName.map { #""appendedBy":\#(JSONString($0)),"# } ?? ""
        return Data(#"{\#(appendedBy)"requestId":\#(JSONString(requestID))}"#.utf8)
    }
}

/// Reads a request's JSON body with `EventCoding.decoder`, turning what is wrong with it into the
/// API's errors: too large (413), not a JSON object (400 `invalid-json`), a field missing, of
/// the wrong type, given twice, nested too deep or a number the ledger cannot keep exactly
/// (400 `invalid-input` naming the field; `JSONShape`).
public struct LedgerRequestDecoder: RequestDecoder {
    public func decode<T: Decodable>(_ type: T.Type, from request: Request, context: some RequestContext) async throws -> T {
        try Self.decode(type, from: try await Self.body(of: request, context: context))
    }

    /// The request's body, whole; `empty` answers an empty one (a JSON body's by default).
    static func body(
        of request: Request, context: some RequestContext, limit: Int? = nil,
        empty: @autoclosure () -> APIError = APIError(.badRequest, code: "invalid-json", message: "the body is empty; send a JSON object")
    ) async throws -> ByteBuffer {
        let buffer: ByteBuffer
        let limit = limit ?? context.maxUploadSize
        do {
            buffer = try await request.bodyWhole(upTo: limit)
        } catch is NIOTooManyBytesError {
            throw APIError(.contentTooLarge, code: "body-too-large", message: "the body is larger than \(limit / 1024) KiB")
        } catch {
            // A malformed chunk, or a connection that ended before its body did.
            throw APIError(.badRequest, code: "bad-request", message: "the body could not be read: \(error)")
        }
        guard buffer.readableBytes > 0 else { throw empty() }
        return buffer
    }

    static func decode<T: Decodable>(_ type: T.Type, from buffer: ByteBuffer) throws -> T {
        // A member given twice, nesting too deep, a number `Decimal` would round: named first.
        if let shape = buffer.withUnsafeReadableBytes({ JSONShape.problem(in: $0) }) {
            throw LedgerInputError(field: shape.path, problem: shape.problem)
        }
        do {
            if let closed = T.self as? any ClosedBody.Type { return try decodeClosed(closed, from: buffer) as! T }
            return try EventCoding.decoder.decode(T.self, from: buffer)
        } catch DecodingError.dataCorrupted(let context) where context.codingPath.isEmpty {
            throw APIError(.badRequest, code: "invalid-json", message: "the body is not valid JSON")
        } catch DecodingError.typeMismatch(_, let context) where context.codingPath.isEmpty {
            throw APIError(.badRequest, code: "invalid-json", message: "the body must be a JSON object")
        } catch let error as DecodingError {
            throw EventCoding.inputError(error, field: "body")
        }
    }

    private static func decodeClosed<Body: ClosedBody>(_: Body.Type, from buffer: ByteBuffer) throws -> Body {
        try EventCoding.decoder.decode(Closed<Body>.self, from: buffer).body
    }
}

/// A request body whose members are the ones its `CodingKeys` name: any other is a 400 naming it,
/// so that a misspelt member (an `appAcountToken`) is refused rather than dropped unseen.
/// (Apple's notification body is not one: Apple may add members.)
protocol ClosedBody: Decodable {
    associatedtype CodingKeys: CodingKey & CaseIterable
    /// Where a member the body does not take belongs instead, by its name (a query parameter).
    static var elsewhere: [String: String] { get }
}

extension ClosedBody {
    static var elsewhere: [String: String] { [:] }
}

/// `Body` once its members are checked.
struct Closed<Body: ClosedBody>: Decodable {
    let body: Body

    init(from decoder: any Decoder) throws {
        let members = Body.CodingKeys.allCases.map(\.stringValue)
        for key in try decoder.container(keyedBy: MemberKey.self).allKeys where !members.contains(key.stringValue) {
            let instead = Body.elsewhere[key.stringValue].map { " (\($0))" } ?? ""
            throw LedgerInputError(field: key.stringValue, problem: "is not a member of this body\(instead); use \(members.joined(separator: ", "))")
        }
        body = try Body(from: decoder)
    }
}

extension Request {
    /// The body, whole, read in a task of its own that a cancelled handler does not cancel.
    /// `DatabaseGateMiddleware` cancels a handler when the database is marked down, and a
    /// cancelled read of the body ends the connection's inbound stream for good (swift-nio's
    /// async channel stops reading): the 503 went out, then the server closed the keep-alive
    /// connection without `Connection: close`, and the client's next request on it got no answer.
    /// The body is read to its end (at most `RequestDeadlineHandler`'s time); the handler then
    /// stops at its first wait for the database.
    func bodyWhole(upTo limit: Int) async throws -> ByteBuffer {
        let body = self.body
        return try await Task { try await body.collect(upTo: limit) }.value
    }
}
