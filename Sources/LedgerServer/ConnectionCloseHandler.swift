import HTTPTypes
import NIOCore
import NIOHTTPTypes

/// Reads a request's `Connection` options as HTTP says they are: case-insensitive tokens of a
/// list (RFC 9110, section 7.6.1). Hummingbird closes after the answer only for the exact value
/// `close`; `Close` (classic PHP socket code sends it), `CLOSE` or `keep-alive, close` left the
/// connection open until the idle time-out, and a client reading to the end waited for it.
final class ConnectionCloseHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .head(var request) = unwrapInboundIn(data), let options = request.headerFields[.connection], options != "close",
              options.split(separator: ",").contains(where: { $0.trimmingCharacters(in: .whitespaces).lowercased() == "close" }) else {
            context.fireChannelRead(data)
            return
        }
        request.headerFields[.connection] = "close"
        context.fireChannelRead(wrapInboundOut(.head(request)))
    }
}
