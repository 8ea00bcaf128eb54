import HTTPTypes
import NIOCore
import NIOHTTPTypes

/// Answers a request's `Expect: 100-continue` with `100 Continue` as soon as its head arrives.
/// Clients that send it wait for that answer before the body: libcurl (and so PHP's curl) does
/// for every body over 1 KiB, which a receipt or a signed transaction is, and without the answer
/// it sends the body only after a second of waiting (RFC 9110, section 10.1.1).
final class ContinueHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundOut = HTTPResponsePart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(let request) = unwrapInboundIn(data),
           let expectation = request.headerFields[.expect],
           expectation.lowercased() == "100-continue" {
            context.writeAndFlush(wrapOutboundOut(.head(HTTPResponse(status: .continue))), promise: nil)
        }
        context.fireChannelRead(data)
    }
}
