import Foundation
import Hummingbird

/// An error answered as `{"error": {"code", "message", …}}` with a stable code.
public struct APIError: Error, HTTPResponseError, Sendable {
    public let status: HTTPResponse.Status
    public let code: String
    public let message: String
    /// Further fields of the error object, such as the current version of a stream (values are
    /// JSON-serializable: strings, numbers, arrays of them).
    public let details: [String: any Sendable]
    public let headers: HTTPFields

    public init(_ status: HTTPResponse.Status, code: String, message: String, details: [String: any Sendable] = [:], headers: HTTPFields = [:]) {
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers
    }

    public func response(from request: Request, context: some RequestContext) throws -> Response {
        response(requestID: nil)
    }

    func response(requestID: String?) -> Response {
        var error: [String: Any] = details
        error["code"] = code
        error["message"] = message
        if let requestID { error["requestId"] = requestID }
        let body = (try? JSONSerialization.data(withJSONObject: ["error": error], options: [.sortedKeys])) ?? Data()
        var headers = headers
        headers[.contentType] = "application/json; charset=utf-8"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }
}
