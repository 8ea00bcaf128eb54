// AppleReceipts: verifying Apple's proofs, and the clients of Apple's APIs.

import Crypto
import Foundation
import LedgerCore

/// Turns a client's or Apple's proof into verified `AppleTransaction`s: the signature or Apple's
/// answer first, then the app's own checks (bundle id, app id, environment). With `apps`, the app
/// is the one the ledger holds for the bundle id Apple signed; without, the one `app` describes.
public struct AppleProofVerifier: Sendable {
    /// An app whose proofs are checked.
    public struct App: Sendable, Equatable {
        public var bundleId: String?
        /// Apple's numeric app id; checked on Production-signed notifications and app
        /// transactions when set.
        public var appAppleId: Int64?
        /// The environments signed data may come from: App Review buys in the sandbox against
        /// the production build, so an app that ships accepts both, and keeps them apart by the
        /// `environment` each transaction carries.
        public var environments: Set<AppleEnvironment>

        public init(bundleId: String?, appAppleId: Int64?, environments: Set<AppleEnvironment>) {
            self.bundleId = bundleId
            self.appAppleId = appAppleId
            self.environments = environments
        }

        /// An app that accepts one environment only.
        public init(bundleId: String?, appAppleId: Int64?, environment: AppleEnvironment) {
            self.init(bundleId: bundleId, appAppleId: appAppleId, environments: [environment])
        }

        /// The accepted environments as a setting lists them: `Production,Sandbox`.
        public var environmentList: String {
            AppleEnvironment.allCases.filter(environments.contains).map(\.rawValue).joined(separator: ",")
        }

        /// Who accepts what, for a refusal: the app by name (the data may have named another app than
        /// the one asked about), else the ledger.
        public var accepting: String {
            "\(bundleId.map { "the app \($0)" } ?? "this ledger") accepts \(environmentList)"
        }

        /// Whether data signed in `environment` (Apple's name, any case) is accepted.
        public func accepts(_ environment: String?) -> Bool {
            environment.flatMap(AppleEnvironment.init(name:)).map(environments.contains) ?? false
        }

        /// Whether data signed in `environment` must carry the app's Apple id: Production-signed
        /// data, as Apple's SignedDataVerifier checks it in production.
        func checksAppAppleId(_ environment: String?) -> Bool {
            environment.flatMap(AppleEnvironment.init(name:)) == .production
        }
    }

    /// The one app checked against when there is no `apps`.
    public let app: App
    /// The apps the ledger holds, each proof checked against the one its signed bundle id names.
    public private(set) var apps: (any AppleAppDirectory)?
    public let signedData: SignedDataVerifier
    /// The bundle ids (in lower case) the proofs' sender may reach; nil: every one. A proof of
    /// another is refused once its signature (or Apple's answer) is checked, before its app is
    /// looked up, so that the refusal is the same whether the ledger holds that app or not.
    public private(set) var reachable: Set<String>?
    public let verifyReceipt: VerifyReceiptClient?

    public init(app: App, signedData: SignedDataVerifier, verifyReceipt: VerifyReceiptClient?) {
        self.app = app
        self.signedData = signedData
        self.verifyReceipt = verifyReceipt
    }

    /// This verifier, checking each proof against the app of `apps` its bundle id names
    /// (`unknown-app` when there is none) instead of `app`.
    public func choosingApps(from apps: any AppleAppDirectory) -> AppleProofVerifier {
        var chosen = self
        chosen.apps = apps
        return chosen
    }

    /// This verifier, refusing (`app-not-allowed`) the proofs of bundle ids other than
    /// `bundleIds` (any case); nil: refusing none.
    public func reaching(_ bundleIds: [String]?) -> AppleProofVerifier {
        var limited = self
        limited.reachable = bundleIds.map { Set($0.map { $0.lowercased() }) }
        return limited
    }

    /// Refuses a proof of `bundleId` when the sender does not reach it.
    static func requireReach(_ bundleId: String?, _ reachable: Set<String>?) throws(AppleVerificationError) {
        if let reachable, !reachable.contains((bundleId ?? "").lowercased()) { throw .notReached(bundleId) }
    }

