import HTTPTypes
import NIOCore
import NIOHTTPTypes

/// Answers a request's `Expect: 100-continue` with `100 Continue` as soon as its head arrives.
/// Clients that send it wait for that answer before the body, a second without it (RFC 9110,
/// section 10.1.1): libcurl before 7.69 (the PHP curl of CentOS 7 or Ubuntu 18.04) for every
/// POST body over 1 KiB, which a receipt or a signed transaction is; later ones for bodies over
/// 1 MiB and for uploads (`curl -T`).
///
/// Only while no earlier request of the connection awaits its answer: a pipelining client's
/// `100` would otherwise come before, or inside, the answer to the request before it. Such a
/// client sends its body after its own wait, as before.
final class ContinueHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    /// Requests whose head came in and whose answer has not ended yet.
    private var unanswered = 0

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(let request) = unwrapInboundIn(data) {
            unanswered += 1
            if unanswered == 1, let expectation = request.headerFields[.expect], expectation.lowercased() == "100-continue" {
                context.writeAndFlush(wrapOutboundOut(.head(HTTPResponse(status: .continue))), promise: nil)
            }
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) { unanswered = max(0, unanswered - 1) }
        context.write(data, promise: promise)
    }
}
