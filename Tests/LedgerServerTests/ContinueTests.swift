import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Testing

@Suite("Expect: 100-continue over HTTP")
struct ContinueTests {
    /// Sends `head` alone on a new connection to `port`, reads what the server answers before
    /// the body (up to 30 s), then sends `body` and reads what follows until the server closes.
    static func exchange(_ port: Int, head: String, body: String) -> (interim: String, final: String) {
        guard let descriptor = IdleConnectionTests.connected(to: port) else { return ("not connected", "") }
        defer { close(descriptor) }
        func read(until done: ([UInt8]) -> Bool) -> String {
            var received = [UInt8]()
            var buffer = [UInt8](repeating: 0, count: 4096)
            while !done(received) {
                let count = recv(descriptor, &buffer, buffer.count, 0)
                if count <= 0 { break }  // closed, or the 30 s passed
                received += buffer[0..<count]
            }
            return String(decoding: received, as: UTF8.self)
        }
        _ = head.withCString { send(descriptor, $0, strlen($0), 0) }
        let interim = read { String(decoding: $0, as: UTF8.self).contains("\r\n\r\n") }
        _ = body.withCString { send(descriptor, $0, strlen($0), 0) }
        return (interim, read { _ in false })
    }

    @Test("a request that expects 100-continue gets it before it sends its body, then its answer")
    func continueBeforeBody() async throws {
        try await withLiveApplication { http, _ in
            let port = http.client.port
            // As libcurl sends a body over 1 KiB: the head, then the body once told to continue.
            let body = #"{"orderId":"continued","userId":"u-1","productId":"gems.100","price":"0.99","currency":"USD"}"#
            let head = "POST /v1/orders HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(http.key)\r\n"
                + "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
            let (interim, final) = await IdleConnectionTests.onThread { Self.exchange(port, head: head, body: body) }
            #expect(interim == "HTTP/1.1 100 Continue\r\n\r\n", "before the body: \(interim.debugDescription)")
            #expect(final.hasPrefix("HTTP/1.1 201"), "\(final)")
            let order = try await http.client.execute(
                uri: "/v1/orders/continued", method: .get, headers: [.authorization: "Bearer \(http.key)"])
            #expect(order.status == .ok)
        }
    }

    @Test("behind a pipelined request still unanswered, no 100 comes before that request's answer")
    func noContinueAheadOfAnEarlierAnswer() async throws {
        try await withLiveApplication { http, _ in
            let port = http.client.port
            let body = #"{"orderId":"pipelined","userId":"u-1","productId":"gems.100"}"#
            let heads = "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
                + "POST /v1/orders HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(http.key)\r\n"
                + "Content-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
            let (first, rest) = await IdleConnectionTests.onThread { Self.exchange(port, head: heads, body: body) }
            #expect(first.hasPrefix("HTTP/1.1 200"), "first: \(first.debugDescription)")
            #expect(!(first + rest).contains("100 Continue") && rest.contains("HTTP/1.1 201"), "\((first + rest).debugDescription)")
        }
    }
}