    /// The app a proof signed for `bundleId` is checked against: with `apps`, the one held for
    /// it (`unknown-app` otherwise; Production-signed data of one without its Apple id waits
    /// for it, `app-apple-id-missing`); else `app`, which `check` compares. A bundle id the
    /// sender does not reach is refused first.
    func heldApp(for bundleId: String?, environment: String?, part: String = "signed") async throws(AppleVerificationError) -> App {
        try Self.requireReach(bundleId, reachable)
        guard let apps else { return app }
        // Found whatever the case, and kept in the ledger's spelling: what the proof yields
        // names its app as the apps table does, which the database compares exactly.
        guard let bundleId, let held = try await apps.app(bundleId: bundleId) else { throw .unknownApp(bundleId, part: part) }
        if held.accepts(environment), held.checksAppAppleId(environment), held.appAppleId == nil {
            throw .appAppleIdMissing(bundleId)
        }
        return held
    }

    /// A StoreKit 2 signed transaction, verified and checked against the app.
    public func transaction(signed jws: String) async throws(AppleVerificationError) -> AppleTransaction {
        try await transactionAndRevocation(signed: jws).transaction
    }

    /// `transaction(signed:)` for a purchase to be granted: one Apple has refunded or revoked
    /// (StoreKit hands such transactions to the app too) is refused with `transaction-revoked`.
    public func verifiedPurchase(signed jws: String) async throws(AppleVerificationError) -> AppleTransaction {
        let (transaction, revocation) = try await transactionAndRevocation(signed: jws)
        if let revocation {
            var refusal = Self.revoked(transaction, revocation)
            refusal.transactionId = transaction.transactionId.rawValue
            throw refusal
        }
        return transaction
    }

    /// The refusal of a purchase Apple refunded or revoked (`verifiedPurchase(signed:)`).
    public static func revoked(_ transaction: AppleTransaction, _ revocation: Revocation) -> AppleVerificationError {
        AppleVerificationError(
            code: "transaction-revoked",
            message: "Apple refunded or revoked transaction \(transaction.transactionId) at \(revocation.date.ISO8601Format()): it is never granted",
            bundleId: transaction.bundleId)
    }

    /// `transaction(signed:)`, with how Apple refunded or revoked it, if it did (Apple's
    /// histories list such transactions too).
    public func transactionAndRevocation(
        signed jws: String
    ) async throws(AppleVerificationError) -> (transaction: AppleTransaction, revocation: Revocation?) {
        let payload = try await signedData.verify(jws, as: SignedTransactionPayload.self)
        do {
            let app = try await heldApp(for: payload.bundleId, environment: payload.environment)
            try check(bundleId: payload.bundleId, environment: payload.environment, app: app)
            return (try Self.transaction(payload, sha256: Self.sha256(jws), app: app), Self.revocation(payload))
        } catch {
            // Apple signed it: the refusal names its transaction.
            var refusal = error
            refusal.transactionId = payload.transactionId
            throw refusal
        }
    }

    /// What a signed transaction says of its refund or revocation: nil when it has no
    /// `revocationDate`. A `revocationType` the ledger does not know, or a percentage outside
    /// Apple's 0...100000, is left out: the refund then counts as full.
    static func revocation(_ payload: SignedTransactionPayload) -> Revocation? {
        guard let date = payload.revocationDate else { return nil }
        return Revocation(
            date: Date(millisecondsSince1970: date), reason: payload.revocationReason,
            type: payload.revocationType.flatMap(RevocationType.init(rawValue:)),
            percentage: payload.revocationPercentage.flatMap { (0...100_000).contains($0) ? $0 : nil })
    }

