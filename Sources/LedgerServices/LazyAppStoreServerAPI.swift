import AppleReceipts
import Logging

/// The App Store Server API client, made on first use from settings checked at start.
public actor LazyAppStoreServerAPI {
    let settings: AppStoreServerAPI.Settings
    let logger: Logger
    private var made: AppStoreServerAPI?

    public init(settings: AppStoreServerAPI.Settings, logger: Logger) {
        self.settings = settings
        self.logger = logger
    }

    public func client() async throws(AppStoreServerAPIError) -> AppStoreServerAPI {
        if let made { return made }
        let client = try await AppStoreServerAPI(settings: settings, logger: logger)
        made = client
        return client
    }
}
