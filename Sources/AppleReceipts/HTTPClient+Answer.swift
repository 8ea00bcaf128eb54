import AsyncHTTPClient
import Logging
import NIOCore

extension HTTPClient {
    /// An answer of one of Apple's APIs, read whole: its status, its `Retry-After`, its body.
    struct AppleAnswer {
        let status: Int
        let retryAfter: String?
        let body: ByteBuffer
    }

    /// Sends `request` and reads its answer (at most `limit` bytes of body); a request that got no
    /// answer throws, for the caller's tries.
    func answer(_ request: HTTPClientRequest, timeout: TimeAmount, limit: Int, logger: Logger) async throws -> AppleAnswer {
        let response = try await execute(request, timeout: timeout, logger: logger)
        return AppleAnswer(
            status: Int(response.status.code), retryAfter: response.headers.first(name: "Retry-After"),
            body: try await response.body.collect(upTo: limit))
    }
}