    /// The Apple account a signed `AppTransaction` names, verified like a transaction (chain,
    /// signature, bundle id, environment, and app id in production when configured).
    public func appTransaction(signed jws: String) async throws(AppleVerificationError) -> AppleAccount {
        let payload = try await signedData.verify(jws, as: SignedAppTransactionPayload.self)
        let app = try await heldApp(for: payload.bundleId, environment: payload.receiptType)
        try check(bundleId: payload.bundleId, environment: payload.receiptType, app: app)
        if app.checksAppAppleId(payload.receiptType), let expected = app.appAppleId, payload.appAppleId != expected {
            throw AppleVerificationError(code: "wrong-app-id", message: "the app transaction is for app id \(payload.appAppleId.map(String.init) ?? "none"), not \(expected)")
        }
        guard let text = payload.appTransactionId, let id = try? AppTransactionID(text) else {
            throw .malformed("the app transaction has no appTransactionId of 1 to 128 characters (StoreKit gives one from iOS 18.4)")
        }
        return AppleAccount(
            appTransactionId: id, environment: payload.receiptType, bundleId: app.bundleId ?? payload.bundleId,
            originalPurchaseDate: payload.originalPurchaseDate.map(Date.init(millisecondsSince1970:)))
    }

    /// A verified App Store Server Notification V2 and the transaction it carries. `onlyFor`:
    /// the app the notification must name (the per-app URL's), `wrong-bundle-id` otherwise.
    public func notification(
        signed signedPayload: String, onlyFor expected: String? = nil
    ) async throws(AppleVerificationError) -> VerifiedNotification {
        let payload = try await signedData.verify(signedPayload, as: SignedNotificationPayload.self)
        guard let uuid = UUID(uuidString: payload.notificationUUID) else {
            throw .malformed("notificationUUID is not a UUID")
        }
        var transaction: AppleTransaction?
        var revocation: Revocation?
        var renewalInfo: RenewalInfo?
        let app = try await checkApp(of: payload, onlyFor: expected)
        let named = payload.namedApp
        if let data = payload.data {
            if let signedTransaction = data.signedTransactionInfo {
                let inner = try await signedData.verify(signedTransaction, as: SignedTransactionPayload.self)
                try check(bundleId: inner.bundleId, environment: inner.environment, app: app)
                // The notification's environment is the one its app's checks were made for (the
                // Apple id's on Production): its transaction is of that one, as its renewal info is.
                if let named = data.environment, named.lowercased() != inner.environment.lowercased() {
                    throw AppleVerificationError(
                        code: "wrong-environment",
                        message: "the notification is from the \(named) environment, the transaction it carries from \(inner.environment)")
                }
                transaction = try Self.transaction(inner, sha256: Self.sha256(signedTransaction), app: app)
                revocation = Self.revocation(inner)
            }
            if let signedRenewalInfo = data.signedRenewalInfo {
                renewalInfo = try await notificationRenewalInfo(signedRenewalInfo, about: transaction, app: app)
            }
        }
        return VerifiedNotification(
            notificationUUID: uuid, notificationType: payload.notificationType, subtype: payload.subtype,
            signedDate: payload.signedAt, transaction: transaction,
            revocation: revocation, consumptionRequestReason: payload.data?.consumptionRequestReason, renewalInfo: renewalInfo,
            bundleId: app.bundleId ?? named?.bundleId, environment: named?.environment)
    }

    /// A notification's `signedRenewalInfo`, verified as the transaction beside it is: the
    /// subscription it names must be that transaction's, in its environment. Renewal info with no
    /// transaction names a subscription nothing else in the notification vouches for.
    private func notificationRenewalInfo(
        _ jws: String, about transaction: AppleTransaction?, app: App
    ) async throws(AppleVerificationError) -> RenewalInfo {
        guard let transaction else {
            throw AppleVerificationError(
                code: "renewal-info-without-transaction",
                message: "the notification carries signedRenewalInfo without signedTransactionInfo: no transaction ties it to a subscription")
        }
        let subscription = transaction.originalTransactionId ?? transaction.transactionId.rawValue
        let verified = try await renewalInfo(signed: jws, app: app, originalTransactionId: subscription)
        guard verified.environment.lowercased() == transaction.environment.lowercased() else {
            throw AppleVerificationError(
                code: "renewal-info-mismatch",
                message: "the renewal info is from the \(verified.environment) environment, the transaction beside it from \(transaction.environment)")
        }
        return verified.info
    }

    /// The transactions of a legacy app receipt, as Apple's verifyReceipt reports them.
    public func transactions(receipt receiptData: String) async throws(AppleVerificationError) -> [AppleTransaction] {
        try await transactionsAndRevocations(receipt: receiptData).map(\.transaction)
    }

