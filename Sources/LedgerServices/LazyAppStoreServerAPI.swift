import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging

/// The App Store Server API clients of the ledger's apps: one per app and environment, made on
/// first use with the app's key (its token's `bid` the app's bundle id) and Apple's host of that
/// environment, and kept while the key stays the same. The key is read at each use (from the
/// apps' catalog, and from where its reference points), so that a key set or rotated with
/// `ledger apps set` or `PATCH /v1/apps/{bundleId}` is taken without a restart. An app without a
/// key has no client: its work is skipped, logged once and counted each time (`skipped`).
public actor LazyAppStoreServerAPI {
    /// Where the clients' keys and hosts come from.
    enum Source: Sendable {
        /// One app's client as given, for every environment (its base URL serves both): tests,
        /// benchmarks, a stand-in.
        case settings(AppStoreServerAPI.Settings)
        /// Every app's key from the catalog, each environment at its host.
        case catalog(AppCatalog, Hosts)
    }

    /// Apple's host of each environment (or a stand-in's, a proxy's), and the settings every
    /// app's clients share but for the key, the bundle id, the base URL and the environment.
    public struct Hosts: Sendable {
        public var productionURL: String
        public var sandboxURL: String
        public var template: AppStoreServerAPI.Settings

        public init(productionURL: String = AppStoreServerAPI.productionURL, sandboxURL: String = AppStoreServerAPI.sandboxURL, template: AppStoreServerAPI.Settings) {
            self.productionURL = productionURL
            self.sandboxURL = sandboxURL
            self.template = template
        }

        func url(_ environment: AppleEnvironment) -> String { environment == .production ? productionURL : sandboxURL }
    }

    /// An app whose work asks Apple, with the environments it accepts (Production, Sandbox).
    public struct AppWork: Sendable, Equatable {
        public let bundleId: BundleID
        public let environments: [AppleEnvironment]
    }

    let source: Source
    let logger: Logger
    /// Told each time an app's work is skipped for want of a key (the server counts them:
    /// `ledger_apple_apps_skipped_total`).
    let skipped: (@Sendable (BundleID) -> Void)?
    private var made: [String: (settings: AppStoreServerAPI.Settings, client: AppStoreServerAPI)] = [:]
    private var warned = Set<String>()

    /// One app's client as `settings` say, for every environment.
    public init(settings: AppStoreServerAPI.Settings, logger: Logger) {
        source = .settings(settings)
        self.logger = logger
        skipped = nil
    }

    /// Every app's clients, with the keys of `catalog`, at `hosts`.
    public init(catalog: AppCatalog, hosts: Hosts, logger: Logger, skipped: (@Sendable (BundleID) -> Void)? = nil) {
        source = .catalog(catalog, hosts)
        self.logger = logger
        self.skipped = skipped
    }

    /// The one client's settings, when made from settings (nil: per app from the catalog).
    public nonisolated var settings: AppStoreServerAPI.Settings? {
        if case .settings(let settings) = source { settings } else { nil }
    }

    /// The apps with a key, each with the environments whose work is to run; an app without a
    /// key is skipped (logged once, counted).
    public func apps() async throws -> [AppWork] {
        switch source {
        case .settings(let settings):
            let environment = AppStoreServerAPI.environment(ofHost: settings.baseURL) ?? settings.environment ?? .sandbox
            return [AppWork(bundleId: BundleID(unchecked: settings.bundleID), environments: [environment])]
        case .catalog(let catalog, _):
            var work: [AppWork] = []
            for app in try await catalog.list() {
                guard app.apiKey != nil else {
                    skip(app.bundleId)
                    continue
                }
                work.append(AppWork(
                    bundleId: app.bundleId, environments: app.environments.map { $0 == .production ? AppleEnvironment.production : .sandbox }))
            }
            return work
        }
    }

    /// Whether any app has a key (nothing logged or counted).
    public func anyKey() async throws -> Bool {
        switch source {
        case .settings: true
        case .catalog(let catalog, _): try await catalog.list().contains { $0.apiKey != nil }
        }
    }

    /// The client of `app` (nil: the ledger's first app, which rows written before apps had an
    /// app belong to) in `environment` (nil: production's when the app accepts Production, else
    /// the sandbox's). Throws `apple-api-no-key` for an app without a key (skipped: logged once,
    /// counted), `app-key-unavailable` when its reference points at nothing readable, and
    /// `apple-api-key-invalid` when the key is no P-256 key.
    public func client(for app: BundleID? = nil, environment: AppleEnvironment? = nil) async throws -> AppStoreServerAPI {
        switch source {
        case .settings(let settings):
            // One app's client: another app has no key here.
            if let app, app.rawValue.lowercased() != settings.bundleID.lowercased() { throw noKey(app) }
            return try await client(settings, cachedAs: "settings")
        case .catalog(let catalog, let hosts):
            var id = app
            if id == nil { id = try await catalog.firstApp() }
            guard let id, let stored = try await catalog.app(id) else {
                throw AppStoreServerAPIError(code: "apple-api-no-key", message: "the ledger holds no app \(app?.rawValue ?? "") to ask Apple for")
            }
            guard let key = try await catalog.credentials(of: stored.bundleId)?.apiKey else { throw noKey(stored.bundleId) }
            let pem: String
            do { pem = try key.privateKey.pem() } catch {
                throw AppStoreServerAPIError(code: error.code, message: "\(error.description) (app \(stored.bundleId))")
            }
            let environment = Self.environment(environment, accepted: stored.environments)
            var settings = hosts.template
            (settings.keyID, settings.issuerID, settings.privateKeyPEM) = (key.keyId, key.issuerId, pem)
            (settings.bundleID, settings.baseURL, settings.environment) = (stored.bundleId.rawValue, hosts.url(environment), environment)
            return try await client(settings, cachedAs: stored.bundleId.rawValue.lowercased() + "/" + environment.rawValue)
        }
    }

    /// The environment a call goes to: the transaction's (Production or Sandbox), else production
    /// when the app accepts it, else the sandbox.
    static func environment(_ environment: AppleEnvironment?, accepted: [App.Environment]) -> AppleEnvironment {
        switch environment {
        case .production?: .production
        case .sandbox?, .xcode?, .localTesting?: .sandbox
        case nil: accepted.contains(.production) || accepted.isEmpty ? .production : .sandbox
        }
    }

    /// The client made for `settings` before, while its key, ids and host are the same; else a new one.
    private func client(_ settings: AppStoreServerAPI.Settings, cachedAs name: String) async throws(AppStoreServerAPIError) -> AppStoreServerAPI {
        if let kept = made[name], kept.settings.keyID == settings.keyID, kept.settings.issuerID == settings.issuerID,
           kept.settings.privateKeyPEM == settings.privateKeyPEM, kept.settings.baseURL == settings.baseURL {
            return kept.client
        }
        let client = try await AppStoreServerAPI(settings: settings, logger: logger)
        made[name] = (settings, client)
        return client
    }

    private func noKey(_ app: BundleID) -> AppStoreServerAPIError {
        skip(app)
        return AppStoreServerAPIError(code: "apple-api-no-key", message: "the app \(app) has no App Store Server API key: its work that asks Apple is skipped")
    }

    /// An app's work skipped: counted each time, logged once per app and process.
    private func skip(_ app: BundleID) {
        skipped?(app)
        guard warned.insert(app.rawValue.lowercased()).inserted else { return }
        logger.warning("an app has no App Store Server API key: its work that asks Apple is skipped (set its key with `ledger apps set`)",
                       metadata: ["app.bundle_id": "\(app)"])
    }
}

extension AppleEnvironment {
    /// The environment Apple named (`Production`, `Sandbox`), or nil for none or another.
    public init?(stored name: String?) {
        guard let name, let environment = AppleEnvironment(name: name), [.production, .sandbox].contains(environment) else { return nil }
        self = environment
    }
}
