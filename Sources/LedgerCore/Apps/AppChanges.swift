/// What a caller changes of an app (`ledger apps set`, `PATCH /v1/apps/{bundleId}`), or gives
/// a new one. A nil member is left as it is (for a new app: its default); `.some(nil)` clears
/// what may be cleared.
public struct AppChanges: Sendable, Equatable {
    public var appAppleId: Int64??
    public var environments: [App.Environment]?
    public var refundPreference: RefundPreference??
    public var retired: Bool?
    public var appAccountTokens: AppAccountTokenScope?
    public var sku: String??
    public var sharedSecret: String??
    public var apiKey: AppCredentials.APIKey??

    public init(
        appAppleId: Int64?? = nil, environments: [App.Environment]? = nil, refundPreference: RefundPreference?? = nil,
        retired: Bool? = nil, sharedSecret: String?? = nil, apiKey: AppCredentials.APIKey?? = nil,
        appAccountTokens: AppAccountTokenScope? = nil, sku: String?? = nil
    ) {
        self.sku = sku
        self.appAccountTokens = appAccountTokens
        self.appAppleId = appAppleId
        self.environments = environments
        self.refundPreference = refundPreference
        self.retired = retired
        self.sharedSecret = sharedSecret
        self.apiKey = apiKey
    }

    /// Whether the change touches the app's secrets.
    public var changesCredentials: Bool { sharedSecret != nil || apiKey != nil }
}
