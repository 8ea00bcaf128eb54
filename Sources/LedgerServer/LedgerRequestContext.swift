import Hummingbird

/// The request context of every ledger route: Hummingbird's core plus the request id.
public struct LedgerRequestContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    /// The caller's `X-Request-Id` when it sent a usable one, else one made here.
    public var requestID: String

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        requestID = ""
    }
}
