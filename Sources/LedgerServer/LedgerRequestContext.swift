import Hummingbird

/// The request context of every ledger route: Hummingbird's core plus the request id.
public struct LedgerRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// The caller's `X-Request-Id` when it sent a usable one, else one made here.
    public var requestID: String
    /// The name of the API key the request came with, once authenticated.
    public var apiKeyName: String?

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        requestID = ""
    }

    /// Bodies are read by `JSONBody` with the API's own limit and error.
    public var maxUploadSize: Int { JSONBody.maximumBytes }
}