    /// `transactions(receipt:)`, each with how Apple refunded or revoked it, if it did (its
    /// `cancellation_date_ms`: Apple says to treat it as if no purchase had been made).
    public func transactionsAndRevocations(
        receipt receiptData: String
    ) async throws(AppleVerificationError) -> [(transaction: AppleTransaction, revocation: Revocation?)] {
        guard let verifyReceipt else {
            throw AppleVerificationError(code: "verification-unavailable", message: "legacy receipts need LEDGER_APPLE_VERIFY_RECEIPT_URL", isRetryable: true)
        }
        let response: VerifyReceiptResponse
        if let apps {
            response = try await Self.askedWithItsSecret(receiptData, verifyReceipt, apps, reachable: reachable)
        } else {
            response = try await verifyReceipt.verify(receiptData: receiptData)
            try Self.requireReach(response.receipt?.bundleId, reachable)
        }
        var bundleId = response.receipt?.bundleId ?? ""
        var held = app
        if let apps, let found = try await apps.app(bundleId: bundleId) { held = found }
        if let spelled = held.bundleId, apps != nil { bundleId = spelled }
        if apps == nil, let expected = app.bundleId, bundleId != expected {
            throw AppleVerificationError(code: "wrong-bundle-id", message: "the receipt is for bundle \"\(bundleId)\", not \"\(expected)\"")
        }
        let sha = Self.sha256(receiptData)
        // Apple vouched for the receipt, whichever environment answered (21007 sends App Review's
        // sandbox receipts on to the sandbox). A sandbox receipt of an app that refuses the
        // sandbox is refused, as its signed transactions are: its purchases cost nothing, and its
        // refunds could never be taken. A production receipt is real money, and always taken.
        let environment = response.environment ?? "Production"
        if AppleEnvironment(name: environment) != .production, !held.accepts(environment) {
            throw AppleVerificationError(
                code: "wrong-environment", message: "the receipt is from the \(environment) environment; the app \(bundleId) accepts \(held.environmentList)")
        }
        return try response.transactions.map { item throws(AppleVerificationError) in
            guard let id = try? TransactionID(item.transactionId), let product = try? ProductID(item.productId),
                  let millis = item.purchaseDateMs.flatMap(Int64.init), SignedDataVerifier.keptDates.contains(millis) else {
                throw AppleVerificationError(code: "apple-answer-malformed", message: "a transaction in verifyReceipt's answer lacks an id, a product or a purchase date of the years 1970 to 9999", isRetryable: true)
            }
            // A legacy receipt names no product type: the catalog decides whether it is a subscription's.
            var expires: Date?
            if let text = item.expiresDateMs {
                guard let expiresMillis = Int64(text), SignedDataVerifier.keptDates.contains(expiresMillis) else {
                    throw AppleVerificationError(code: "apple-answer-malformed", message: "expires_date_ms of transaction \(id) in verifyReceipt's answer is not a date of the years 1970 to 9999", isRetryable: true)
                }
                expires = Date(millisecondsSince1970: expiresMillis)
            }
            var revocation: Revocation?
            // A subscription's period the customer upgraded from carries the upgrade's date there
            // too (`is_upgraded`): no refund.
            if let text = item.cancellationDateMs, item.isUpgraded != "true" {
                guard let cancelledMillis = Int64(text), SignedDataVerifier.keptDates.contains(cancelledMillis) else {
                    throw AppleVerificationError(code: "apple-answer-malformed", message: "cancellation_date_ms of transaction \(id) in verifyReceipt's answer is not a date of the years 1970 to 9999", isRetryable: true)
                }
                revocation = Revocation(date: Date(millisecondsSince1970: cancelledMillis), reason: item.cancellationReason.flatMap(Int.init))
            }
            // Apple writes the quantity as a number in a string; anything else is no answer to trust.
            var quantity = 1
            if let text = item.quantity {
                guard let units = Int(text), units >= 1 else {
                    throw AppleVerificationError(code: "apple-answer-malformed", message: "quantity of transaction \(id) in verifyReceipt's answer is \(text), not a number of units", isRetryable: true)
                }
                quantity = units
            }
            return (AppleTransaction(
                transactionId: id, originalTransactionId: item.originalTransactionId, productId: product,
                purchaseDate: Date(millisecondsSince1970: millis), environment: environment, bundleId: bundleId,
                quantity: quantity, appAccountToken: item.appAccountToken.flatMap(UUID.init(uuidString:)),
                // A receipt names no price, but a free trial's is 0 (the reports count it so).
                inAppOwnershipType: item.inAppOwnershipType, price: item.isTrialPeriod == "true" ? "0" : nil,
                format: .receipt, receiptSha256: sha, expiresDate: expires,
                webOrderLineItemId: item.webOrderLineItemId, subscriptionGroupIdentifier: item.subscriptionGroupIdentifier,
                isUpgraded: item.isUpgraded.map { $0 == "true" }), revocation)
        }
    }

