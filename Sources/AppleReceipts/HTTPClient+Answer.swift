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

    /// Sends `request` and reads its answer (at most `limit` bytes of body), the whole of it
    /// within `timeout`: an answer whose head came in time but whose body stalls throws
    /// `deadlineExceeded` as one that never came does (`execute`'s deadline ends with the head).
    /// A request that got no answer throws, for the caller's tries.
    func answer(_ request: HTTPClientRequest, timeout: TimeAmount, limit: Int, logger: Logger) async throws -> AppleAnswer {
        let deadline = NIODeadline.now() + timeout
        let response = try await execute(request, deadline: deadline, logger: logger)
        let body = try await withThrowingTaskGroup(of: ByteBuffer?.self) { group in
            group.addTask { try await response.body.collect(upTo: limit) }
            group.addTask {
                try await _Concurrency.Task.sleep(nanoseconds: UInt64(max(0, (deadline - .now()).nanoseconds)))
                return nil
            }
            defer { group.cancelAll() }
            guard let first = try await group.next(), let body = first else { throw HTTPClientError.deadlineExceeded }
            return body
        }
        return AppleAnswer(status: Int(response.status.code), retryAfter: response.headers.first(name: "Retry-After"), body: body)
    }
}
