import Foundation
import JWTKit

/// The fields every Apple-signed payload carries that verification needs.
public protocol AppleSignedPayload: JWTPayload {
    /// When Apple signed it, in milliseconds since 1970; the certificates are checked at this time.
    var signedDate: Int64 { get }
    /// Every date the payload carries, by Apple's name: each must fall in the years the ledger
    /// keeps (1970 to 9999), or the payload is refused as malformed.
    var dates: KeyValuePairs<String, Int64?> { get }
}

extension AppleSignedPayload {
    public var dates: KeyValuePairs<String, Int64?> { ["signedDate": signedDate] }

    /// Signature and chain are checked by `SignedDataVerifier`; the payload's own fields by the
    /// caller, which knows the configured bundle and environment.
    public func verify(using algorithm: some JWTAlgorithm) async throws {}

    public var signedAt: Date { Date(millisecondsSince1970: signedDate) }
}

/// A StoreKit 2 signed transaction's payload (Apple's JWSTransactionDecodedPayload), the fields
/// the ledger reads.
public struct SignedTransactionPayload: AppleSignedPayload, Equatable {
    public var dates: KeyValuePairs<String, Int64?> {
        ["purchaseDate": purchaseDate, "signedDate": signedDate, "expiresDate": expiresDate, "revocationDate": revocationDate]
    }
    public var transactionId: String
    public var originalTransactionId: String?
    public var bundleId: String
    public var productId: String
    public var purchaseDate: Int64
    public var signedDate: Int64
    public var environment: String
    public var quantity: Int?
    public var type: String?
    public var appAccountToken: String?
    public var appTransactionId: String?
    public var inAppOwnershipType: String?
    /// Price in milli-units of `currency` (Apple's convention).
    public var price: Int64?
    public var currency: String?
    public var revocationDate: Int64?
    public var revocationReason: Int?
    /// `REFUND_FULL`, `REFUND_PRORATED` or `FAMILY_REVOKE` (Apple's `revocationType`).
    public var revocationType: String?
    /// Thousandths of a percent refunded, 0...100000 (Apple's `revocationPercentage`).
    public var revocationPercentage: Int?
    /// Auto-renewable subscriptions: the end of the period, ms since 1970 (Apple's `expiresDate`).
    public var expiresDate: Int64?
    public var webOrderLineItemId: String?
    /// `PURCHASE` or `RENEWAL`.
    public var transactionReason: String?
    public var subscriptionGroupIdentifier: String?
    /// The App Store storefront's country, ISO 3166-1 alpha-3 (`USA`), and Apple's id of it.
    public var storefront: String?
    public var storefrontId: String?
    /// Auto-renewable subscriptions: true once the customer upgraded to another product of the group.
    public var isUpgraded: Bool?

    public init(
        transactionId: String, originalTransactionId: String? = nil, bundleId: String, productId: String,
        purchaseDate: Int64, signedDate: Int64, environment: String, quantity: Int? = 1, type: String? = "Consumable",
        appAccountToken: String? = nil, appTransactionId: String? = nil, inAppOwnershipType: String? = "PURCHASED",
        price: Int64? = nil, currency: String? = nil, revocationDate: Int64? = nil, revocationReason: Int? = nil,
        revocationType: String? = nil, revocationPercentage: Int? = nil, expiresDate: Int64? = nil,
        webOrderLineItemId: String? = nil, transactionReason: String? = nil, subscriptionGroupIdentifier: String? = nil,
        storefront: String? = "USA", storefrontId: String? = "143441", isUpgraded: Bool? = nil
    ) {
        self.transactionId = transactionId
        self.originalTransactionId = originalTransactionId
        self.bundleId = bundleId
        self.productId = productId
        self.purchaseDate = purchaseDate
        self.signedDate = signedDate
        self.environment = environment
        self.quantity = quantity
        self.type = type
        self.appAccountToken = appAccountToken
        self.appTransactionId = appTransactionId
        self.inAppOwnershipType = inAppOwnershipType
        self.price = price
        self.currency = currency
        self.revocationDate = revocationDate
        self.revocationReason = revocationReason
        self.revocationType = revocationType
        self.revocationPercentage = revocationPercentage
        self.expiresDate = expiresDate
        self.webOrderLineItemId = webOrderLineItemId
        self.transactionReason = transactionReason
        self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
        self.storefront = storefront
        self.storefrontId = storefrontId
        self.isUpgraded = isUpgraded
    }
}

