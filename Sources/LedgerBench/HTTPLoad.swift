import Foundation
import NIOCore
import NIOPosix

/// A lean HTTP/1.1 load generator for the benchmarks, in the manner of `wrk`: keep-alive
/// connections on one event loop, each sending its next request as soon as the answer to the
/// last one is complete. There is no task, future or connection-pool bookkeeping per request:
/// AsyncHTTPClient took a third of a core at 3,000 requests/s, which the server under test, on the
/// same two cores, then lacked (docs/performance.md).
///
/// It reads only what the benchmarks need from an answer: the status and a `Content-Length`
/// body. An answer it cannot read that way fails the run, it is never counted as a success.
enum HTTPLoad {
    /// One request, rendered once, sent as is.
    struct Request: Sendable {
        let bytes: ByteBuffer

        init(method: String, path: String, host: String, headers: [(String, String)] = [], body: String = "") {
            var head = "\(method) \(path) HTTP/1.1\r\nHost: \(host)\r\n"
            for (name, value) in headers { head += "\(name): \(value)\r\n" }
            head += "Content-Length: \(body.utf8.count)\r\n\r\n"
            bytes = ByteBuffer(string: head + body)
        }
    }

    /// What one connection (or, merged, a whole run) measured.
    struct Outcome: Sendable {
        /// Milliseconds from sending a request to the end of its answer, for 2xx answers.
        var latencies: [Double] = []
        /// Answers with another status.
        var failures = 0
        /// Sequences of requests sent whole.
        var sequences = 0
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    /// Opens `connections` connections to `host:port`; each sends sequence after sequence
    /// (`sequence(connection, n)`, for example an order's creation and its events, in order)
    /// until `deadline` has passed, finishing the sequence it is in. Answers the merged outcome.
    static func run(
        on loop: any EventLoop, host: String, port: Int, connections: Int, until deadline: NIODeadline,
        sequence: @escaping @Sendable (_ connection: Int, _ n: Int) -> [Request]
    ) async throws -> Outcome {
        var futures: [EventLoopFuture<Outcome>] = []
        for connection in 0..<connections {
            let done = loop.makePromise(of: Outcome.self)
            let bootstrap = ClientBootstrap(group: loop)
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(
                            LoadHandler(connection: connection, deadline: deadline, sequence: sequence, done: done))
                    }
                }
            bootstrap.connect(host: host, port: port).whenFailure { done.fail($0) }
            futures.append(done.futureResult)
        }
        var merged = Outcome()
        for future in futures {
            let outcome = try await future.get()
            merged.latencies += outcome.latencies
            merged.failures += outcome.failures
            merged.sequences += outcome.sequences
        }
        return merged
    }
}

