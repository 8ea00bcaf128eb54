import Foundation
import Hummingbird
import LedgerJSON
import LedgerStore

/// An error answered as `{"error": {"code", "message", …}}` with a stable code.
public struct APIError: Error, HTTPResponseError, Sendable {
    public let status: HTTPResponse.Status
    public let code: String
    public let message: String
    /// Further fields of the error object, such as the current version of a stream.
    public let details: [String: JSONValue]
    public let headers: HTTPFields

    public init(_ status: HTTPResponse.Status, code: String, message: String, details: [String: JSONValue] = [:], headers: HTTPFields = [:]) {
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
        var error = details
        error["code"] = .string(code)
        error["message"] = .string(message)
        if let requestID { error["requestId"] = .string(requestID) }
        let body = (try? EventCoding.encoder.encode(["error": error])) ?? Data()
        var headers = headers
        headers[.contentType] = jsonContentType
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: body)))
    }
}

extension JSONValue {
    /// A list of strings, as error details give allowed values.
    static func strings(_ values: [String]) -> JSONValue { .array(values.map(JSONValue.string)) }
    /// An integer.
    static func integer(_ value: Int64) -> JSONValue { .number(Decimal(value)) }
}

extension APIError: CustomStringConvertible {
    /// The code and the message, as a command prints a refusal.
    public var description: String { "\(code): \(message)" }
}