/// An App Store Server Notification V2's payload (Apple's ResponseBodyV2DecodedPayload).
public struct SignedNotificationPayload: AppleSignedPayload, Equatable {
    public var notificationType: String
    public var subtype: String?
    public var notificationUUID: String
    public var signedDate: Int64
    public var version: String?
    /// The transaction notifications' part; each of the others names the app instead for
    /// notifications without a transaction (`checkApp(of:)` reads whichever is there).
    public var data: NotificationData?
    /// `RENEWAL_EXTENSION`'s summary of a mass extension.
    public var summary: Summary?
    /// `EXTERNAL_PURCHASE_TOKEN`'s token.
    public var externalPurchaseToken: ExternalPurchaseToken?
    /// App-level notifications' part (such as `RESCIND_CONSENT`).
    public var appData: AppData?

    /// The app and the signed transaction a notification is about.
    public struct NotificationData: Codable, Sendable, Equatable {
        public var bundleId: String?
        public var appAppleId: Int64?
        public var environment: String?
        public var signedTransactionInfo: String?
        public var signedRenewalInfo: String?
        /// Why the customer asked for a refund (`CONSUMPTION_REQUEST`).
        public var consumptionRequestReason: String?

        public init(
            bundleId: String?, appAppleId: Int64? = nil, environment: String?, signedTransactionInfo: String?,
            signedRenewalInfo: String? = nil, consumptionRequestReason: String? = nil
        ) {
            self.bundleId = bundleId
            self.appAppleId = appAppleId
            self.environment = environment
            self.signedTransactionInfo = signedTransactionInfo
            self.signedRenewalInfo = signedRenewalInfo
            self.consumptionRequestReason = consumptionRequestReason
        }
    }

    public init(
        notificationType: String, subtype: String? = nil, notificationUUID: String, signedDate: Int64, version: String? = "2.0", data: NotificationData?,
        summary: Summary? = nil, externalPurchaseToken: ExternalPurchaseToken? = nil, appData: AppData? = nil
    ) {
        self.notificationType = notificationType
        self.subtype = subtype
        self.notificationUUID = notificationUUID
        self.signedDate = signedDate
        self.version = version
        self.data = data
        self.summary = summary
        self.externalPurchaseToken = externalPurchaseToken
        self.appData = appData
    }
}

extension Date {
    public init(millisecondsSince1970 milliseconds: Int64) {
        self.init(timeIntervalSince1970: Double(milliseconds) / 1000)
    }

    public var millisecondsSince1970: Int64 { Int64((timeIntervalSince1970 * 1000).rounded()) }
}

/// The signed `AppTransaction` StoreKit gives an app at launch (Apple's
/// JWSAppTransactionDecodedPayload): the Apple account's purchase of the app, named by its
/// `appTransactionId`, before any in-app purchase. Apple signs it at `receiptCreationDate`, and
/// names its environment `receiptType`.
public struct SignedAppTransactionPayload: AppleSignedPayload, Equatable {
    public var appTransactionId: String?
    public var bundleId: String
    public var receiptType: String
    public var receiptCreationDate: Int64
    public var appAppleId: Int64?
    public var originalPurchaseDate: Int64?
    public var applicationVersion: String?
    public var originalPlatform: String?

    public var signedDate: Int64 { receiptCreationDate }
    public var dates: KeyValuePairs<String, Int64?> {
        ["receiptCreationDate": receiptCreationDate, "originalPurchaseDate": originalPurchaseDate]
    }

    public init(
        appTransactionId: String?, bundleId: String, receiptType: String, receiptCreationDate: Int64, appAppleId: Int64? = nil,
        originalPurchaseDate: Int64? = nil, applicationVersion: String? = "1.0", originalPlatform: String? = "iOS"
    ) {
        self.appTransactionId = appTransactionId
        self.bundleId = bundleId
        self.receiptType = receiptType
        self.receiptCreationDate = receiptCreationDate
        self.appAppleId = appAppleId
        self.originalPurchaseDate = originalPurchaseDate
        self.applicationVersion = applicationVersion
        self.originalPlatform = originalPlatform
    }
}