    /// A legacy receipt asked of verifyReceipt with its app's shared secret. Which app it is for
    /// is known from Apple's answer only: the first ask sends the ledger's one shared secret
    /// (none when its apps hold several, or none), and when the app Apple's answer names holds
    /// another (or none), the receipt is asked again with that one, so that Apple's answer is the
    /// one made with the receipt's own secret. A ledger of one app asks once, as before. A
    /// receipt of an app the sender does not reach is refused before it is asked again.
    static func askedWithItsSecret(
        _ receiptData: String, _ client: VerifyReceiptClient, _ apps: any AppleAppDirectory, reachable: Set<String>? = nil
    ) async throws(AppleVerificationError) -> VerifyReceiptResponse {
        let secrets = try await apps.sharedSecrets()
        var sent = secrets.count == 1 ? secrets.values.first : nil
        var response: VerifyReceiptResponse
        do {
            response = try await client.verify(receiptData: receiptData, sharedSecret: sent)
        } catch where error.appleStatus == 21004 && sent == nil && secrets.count > 1 {
            // Apple wants the app's secret before it names the app (a receipt with a subscription):
            // each app's in turn, until Apple takes one.
            var found: (String, VerifyReceiptResponse)?
            for secret in Set(secrets.values).sorted() {
                do {
                    found = (secret, try await client.verify(receiptData: receiptData, sharedSecret: secret))
                    break
                } catch where error.appleStatus == 21004 {
                    continue
                }
            }
            guard let found else {
                throw AppleVerificationError(
                    code: "apple-shared-secret-mismatch",
                    message: "verifyReceipt took none of the apps' shared secrets (21004): set the receipt's app's with `ledger apps set --shared-secret`",
                    isRetryable: true, appleStatus: 21004)
            }
            (sent, response) = found
        }
        let bundleId = response.receipt?.bundleId ?? ""
        try requireReach(bundleId, reachable)
        guard try await apps.app(bundleId: bundleId) != nil else { throw .unknownApp(bundleId, part: "the receipt is") }
        let own = secrets[bundleId.lowercased()]
        guard own != sent else { return response }
        let again = try await client.verify(receiptData: receiptData, sharedSecret: own)
        guard (again.receipt?.bundleId ?? "").lowercased() == bundleId.lowercased() else {
            throw AppleVerificationError(code: "apple-answer-malformed", message: "verifyReceipt named another bundle when asked again", isRetryable: true)
        }
        return again
    }

    private func check(bundleId: String?, environment: String, app: App) throws(AppleVerificationError) {
        if let expected = app.bundleId, bundleId?.lowercased() != expected.lowercased() {
            throw AppleVerificationError(code: "wrong-bundle-id", message: "signed for bundle \"\(bundleId ?? "")\", not \"\(expected)\"")
        }
        guard app.accepts(environment) else {
            throw AppleVerificationError(
                code: "wrong-environment", message: "signed in the \(environment) environment; \(app.accepting)", bundleId: app.bundleId)
        }
    }

