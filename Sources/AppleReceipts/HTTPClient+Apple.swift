import AsyncHTTPClient
import NIOCore

extension HTTPClient {
    /// The client the ledger asks Apple with (verifyReceipt, the App Store Server API, App Store
    /// Connect): the shared client's settings, but a connection that cannot be made (refused, no
    /// route, no name) fails its try at once, or after 10 s without an answer to connect, and the
    /// caller's own tries and back-off take over. The shared client's pool would keep trying to
    /// connect until the request's time-out (30 s by default), five tries over: two and a half
    /// minutes before a proxy that is down was reported.
    public static let apple: HTTPClient = {
        var configuration = HTTPClient.Configuration.singletonConfiguration
        configuration.timeout.connect = .seconds(10)
        configuration.connectionPool.retryConnectionEstablishment = false
        return HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
    }()
}
