import Foundation

/// An Apple account's copy of the app, as its verified `AppTransaction` names it: one
/// `appTransactionId` per Apple account and app, the same on every device and in every
/// transaction the account makes.
public struct AppleAccount: Codable, Sendable, Equatable {
    public var appTransactionId: AppTransactionID
    /// `Production` or `Sandbox` (Apple's names).
    public var environment: String
    public var bundleId: String
    public var originalPurchaseDate: Date?

    public init(appTransactionId: AppTransactionID, environment: String, bundleId: String, originalPurchaseDate: Date? = nil) {
        self.appTransactionId = appTransactionId
        self.environment = environment
        self.bundleId = bundleId
        self.originalPurchaseDate = originalPurchaseDate
    }
}

/// Apple's id of one account's copy of the app (`appTransactionId`).
public struct AppTransactionID: ValidatedIdentifier {
    public static let field = "appTransactionId"
    public static let maximumLength = 128

    public let rawValue: String

    public init(unchecked rawValue: String) {
        self.rawValue = rawValue
    }

    /// The stream of the account's links: `apple-account-<appTransactionId>`.
    public var streamID: StreamID { StreamID(unchecked: AppleAccountEvents.streamPrefix + rawValue) }
}

/// The events of an Apple account's stream. Its first event, `account-linked`, names the user
/// who owns the account; a later claim by another user is an `account-link-conflict` for
/// support, and never moves the account.
public enum AppleAccountEvents {
    public static let streamPrefix = "apple-account-"
    public static let linked = "account-linked"
    public static let conflict = "account-link-conflict"

    /// `account-linked`: `userId` presented this account's signed AppTransaction first.
    public struct Linked: Codable, Sendable, Equatable {
        public var appTransactionId: AppTransactionID
        public var userId: UserID
        public var environment: String
        public var originalPurchaseDate: Date?
        /// The app the account's AppTransaction was signed for (an appTransactionId is one
        /// account's in one app); absent in links made before the ledger knew apps.
        public var bundleId: String?

        public init(account: AppleAccount, userId: UserID) {
            appTransactionId = account.appTransactionId
            self.userId = userId
            environment = account.environment
            originalPurchaseDate = account.originalPurchaseDate
            bundleId = account.bundleId
        }
    }

    /// `account-link-conflict`: `userId` presented an account that `ownerUserId` owns.
    public struct Conflict: Codable, Sendable, Equatable {
        public var appTransactionId: AppTransactionID
        public var userId: UserID
        public var ownerUserId: UserID

        public init(appTransactionId: AppTransactionID, userId: UserID, ownerUserId: UserID) {
            self.appTransactionId = appTransactionId
            self.userId = userId
            self.ownerUserId = ownerUserId
        }
    }
}
