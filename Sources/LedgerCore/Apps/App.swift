import Foundation

/// An app the ledger serves, keyed by its bundle id, as answers and lists show it: what it
/// accepts and whether it has its secrets, never them (`App.Credentials` holds those).
public struct App: Sendable, Equatable {
    /// An App Store environment whose signed data an app may accept, as Apple names it.
    public enum Environment: String, Codable, Sendable, CaseIterable, Comparable {
        case production = "Production"
        case sandbox = "Sandbox"

        /// Reads Apple's name, case-insensitively.
        public init?(name: String) {
            guard let match = Self.allCases.first(where: { $0.rawValue.lowercased() == name.lowercased() }) else { return nil }
            self = match
        }

        public static func < (lhs: Self, rhs: Self) -> Bool {
            allCases.firstIndex(of: lhs)! < allCases.firstIndex(of: rhs)!
        }

        /// A list of environments, given as names: in Apple's order, each once; at least one.
        public static func list(_ names: [String], field: String) throws(LedgerInputError) -> [Environment] {
            var environments = Set<Environment>()
            for name in names {
                guard let environment = Environment(name: name) else {
                    throw LedgerInputError(field: field, problem: "holds \(name.debugDescription); use Production and/or Sandbox")
                }
                environments.insert(environment)
            }
            guard !environments.isEmpty else { throw LedgerInputError(field: field, problem: "is empty; name Production and/or Sandbox") }
            return environments.sorted()
        }
    }

    /// The App Store Server API key as shown: its ids, and where its private key is (never the key).
    public struct APIKeyInfo: Sendable, Equatable {
        public var issuerId: String
        public var keyId: String
        /// Where the private key is read from when used; nil: stored in the ledger's database.
        public var privateKeyReference: SecretReference?

        public init(issuerId: String, keyId: String, privateKeyReference: SecretReference?) {
            self.issuerId = issuerId
            self.keyId = keyId
            self.privateKeyReference = privateKeyReference
        }
    }

    public var bundleId: BundleID
    /// Apple's numeric id of the app; Apple's verifier needs it for Production-signed data.
    public var appAppleId: Int64?
    /// The environments whose signed data the app accepts, in Apple's order.
    public var environments: [Environment]
    /// The refund the app would have Apple grant in consumption answers, where the product says none.
    public var refundPreference: RefundPreference?
    /// What the app's `appAccountToken` names: an order (the default) or its user.
    public var appAccountTokens: AppAccountTokenScope
    /// The app's SKU in App Store Connect, as sales reports name it (`Parent Identifier`).
    public var sku: String?
    public var retired: Bool
    public var hasSharedSecret: Bool
    public var apiKey: APIKeyInfo?
    public var createdAt: Date
    public var updatedAt: Date

    public init(
        bundleId: BundleID, appAppleId: Int64?, environments: [Environment], refundPreference: RefundPreference?, retired: Bool,
        hasSharedSecret: Bool, apiKey: APIKeyInfo?, createdAt: Date, updatedAt: Date, appAccountTokens: AppAccountTokenScope = .order,
        sku: String? = nil
    ) {
        self.sku = sku
        self.appAccountTokens = appAccountTokens
        self.bundleId = bundleId
        self.appAppleId = appAppleId
        self.environments = environments
        self.refundPreference = refundPreference
        self.retired = retired
        self.hasSharedSecret = hasSharedSecret
        self.apiKey = apiKey
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }

    /// Checks an SKU given by a caller: 1 to 255 characters, no control character.
    public static func sku(_ value: String, field: String = "sku") throws(LedgerInputError) -> String {
        // A padded SKU never equals a report's Parent Identifier: its app's sales would never count.
        try Identifier.checkUnpadded(value, field: field)
        return try Identifier.validate(value, field: field, maximumLength: 255)
    }

    /// Checks an Apple app id given by a caller: a positive whole number.
    public static func appleId(_ value: Int64, field: String = "appAppleId") throws(LedgerInputError) -> Int64 {
        guard value > 0 else { throw LedgerInputError(field: field, problem: "must be Apple's numeric app id, a whole number above 0") }
        return value
    }
}
