import HTTPTypes
import Logging
import NIOCore
import NIOHTTPTypes
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Closes a connection whose request has not arrived whole `seconds` after the server began to
/// read it: a client that trickles a body (a byte every few seconds never lets the idle time-out
/// fire) held its connection, and the answer it may already have had (a 401 before its body), for
/// as long as it liked. The time runs from the request's head, or, for a request pipelined behind
/// another, from the end of the answer before it (its body is not read until then); a request
/// that arrived is never cut off while it is answered.
final class RequestDeadlineHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let seconds: Int64
    private var deadline: Scheduled<Void>?
    /// A request's head is in and its end is not.
    private var reading = false
    /// Requests whose head came in and whose answer has not ended yet.
    private var unanswered = 0

    init(seconds: Int) {
        self.seconds = Int64(seconds)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head:
            reading = true
            unanswered += 1
            if unanswered == 1 { start(context) }
        case .body:
            break
        case .end:
            reading = false
            stop()
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) {
            unanswered = max(0, unanswered - 1)
            // The request behind it is read from now on.
            if reading, unanswered == 1, deadline == nil { start(context) }
        }
        context.write(data, promise: promise)
    }

    private func start(_ context: ChannelHandlerContext) {
        stop()
        let context = NIOLoopBound(context, eventLoop: context.eventLoop)
        deadline = context.value.eventLoop.scheduleTask(in: .seconds(seconds)) {
            context.value.close(promise: nil)
        }
    }

    private func stop() {
        deadline?.cancel()
        deadline = nil
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        stop()
    }
}

/// At most `limit` client connections open at once, across the server: one more is closed as it
/// opens, with a warning at most once a minute. The limit stays below the process's limit of open
/// files, so that PostgreSQL's connections, the private cluster's pipes and the runtime's own
/// descriptors are always there: 20,000 connections trickling bodies took the last of them, and
/// the server died (a trap in libdispatch).
final class ConnectionLimitHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart

    /// The count shared by every connection of one server.
    final class Count: Sendable {
        let limit: Int
        let logger: Logger
        private let open = Atomic<Int>(0)
        private let lastWarning = Mutex<ContinuousClock.Instant?>(nil)

        init(limit: Int, logger: Logger) {
            self.limit = limit
            self.logger = logger
        }

        /// Takes a place, or answers false when none is left.
        func take() -> Bool {
            let now = open.add(1, ordering: .relaxed).newValue
            guard now > limit else { return true }
            open.subtract(1, ordering: .relaxed)
            let due = lastWarning.withLock { last in
                let time = ContinuousClock.now
                guard last.map({ time - $0 >= .seconds(60) }) ?? true else { return false }
                last = time
                return true
            }
            if due { logger.warning("a connection was closed as it opened: the server holds its most", metadata: ["connections.limit": "\(limit)"]) }
            return false
        }

        func give() { open.subtract(1, ordering: .relaxed) }

        /// What the process may open (its soft limit raised to the hard one first, as Go's runtime
        /// does), less what the server needs besides its clients: a quarter of it, at least 256
        /// and at most 4,096 descriptors.
        static func defaultLimit() -> Int {
            var limits = rlimit()
            let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
            guard getrlimit(resource, &limits) == 0 else { return 768 }
            if limits.rlim_cur < limits.rlim_max {
                var raised = limits
                raised.rlim_cur = limits.rlim_max
                if setrlimit(resource, &raised) == 0 { limits = raised }
            }
            guard limits.rlim_cur != rlim_t.max else { return 1 << 20 }
            let files = Int(clamping: limits.rlim_cur)
            return max(16, files - min(4_096, max(256, files / 4)))
        }
    }

    private let count: Count
    private var counted = false

    init(count: Count) {
        self.count = count
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { admit(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        // A connection refused is closed here, and the handlers after this one never see it open.
        if admit(context) { context.fireChannelActive() }
    }

    /// Counts the connection in, or closes it: whether it stays open.
    @discardableResult
    private func admit(_ context: ChannelHandlerContext) -> Bool {
        guard !counted else { return true }
        if count.take() {
            counted = true
            return true
        }
        context.close(promise: nil)
        return false
    }

    func channelInactive(context: ChannelHandlerContext) {
        release()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        release()
    }

    private func release() {
        if counted {
            counted = false
            count.give()
        }
    }
}