    static func transaction(
        _ payload: SignedTransactionPayload, sha256: String, app: App? = nil
    ) throws(AppleVerificationError) -> AppleTransaction {
        let id: TransactionID
        let product: ProductID
        do {
            id = try TransactionID(payload.transactionId)
            product = try ProductID(payload.productId)
            // Ids the ledger keeps and looks transactions up by, as Apple writes them.
            for (field, value) in [("originalTransactionId", payload.originalTransactionId), ("appTransactionId", payload.appTransactionId)] {
                if let value { _ = try Identifier.validate(value, field: field) }
            }
        } catch {
            throw .malformed("the transaction's \(error.field) \(error.problem)")
        }
        // Apple's price is never below 0 (a free trial's is 0), and its currency is ISO 4217's
        // three letters: anything else is no transaction of Apple's, and would be revenue.
        if let price = payload.price, price < 0 {
            throw .malformed("the transaction's price is \(price), below 0")
        }
        var currency = payload.currency
        if let text = currency {
            guard text.utf8.count == 3, text.utf8.allSatisfy({ (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0 & ~0x20) }) else {
                throw .malformed("the transaction's currency is \"\(text.prefix(40))\", not an ISO 4217 code")
            }
            currency = text.uppercased()
        }
        return AppleTransaction(
            transactionId: id, originalTransactionId: payload.originalTransactionId, productId: product,
            // Spelled as Apple does (the reports count `Production` and `Sandbox` by name).
            purchaseDate: Date(millisecondsSince1970: payload.purchaseDate),
            environment: AppleEnvironment(name: payload.environment)?.rawValue ?? payload.environment,
            bundleId: app?.bundleId ?? payload.bundleId, quantity: payload.quantity ?? 1,
            appAccountToken: payload.appAccountToken.flatMap(UUID.init(uuidString:)), appTransactionId: payload.appTransactionId,
            inAppOwnershipType: payload.inAppOwnershipType, price: payload.price.map(Self.decimal(milliUnits:)),
            currency: currency, format: .jws, receiptSha256: sha256, type: payload.type,
            expiresDate: payload.expiresDate.map(Date.init(millisecondsSince1970:)), webOrderLineItemId: payload.webOrderLineItemId,
            transactionReason: payload.transactionReason, subscriptionGroupIdentifier: payload.subscriptionGroupIdentifier,
            storefront: payload.storefront.flatMap(Self.storefront), isUpgraded: payload.isUpgraded)
    }

    /// Apple's storefront as three upper-case letters (ISO 3166-1 alpha-3), or nil when it is not
    /// one: the storefront only groups the sales comparison, so a strange one is not a refusal.
    static func storefront(_ text: String) -> String? {
        let letters = text.uppercased()
        return letters.utf8.count == 3 && letters.utf8.allSatisfy({ (65...90).contains($0) }) ? letters : nil
    }

    /// Apple's milli-units as a decimal string: 990 → "0.99".
    static func decimal(milliUnits: Int64) -> String {
        let sign = milliUnits < 0 ? "-" : ""
        let value = milliUnits.magnitude
        var fraction = String(value % 1000)
        fraction = String(repeating: "0", count: 3 - fraction.count) + fraction
        while fraction.hasSuffix("0") { fraction.removeLast() }
        return sign + String(value / 1000) + (fraction.isEmpty ? "" : "." + fraction)
    }

    /// SHA-256 of a proof as it was sent, in hex.
    public static func sha256(_ text: String) -> String {
        hex(SHA256.hash(data: Data(text.utf8)))
    }

    static func hex(_ bytes: some Sequence<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(64)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// A verified notification: what happened, and to which transaction.
public struct VerifiedNotification: Sendable, Equatable {
    public var notificationUUID: UUID
    public var notificationType: String
    public var subtype: String?
    public var signedDate: Date
    public var transaction: AppleTransaction?
    /// How Apple refunded or revoked the transaction, when it did.
    public var revocation: Revocation?
    /// Why the customer asked for a refund (`CONSUMPTION_REQUEST` only).
    public var consumptionRequestReason: String?
    /// The subscription's renewal info (`signedRenewalInfo`), verified like the transaction.
    public var renewalInfo: RenewalInfo? = nil
    /// The app and environment the notification names (its `data`, `summary`,
    /// `externalPurchaseToken` or `appData`), checked against the apps the ledger holds: for
    /// one without a transaction (`TEST`, a `RENEWAL_EXTENSION` summary), all there is to tell
    /// whose it is.
    public var bundleId: String? = nil
    public var environment: String? = nil
}
