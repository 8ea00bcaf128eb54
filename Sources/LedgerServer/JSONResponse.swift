import Foundation
import Hummingbird

/// A JSON response of any Encodable value.
func jsonResponse(_ status: HTTPResponse.Status, _ value: some Encodable, headers: HTTPFields = [:]) throws -> Response {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    encoder.dateEncodingStrategy = .iso8601
    var headers = headers
    headers[.contentType] = "application/json; charset=utf-8"
    return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: try encoder.encode(value))))
}
