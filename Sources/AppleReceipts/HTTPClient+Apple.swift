import AsyncHTTPClient
import NIOCore

extension HTTPClient {
    /// The client the ledger asks Apple with (verifyReceipt, the App Store Server API, App Store
    /// Connect): the shared client's settings, but a connection that cannot be made (refused, no
    /// route, no name) fails the try that waits for it at once, or after 10 s without an answer to
    /// connect, and the caller's own tries and back-off take over. The shared client's pool
    /// waits up to 90 s for a connection, so each try ran to the request's time-out (30 s by
    /// default), five tries over: two and a half minutes before a proxy that is down was
    /// reported. The pool's own retries of a connection stay off: with them on, it backs off up
    /// to a minute between attempts after an outage, and a try waiting for a connection then fails
    /// while the host is back; off, one failed attempt fails every try then waiting for that host,
    /// each of which the caller tries again after its back-off.
    public static let apple: HTTPClient = {
        var configuration = HTTPClient.Configuration.singletonConfiguration
        configuration.timeout.connect = .seconds(10)
        configuration.connectionPool.retryConnectionEstablishment = false
        return HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
    }()
}