/// One connection's requests and answers, all on its event loop.
private final class LoadHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let connection: Int
    private let deadline: NIODeadline
    private let sequence: @Sendable (Int, Int) -> [HTTPLoad.Request]
    private let done: EventLoopPromise<HTTPLoad.Outcome>
    private var outcome = HTTPLoad.Outcome()
    private var requests: [HTTPLoad.Request] = []
    private var next = 0
    private var sequencesStarted = 0
    private var sentAt = NIODeadline.now()
    private var received: ByteBuffer?
    private var finished = false

    init(connection: Int, deadline: NIODeadline, sequence: @escaping @Sendable (Int, Int) -> [HTTPLoad.Request],
         done: EventLoopPromise<HTTPLoad.Outcome>) {
        self.connection = connection
        self.deadline = deadline
        self.sequence = sequence
        self.done = done
    }

    func channelActive(context: ChannelHandlerContext) {
        sendNext(context)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var chunk = unwrapInboundIn(data)
        if received == nil { received = chunk } else { received!.writeBuffer(&chunk) }
        do {
            guard let status = try takeAnswer() else { return }
            if (200..<300).contains(status) {
                outcome.latencies.append(Double((NIODeadline.now() - sentAt).nanoseconds) / 1_000_000)
            } else {
                outcome.failures += 1
            }
            sendNext(context)
        } catch {
            finish(context, .failure(error))
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish(context, .failure(HTTPLoad.Failure(description: "the server closed connection \(connection) before the run ended")))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        finish(context, .failure(error))
    }

    private func sendNext(_ context: ChannelHandlerContext) {
        if next == requests.count {
            if !requests.isEmpty { outcome.sequences += 1 }
            if NIODeadline.now() >= deadline {
                finish(context, .success(outcome))
                return
            }
            requests = sequence(connection, sequencesStarted)
            sequencesStarted += 1
            next = 0
        }
        sentAt = .now()
        context.writeAndFlush(wrapOutboundOut(requests[next].bytes), promise: nil)
        next += 1
    }

    private func finish(_ context: ChannelHandlerContext, _ result: Result<HTTPLoad.Outcome, any Error>) {
        guard !finished else { return }
        finished = true
        done.completeWith(result)
        context.close(promise: nil)
    }

    /// The status of the first whole answer in `received`, which it then drops; nil until one
    /// has arrived. Read from the bytes: splitting the head into lowercased strings and trimming
    /// them with Foundation cost the client more than the rest of a request.
    private func takeAnswer() throws -> Int? {
        guard var buffer = received else { return nil }
        let view = buffer.readableBytesView
        guard let headEnd = Self.find(Self.headEndMark, in: view) else { return nil }
        let start = view.startIndex
        func digit(_ index: Int) -> Int? {
            (0x30...0x39).contains(view[index]) ? Int(view[index] - 0x30) : nil
        }
        guard headEnd - start >= 12, view[start..<(start + 9)].elementsEqual("HTTP/1.1 ".utf8),
              let hundreds = digit(start + 9), let tens = digit(start + 10), let units = digit(start + 11) else {
            throw HTTPLoad.Failure(description: "not an HTTP/1.1 answer: \(String(decoding: view.prefix(80), as: UTF8.self))")
        }
        guard let length = Self.contentLength(view, headEnd: headEnd) else {
            throw HTTPLoad.Failure(description: "an answer without Content-Length: \(String(decoding: view.prefix(200), as: UTF8.self))")
        }
        let total = headEnd - start + 4 + length
        guard buffer.readableBytes >= total else { return nil }
        buffer.moveReaderIndex(forwardBy: total)
        received = buffer.readableBytes > 0 ? buffer : nil
        return hundreds * 100 + tens * 10 + units
    }

    private static let headEndMark = Array("\r\n\r\n".utf8)
    private static let contentLengthName = Array("\r\ncontent-length:".utf8)

    /// The value of the head's Content-Length field (its name in any case).
    private static func contentLength(_ view: ByteBufferView, headEnd: Int) -> Int? {
        let name = contentLengthName
        var index = view.startIndex
        while index + name.count <= headEnd {
            // ORing 0x20 lowercases the letters and leaves "\r\n-:" as they are.
            if (0..<name.count).allSatisfy({ view[index + $0] | (name[$0] < 0x40 ? 0 : 0x20) == name[$0] }) {
                var value = index + name.count
                while value < headEnd, view[value] == 0x20 || view[value] == 0x09 { value += 1 }
                var length = 0
                let first = value
                while value < headEnd, value - first < 18, (0x30...0x39).contains(view[value]) {
                    length = length * 10 + Int(view[value] - 0x30)
                    value += 1
                }
                return value > first ? length : nil
            }
            index += 1
        }
        return nil
    }

    private static func find(_ needle: [UInt8], in view: ByteBufferView) -> Int? {
        guard view.count >= needle.count else { return nil }
        var index = view.startIndex
        let last = view.endIndex - needle.count
        while index <= last {
            if view[index] == needle[0] && view[index + 1] == needle[1] && view[index + 2] == needle[2] && view[index + 3] == needle[3] {
                return index
            }
            index += 1
        }
        return nil
    }
}
