/// An app's secrets: the legacy shared secret and the App Store Server API key. Printing one
/// shows no secret (`description` says what is there), so a log line or an error that carries
/// one by mistake leaks nothing.
public struct AppCredentials: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    /// The App Store Server API key: issuer id, key id and private key, together.
    public struct APIKey: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
        public var issuerId: String
        public var keyId: String
        public var privateKey: AppPrivateKey

        public init(issuerId: String, keyId: String, privateKey: AppPrivateKey) {
            self.issuerId = issuerId
            self.keyId = keyId
            self.privateKey = privateKey
        }

        /// Checks the ids a caller gave (`field`: where the key was given, such as `apiKey`).
        public static func checked(issuerId: String, keyId: String, privateKey: AppPrivateKey, field: String) throws(LedgerInputError) -> APIKey {
            _ = try Identifier.validate(issuerId, field: field + ".issuerId")
            _ = try Identifier.validate(keyId, field: field + ".keyId")
            return APIKey(issuerId: issuerId, keyId: keyId, privateKey: privateKey)
        }

        public var description: String { "API key \(keyId) (issuer \(issuerId), \(privateKey))" }
        public var debugDescription: String { description }
        public var customMirror: Mirror { Mirror(self, children: ["description": description]) }
    }

    public var sharedSecret: String?
    public var apiKey: APIKey?

    public init(sharedSecret: String? = nil, apiKey: APIKey? = nil) {
        self.sharedSecret = sharedSecret
        self.apiKey = apiKey
    }

    /// Checks a shared secret a caller gave: 1 to 256 characters, no control characters.
    public static func sharedSecret(_ value: String, field: String = "sharedSecret") throws(LedgerInputError) -> String {
        try Identifier.checkUnpadded(value, field: field)
        return try Identifier.validate(value, field: field, maximumLength: 256)
    }

    public var description: String {
        "credentials (shared secret: \(sharedSecret == nil ? "none" : "set"), \(apiKey.map(\.description) ?? "no API key"))"
    }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: ["description": description]) }
}

/// An App Store Server API private key: the `.p8` file's PEM text, stored in the ledger's
/// database, or a reference to where it is read when used. Printing one never shows the key.
public enum AppPrivateKey: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    case stored(pem: String)
    case reference(SecretReference)

    public var description: String {
        switch self {
        case .stored: "private key stored"
        case .reference(let reference): "private key at \(reference)"
        }
    }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: ["description": description]) }
}
