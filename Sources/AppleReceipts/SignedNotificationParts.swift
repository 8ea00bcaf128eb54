extension SignedNotificationPayload {
    /// A notification's `summary` (Apple's Summary): the app and environment of a mass renewal
    /// date extension, and its counts.
    public struct Summary: Codable, Sendable, Equatable {
        public var bundleId: String?
        public var appAppleId: Int64?
        public var environment: String?
        public var productId: String?
        public var requestIdentifier: String?
        public var succeededCount: Int64?
        public var failedCount: Int64?

        public init(
            bundleId: String?, appAppleId: Int64?, environment: String?, productId: String? = nil, requestIdentifier: String? = nil,
            succeededCount: Int64? = nil, failedCount: Int64? = nil
        ) {
            self.bundleId = bundleId
            self.appAppleId = appAppleId
            self.environment = environment
            self.productId = productId
            self.requestIdentifier = requestIdentifier
            self.succeededCount = succeededCount
            self.failedCount = failedCount
        }
    }

    /// A notification's `externalPurchaseToken` (Apple's ExternalPurchaseToken). It names no
    /// environment: a sandbox token's id starts with `SANDBOX`, as Apple's verifier reads it.
    public struct ExternalPurchaseToken: Codable, Sendable, Equatable {
        public var externalPurchaseId: String?
        public var tokenCreationDate: Int64?
        public var bundleId: String?
        public var appAppleId: Int64?

        public init(externalPurchaseId: String?, tokenCreationDate: Int64? = nil, bundleId: String?, appAppleId: Int64?) {
            self.externalPurchaseId = externalPurchaseId
            self.tokenCreationDate = tokenCreationDate
            self.bundleId = bundleId
            self.appAppleId = appAppleId
        }

        /// The environment the token is from, as Apple's SignedDataVerifier decides it.
        public var environment: String { externalPurchaseId?.hasPrefix("SANDBOX") == true ? "Sandbox" : "Production" }
    }

    /// A notification's `appData` (Apple's AppData): the app of an app-level notification.
    public struct AppData: Codable, Sendable, Equatable {
        public var bundleId: String?
        public var appAppleId: Int64?
        public var environment: String?
        public var signedAppTransactionInfo: String?

        public init(bundleId: String?, appAppleId: Int64?, environment: String?, signedAppTransactionInfo: String? = nil) {
            self.bundleId = bundleId
            self.appAppleId = appAppleId
            self.environment = environment
            self.signedAppTransactionInfo = signedAppTransactionInfo
        }
    }

    /// The app a notification names and the part that names it: `data`, else `summary`, else
    /// `externalPurchaseToken`, else `appData` (Apple's order); nil when it carries none.
    public var namedApp: (part: String, bundleId: String?, appAppleId: Int64?, environment: String?)? {
        if let data { return ("data", data.bundleId, data.appAppleId, data.environment) }
        if let summary { return ("summary", summary.bundleId, summary.appAppleId, summary.environment) }
        if let externalPurchaseToken {
            return ("externalPurchaseToken", externalPurchaseToken.bundleId, externalPurchaseToken.appAppleId, externalPurchaseToken.environment)
        }
        if let appData { return ("appData", appData.bundleId, appData.appAppleId, appData.environment) }
        return nil
    }
}
