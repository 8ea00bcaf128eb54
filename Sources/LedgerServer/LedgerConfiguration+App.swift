import Foundation
import LedgerCore
import LedgerStore
import Logging

extension LedgerConfiguration.Apple {
    /// The one app the `LEDGER_APPLE_*` settings describe, or nil without a bundle id (the
    /// quickstart: no app). Its environments are those `LEDGER_APPLE_ENVIRONMENT` lists; its API key's
    /// private key is the configured file, kept as a `file:` reference (its absolute path), not
    /// copied into the database.
    public func configuredApp() throws(LedgerConfigurationError) -> ConfiguredApp? {
        guard let bundleID else { return nil }
        let id: BundleID
        do { id = try BundleID(bundleID) } catch {
            throw LedgerConfigurationError(problems: [.init(LedgerConfiguration.Key.appleBundleID, "is \(bundleID); it \(error.problem)")])
        }
        var key: AppCredentials.APIKey?
        if let apiKeyID, let apiIssuerID, let apiPrivateKeyFile {
            let path = URL(fileURLWithPath: apiPrivateKeyFile).standardizedFileURL.path
            key = AppCredentials.APIKey(issuerId: apiIssuerID, keyId: apiKeyID, privateKey: .reference(.file(path)))
        }
        return ConfiguredApp(app: AppCatalog.Configured(
            bundleId: id, appAppleId: appID, environments: environmentsGiven ? environments.compactMap { App.Environment(name: $0.rawValue) } : nil,
            sharedSecret: sharedSecret, apiKey: key, appAccountTokens: appAccountTokens))
    }
}

/// The app the settings describe, recorded at start by `ledger serve` and the commands.
public struct ConfiguredApp: Sendable, Equatable {
    public let app: AppCatalog.Configured

    /// Creates or updates the app in `catalog`, saying so when it changed anything (never a secret).
    public func record(in catalog: AppCatalog, logger: Logger) async throws {
        let outcome = try await catalog.configure(app)
        guard outcome != .unchanged else { return }
        logger.notice("app \(outcome.rawValue) from the LEDGER_APPLE_* settings", metadata: ["app.bundle_id": "\(app.bundleId)"])
    }
}
