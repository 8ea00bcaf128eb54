import AsyncHTTPClient
import NIOCore

extension HTTPClient {
    /// The client the ledger asks Apple with (verifyReceipt, the App Store Server API, App Store
    /// Connect): the shared client's settings, but a request that gets no connection in 5 s
    /// (refused, no route, no name; the pool tries again meanwhile) fails its try, and the
    /// caller's own tries and back-off take over. The shared client's pool waits up to 90 s for
    /// one, so each try waited out the request's time-out (30 s by default), five tries over:
    /// two and a half minutes before a proxy that is down was reported.
    public static let apple: HTTPClient = {
        var configuration = HTTPClient.Configuration.singletonConfiguration
        configuration.timeout.connect = .seconds(5)
        return HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
    }()
}
