import HTTPTypes
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1

/// Reads a request's `Connection` options as HTTP says they are: case-insensitive tokens of a
/// list (RFC 9110, section 7.6.1). Hummingbird closes after the answer only for the exact value
/// `close`; `Close` (classic PHP socket code sends it), `CLOSE` or `keep-alive, close` left the
/// connection open until the idle time-out, and a client reading to the end waited for it.
///
/// An HTTP/1.0 request without `Connection: keep-alive` asks the same (RFC 9112, section 9.3),
/// but the version is gone from the request by the time this handler reads it: `HTTP10Close`,
/// which this handler places before Hummingbird's HTTP/1 codec, writes it as `close`.
final class ConnectionCloseHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart

    func handlerAdded(context: ChannelHandlerContext) {
        let pipeline = context.pipeline.syncOperations
        guard let codec = try? pipeline.handler(type: HTTP1ToHTTPServerCodec.self) else { return }
        try? pipeline.addHandler(HTTP10Close(), position: .before(codec))
    }

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

/// An HTTP/1.0 request's head, before it loses its version: without `Connection: keep-alive`,
/// its connection closes after the answer, so it says `close`; its `Expect: 100-continue` is
/// ignored, as HTTP says for HTTP/1.0 (RFC 9110, section 10.1.1), so `ContinueHandler` sends no
/// `100 Continue` such a client cannot read.
final class HTTP10Close: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .head(var head) = unwrapInboundIn(data), head.version == .http1_0 else {
            context.fireChannelRead(data)
            return
        }
        if !head.isKeepAlive { head.headers.replaceOrAdd(name: "connection", value: "close") }
        head.headers.remove(name: "expect")
        context.fireChannelRead(wrapInboundOut(.head(head)))
    }
}
