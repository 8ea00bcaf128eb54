import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// The apps the ledger serves (`apps`) and their secrets (`app_credentials`, which only the
/// ledger's own roles read). A bundle id is found whatever its case, as Apple holds bundle ids.
/// The secrets leave the database through `credentials(of:)` alone; every other answer says
/// only whether they are there.
public struct AppCatalog: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// Every app, in bundle-id order; with `only`, those of its apps alone (an API key's apps, as
    /// the table spells them).
    public func list(only: [BundleID]? = nil) async throws -> [App] {
        let rows = try await database.query(
            """
            SELECT \(unescaped: Self.columns) FROM \(unescaped: Self.joined)
             WHERE \(only == nil) OR a.bundle_id = ANY(\(only?.map(\.rawValue) ?? [])) ORDER BY a.bundle_id
            """)
        return try await Self.decode(rows)
    }

    /// The app of `id` (in any case), or nil.
    public func app(_ id: BundleID) async throws -> App? {
        let rows = try await database.query(
            "SELECT \(unescaped: Self.columns) FROM \(unescaped: Self.joined) WHERE lower(a.bundle_id) = lower(\(id.rawValue))")
        return try await Self.decode(rows).first
    }

    /// The ledger's first app (`ledger_first_app`: the first it ever held), which rows written
    /// before they knew their app belong to; nil while it holds none.
    public func firstApp() async throws -> BundleID? {
        let rows = try await database.query("SELECT bundle_id FROM ledger_first_app")
        for try await id in rows.decode(String.self) { return BundleID(unchecked: id) }
        return nil
    }

    /// Adds an app: `changes` over the defaults (both environments, nothing else). Throws
    /// `AppCatalogError.appExists` when the ledger holds it already, in any case.
    public func add(_ id: BundleID, _ changes: AppChanges) async throws -> App {
        do {
            return try await database.transaction { transaction in
                try await transaction.connection.guardedQuery(
                    """
                    INSERT INTO apps (bundle_id, app_apple_id, environments, refund_preference, retired, app_account_tokens, sku)
                    VALUES (\(id.rawValue), \(changes.appAppleId ?? nil),
                            \((changes.environments ?? App.Environment.allCases).map(\.rawValue)),
                            \((changes.refundPreference ?? nil)?.rawValue), \(changes.retired ?? false),
                            \((changes.appAccountTokens ?? .order).rawValue), \(changes.sku ?? nil))
                    """, logger: database.logger)
                try await writeCredentials(id, changes, on: transaction)
                return try await app(id, on: transaction)
            }
        } catch let error as PSQLError where error.sqlState == .uniqueViolation {
            if error.serverInfo?[.constraintName] == "apps_sku_key" { throw AppCatalogError.skuTaken((changes.sku ?? nil) ?? "") }
            // Named as the ledger holds it, which may be spelled in another case.
            throw AppCatalogError.appExists((try? await app(id))?.bundleId ?? id)
        }
    }

    /// Changes an app (found in any case). Throws `AppCatalogError.unknownApp` when there is none.
    public func change(_ id: BundleID, _ changes: AppChanges) async throws -> App {
        do {
            return try await changeRow(id, changes)
        } catch let error as PSQLError where error.sqlState == .uniqueViolation && error.serverInfo?[.constraintName] == "apps_sku_key" {
            throw AppCatalogError.skuTaken((changes.sku ?? nil) ?? "")
        }
    }

    private func changeRow(_ id: BundleID, _ changes: AppChanges) async throws -> App {
        try await database.transaction { transaction in
            let rows = try await transaction.connection.guardedQuery(
                "SELECT bundle_id FROM apps WHERE lower(bundle_id) = lower(\(id.rawValue)) FOR UPDATE", logger: database.logger)
            var stored: String?
            for try await name in rows.decode(String.self) { stored = name }
            guard let stored else { throw AppCatalogError.unknownApp(id) }
            let key = BundleID(unchecked: stored)
            try await transaction.connection.guardedQuery(
                """
                UPDATE apps SET
                    app_apple_id = CASE WHEN \(changes.appAppleId != nil) THEN \(changes.appAppleId ?? nil) ELSE app_apple_id END,
                    environments = coalesce(\(changes.environments?.map(\.rawValue)), environments),
                    refund_preference = CASE WHEN \(changes.refundPreference != nil) THEN \((changes.refundPreference ?? nil)?.rawValue)
                                             ELSE refund_preference END,
                    retired = coalesce(\(changes.retired), retired),
                    app_account_tokens = coalesce(\(changes.appAccountTokens?.rawValue), app_account_tokens),
                    sku = CASE WHEN \(changes.sku != nil) THEN \(changes.sku ?? nil) ELSE sku END,
                    updated_at = now()
                WHERE bundle_id = \(stored)
                """, logger: database.logger)
            if changes.changesCredentials { try await writeCredentials(key, changes, on: transaction) }
            return try await app(key, on: transaction)
        }
    }

    /// The app's secrets, for the work that uses them; nil when the ledger holds no such app.
    public func credentials(of id: BundleID) async throws -> AppCredentials? {
        let rows = try await database.query(
            """
            SELECT c.shared_secret, c.api_issuer_id, c.api_key_id, c.api_private_key, c.api_private_key_ref
              FROM apps a LEFT JOIN app_credentials c ON c.bundle_id = a.bundle_id
             WHERE lower(a.bundle_id) = lower(\(id.rawValue))
            """)
        for try await (secret, issuer, keyID, pem, reference) in rows.decode((String?, String?, String?, String?, String?).self) {
            var credentials = AppCredentials(sharedSecret: secret)
            if let issuer, let keyID {
                if let pem {
                    credentials.apiKey = .init(issuerId: issuer, keyId: keyID, privateKey: .stored(pem: pem))
                } else if let reference, let parsed = try? SecretReference(reference, field: "api_private_key_ref") {
                    credentials.apiKey = .init(issuerId: issuer, keyId: keyID, privateKey: .reference(parsed))
                }
            }
            return credentials
        }
        return nil
    }

    /// The legacy shared secrets the apps hold, by bundle id: with `list()`, what the verifier
    /// of proofs keeps in memory (LedgerServices' `AppDirectory`).
    public func sharedSecrets() async throws -> [BundleID: String] {
        let rows = try await database.query("SELECT bundle_id, shared_secret FROM app_credentials WHERE shared_secret IS NOT NULL")
        var secrets: [BundleID: String] = [:]
        for try await (id, secret) in rows.decode((String, String).self) { secrets[BundleID(unchecked: id)] = secret }
        return secrets
    }

    /// The app that the `LEDGER_APPLE_*` settings describe, as they describe it (nil: not given).
    public struct Configured: Sendable, Equatable {
        public var bundleId: BundleID
        public var appAppleId: Int64?
        /// nil: as the app has them (a new one: both).
        public var environments: [App.Environment]?
        public var sharedSecret: String?
        public var apiKey: AppCredentials.APIKey?
        /// `LEDGER_APPLE_ACCOUNT_TOKENS`; nil: as the app has it (a new one: per order).
        public var appAccountTokens: AppAccountTokenScope?

        public init(
            bundleId: BundleID, appAppleId: Int64?, environments: [App.Environment]?, sharedSecret: String?, apiKey: AppCredentials.APIKey?,
            appAccountTokens: AppAccountTokenScope? = nil
        ) {
            self.appAccountTokens = appAccountTokens
            self.bundleId = bundleId
            self.appAppleId = appAppleId
            self.environments = environments
            self.sharedSecret = sharedSecret
            self.apiKey = apiKey
        }
    }

    /// What `configure` did.
    public enum ConfigureOutcome: String, Sendable, Equatable {
        case created, updated, unchanged
    }

    /// Creates the configured app, or brings what the settings give of it (app id, environments,
    /// shared secret, API key) to the settings. A setting left out leaves its value as stored
    /// (a command run without it clears nothing); the refund preference and whether the app is
    /// retired stay the operator's.
    @discardableResult
    public func configure(_ configured: Configured) async throws -> ConfigureOutcome {
        let changes = AppChanges(
            appAppleId: configured.appAppleId.map { .some($0) }, environments: configured.environments,
            sharedSecret: configured.sharedSecret.map { .some($0) }, apiKey: configured.apiKey.map { .some($0) },
            appAccountTokens: configured.appAccountTokens)
        // Instances starting together: the first adds, the others find it and compare.
        for _ in 0..<2 {
            guard let app = try await app(configured.bundleId), let credentials = try await credentials(of: configured.bundleId) else {
                do {
                    _ = try await add(configured.bundleId, changes)
                    return .created
                } catch AppCatalogError.appExists {
                    continue
                }
            }
            let unchanged = (configured.appAppleId == nil || configured.appAppleId == app.appAppleId)
                && (configured.environments == nil || configured.environments == app.environments)
                && (configured.appAccountTokens == nil || configured.appAccountTokens == app.appAccountTokens)
                && (configured.sharedSecret == nil || configured.sharedSecret == credentials.sharedSecret)
                && (configured.apiKey == nil || configured.apiKey == credentials.apiKey)
            if unchanged { return .unchanged }
            _ = try await change(configured.bundleId, changes)
            return .updated
        }
        throw AppCatalogError.unknownApp(configured.bundleId)
    }

    /// Creates or changes the app's row of secrets: the members `changes` sets, the others kept
    /// (null in a new row).
    private func writeCredentials(_ id: BundleID, _ changes: AppChanges, on transaction: DatabaseTransaction) async throws {
        let key = changes.apiKey ?? nil
        try await transaction.connection.guardedQuery(
            """
            INSERT INTO app_credentials AS c (bundle_id, shared_secret, api_issuer_id, api_key_id, api_private_key, api_private_key_ref)
            VALUES (\(id.rawValue), \(changes.sharedSecret ?? nil), \(key?.issuerId), \(key?.keyId), \(Self.pem(key)), \(Self.reference(key)))
            ON CONFLICT (bundle_id) DO UPDATE SET
                shared_secret = CASE WHEN \(changes.sharedSecret != nil) THEN EXCLUDED.shared_secret ELSE c.shared_secret END,
                api_issuer_id = CASE WHEN \(changes.apiKey != nil) THEN EXCLUDED.api_issuer_id ELSE c.api_issuer_id END,
                api_key_id = CASE WHEN \(changes.apiKey != nil) THEN EXCLUDED.api_key_id ELSE c.api_key_id END,
                api_private_key = CASE WHEN \(changes.apiKey != nil) THEN EXCLUDED.api_private_key ELSE c.api_private_key END,
                api_private_key_ref = CASE WHEN \(changes.apiKey != nil) THEN EXCLUDED.api_private_key_ref ELSE c.api_private_key_ref END,
                updated_at = now()
            """, logger: database.logger)
    }

    private func app(_ id: BundleID, on transaction: DatabaseTransaction) async throws -> App {
        let rows = try await transaction.connection.guardedQuery(
            "SELECT \(unescaped: Self.columns) FROM \(unescaped: Self.joined) WHERE a.bundle_id = \(id.rawValue)", logger: database.logger)
        guard let app = try await Self.decode(rows).first else { throw AppCatalogError.unknownApp(id) }
        return app
    }

    private static func pem(_ key: AppCredentials.APIKey?) -> String? {
        if case .stored(let pem) = key?.privateKey { pem } else { nil }
    }

    private static func reference(_ key: AppCredentials.APIKey?) -> String? {
        if case .reference(let reference) = key?.privateKey { reference.description } else { nil }
    }

    static let joined = "apps a LEFT JOIN app_credentials c ON c.bundle_id = a.bundle_id"

    /// Never the secrets: whether there is a shared secret, the key's ids and its reference.
    static let columns = """
        a.bundle_id, a.app_apple_id, a.environments, a.refund_preference, a.retired, a.created_at, a.updated_at,
        c.shared_secret IS NOT NULL, c.api_issuer_id, c.api_key_id, c.api_private_key_ref, a.app_account_tokens, a.sku
        """

    static func decode(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [App] {
        var apps: [App] = []
        for try await row in rows {
            let (id, appleID, environments, preference, retired, created, updated, secret, issuer, keyID, reference, tokens, sku) = try row.decode(
                (String, Int64?, [String], String?, Bool, Date, Date, Bool?, String?, String?, String?, String, String?).self)
            var key: App.APIKeyInfo?
            if let issuer, let keyID {
                key = .init(issuerId: issuer, keyId: keyID, privateKeyReference: reference.flatMap { try? SecretReference($0, field: "api_private_key_ref") })
            }
            apps.append(App(
                bundleId: BundleID(unchecked: id), appAppleId: appleID, environments: environments.compactMap(App.Environment.init(rawValue:)),
                refundPreference: preference.flatMap(RefundPreference.init(rawValue:)), retired: retired, hasSharedSecret: secret ?? false,
                apiKey: key, createdAt: created, updatedAt: updated, appAccountTokens: AppAccountTokenScope(rawValue: tokens) ?? .order, sku: sku))
        }
        return apps
    }
}

/// Why an app could not be added or changed, with a stable code.
public enum AppCatalogError: Error, Sendable, Equatable, CustomStringConvertible {
    case appExists(BundleID)
    case unknownApp(BundleID)
    /// Another app has this SKU: sales reports name each app by its own.
    case skuTaken(String)

    public var code: String {
        switch self {
        case .appExists: "app-exists"
        case .unknownApp: "unknown-app"
        case .skuTaken: "sku-taken"
        }
    }

    public var description: String {
        switch self {
        case .appExists(let id): "the ledger holds the app \(id) already (bundle ids are the same whatever their case)"
        case .unknownApp(let id): "the ledger holds no app \(id)"
        case .skuTaken(let sku): "another app has the SKU \(sku): App Store Connect's reports name each app by its own"
        }
    }
}
