import AppleReceipts
import Foundation
import LedgerCore
import LedgerServices
import LedgerStore
import Logging

/// Every setting of the ledger, read in one place from the environment (and flags, which use
/// the same names) and validated at start with a message naming every bad or missing setting.
public struct LedgerConfiguration: Sendable {
    /// Where the events live: a configured server, or the ledger's own private cluster.
    public enum DatabaseSource: Sendable, Equatable {
        case url(DatabaseURL)
        case privateCluster(dataDirectory: String)
    }

    /// Apple verification settings (used by the receipts and notifications routes). With root
    /// certificates, the app they check against is required: see `identityProblems()`.
    public struct Apple: Sendable, Equatable {
        public var rootCertificateFiles: [String] = []
        public var bundleID: String?
        public var appID: Int64?
        /// The environments the app accepts signed data from (`LEDGER_APPLE_ENVIRONMENT`, a
        /// list): both by default, since App Review buys in the sandbox against production.
        public var environments: [AppleEnvironment] = [.production, .sandbox]
        /// Whether `environments` was given (`LEDGER_APPLE_ENVIRONMENT`, or set otherwise than
        /// the default): left out, the configured app keeps the environments it has.
        public var environmentsGiven: Bool {
            get { environmentsSet || environments != [.production, .sandbox] }
            set { environmentsSet = newValue }
        }
        var environmentsSet = false
        public var verifyReceiptURL = "https://buy.itunes.apple.com/verifyReceipt"
        public var verifyReceiptSandboxURL = "https://sandbox.itunes.apple.com/verifyReceipt"
        /// How long verifyReceipt may take before a proof is answered `retry-later` (set in code
        /// only: tests on a loaded machine wait for their stand-in's answer rather than race it).
        public var verifyReceiptSeconds: Int64 = 10
        public var sharedSecret: String?
        /// What the app's appAccountToken names (`LEDGER_APPLE_ACCOUNT_TOKENS`: order or user);
        /// nil: as the app has it (a new one: per order).
        public var appAccountTokens: AppAccountTokenScope?
        /// The App Store Server API's key (all three set, or none: the features that ask Apple are off).
        public var apiKeyID: String?
        public var apiIssuerID: String?
        /// The path of the In-App Purchase key's `.p8` PEM file.
        public var apiPrivateKeyFile: String?
        /// The base URL calls about Production transactions go to (a stand-in's, a proxy's);
        /// nil: Apple's production host. Alone, it serves the sandbox's calls too.
        public var apiURL: String?
        /// The base URL calls about Sandbox transactions go to; nil: `apiURL` when that is set,
        /// else Apple's sandbox host.
        public var apiSandboxURL: String?
        public var apiRequestsPerSecond = 10.0
    }

    /// The names of every setting, as environment variables.
    public enum Key {
        public static let databaseURL = "LEDGER_DATABASE_URL"
        public static let dataDirectory = "LEDGER_DATA_DIR"
        public static let host = "LEDGER_HOST"
        public static let port = "LEDGER_PORT"
        public static let logLevel = "LEDGER_LOG_LEVEL"
        public static let appleRootCertificates = "LEDGER_APPLE_ROOT_CERTS"
        public static let appleBundleID = "LEDGER_APPLE_BUNDLE_ID"
        public static let appleAppID = "LEDGER_APPLE_APP_ID"
        public static let appleEnvironment = "LEDGER_APPLE_ENVIRONMENT"
        public static let verifyReceiptURL = "LEDGER_APPLE_VERIFY_RECEIPT_URL"
        public static let verifyReceiptSandboxURL = "LEDGER_APPLE_VERIFY_RECEIPT_SANDBOX_URL"
        public static let appleSharedSecret = "LEDGER_APPLE_SHARED_SECRET"
        public static let appleAccountTokens = "LEDGER_APPLE_ACCOUNT_TOKENS"
        public static let appleAPIKeyID = "LEDGER_APPLE_API_KEY_ID"
        public static let appleAPIIssuerID = "LEDGER_APPLE_API_ISSUER_ID"
        public static let appleAPIPrivateKey = "LEDGER_APPLE_API_PRIVATE_KEY"
        public static let appleAPIURL = "LEDGER_APPLE_API_URL"
        public static let appleAPISandboxURL = "LEDGER_APPLE_API_SANDBOX_URL"
        public static let appleAPIRate = "LEDGER_APPLE_API_RATE"
        public static let reconcileInterval = "LEDGER_RECONCILE_INTERVAL"
        public static let reconcileClockSkew = "LEDGER_RECONCILE_CLOCK_SKEW"
        public static let reconcileMaximumAge = "LEDGER_RECONCILE_MAX_AGE"
        public static let reconcileSettle = "LEDGER_RECONCILE_SETTLE"
        public static let reconcileRecoveryOrders = "LEDGER_RECONCILE_RECOVERY_ORDERS"
        public static let recoveryAfter = "LEDGER_RECOVERY_AFTER"
        public static let recoveryInterval = "LEDGER_RECOVERY_INTERVAL"
        public static let consumptionConsent = "LEDGER_APPLE_CONSUMPTION_CONSENT"
        public static let finishAfterDelivery = "LEDGER_APPLE_FINISH_AFTER_DELIVERY"
        public static let setTokenAfterPairing = "LEDGER_APPLE_SET_TOKEN_AFTER_PAIRING"
        public static let refundLookback = "LEDGER_REFUND_LOOKBACK"
        public static let appsMaximumAge = "LEDGER_APPS_MAX_AGE"
        public static let appStoreConnectURL = "LEDGER_APP_STORE_CONNECT_URL"
        public static let appStoreConnectIssuerID = "LEDGER_APP_STORE_CONNECT_ISSUER_ID"
        public static let appStoreConnectKeyID = "LEDGER_APP_STORE_CONNECT_KEY_ID"
        public static let appStoreConnectPrivateKey = "LEDGER_APP_STORE_CONNECT_PRIVATE_KEY"
        public static let appStoreConnectVendorNumber = "LEDGER_APP_STORE_CONNECT_VENDOR_NUMBER"
        public static let appStoreConnectSalesVersion = "LEDGER_APP_STORE_CONNECT_SALES_VERSION"

        public static let all = [
            databaseURL, dataDirectory, host, port, logLevel, appleRootCertificates, appleBundleID, appleAppID,
            appleEnvironment, verifyReceiptURL, verifyReceiptSandboxURL, appleSharedSecret, appleAccountTokens,
            appleAPIKeyID, appleAPIIssuerID, appleAPIPrivateKey, appleAPIURL, appleAPISandboxURL, appleAPIRate,
            reconcileInterval, reconcileClockSkew, reconcileMaximumAge, reconcileSettle, reconcileRecoveryOrders,
            recoveryAfter, recoveryInterval, consumptionConsent, finishAfterDelivery, setTokenAfterPairing, refundLookback,
            appsMaximumAge, appStoreConnectURL, appStoreConnectIssuerID, appStoreConnectKeyID, appStoreConnectPrivateKey,
            appStoreConnectVendorNumber, appStoreConnectSalesVersion,
        ]
    }

    public var database: DatabaseSource = .privateCluster(dataDirectory: "./.ledger")
    public var host = "127.0.0.1"
    public var port = 8080
    public var logLevel: Logger.Level = .info
    public var apple = Apple()
    /// The App Store Connect API's key for sales reports; nil: none fetched.
    public var appStoreConnect: AppStoreConnect?
    /// The longest time a setting in seconds may give: ten years.
    public static let longestSeconds = 10 * 365 * 86_400
    /// Seconds between the background reconciler's passes inside `ledger serve`; 0: none.
    public var reconcileInterval = 60
    /// Seconds a connection may sit idle, or send a request's head or body no further, before
    /// the server closes it (a reply being made is never cut off). Longer than the 60 s an
    /// HTTP client pool keeps an idle connection (async-http-client's), so that the client,
    /// not the server, closes a quiet keep-alive connection. Not a setting.
    public var connectionIdleTimeout = 75
    /// Seconds a request may take to arrive whole after its head: a body trickled slower is cut
    /// off with its connection. Not a setting.
    public var requestReadTimeout = 60
    /// The most client connections open at once; nil: below the process's limit of open files
    /// (`ConnectionLimitHandler.Count.defaultLimit`). Not a setting.
    public var maximumConnections: Int?
    public var reconciler = Reconciler.Settings()
    /// Whether the reconciler creates a recovery order for an orphan with no candidate (active catalog products only).
    public var recoveryOrders = false
    /// Seconds an order stays open before its user's Apple accounts are due a history sweep.
    public var recoveryAfter = 600
    /// Seconds between history sweeps inside `ledger serve` (with an App Store Server API key); 0: none.
    public var recoveryInterval = 300
    /// Which calls to Apple events call for (consumption answers need the operator's word that
    /// the app's terms obtain the customer's consent; the other two are off by default).
    public var appleCalls = AppleCallQueue.Switches()
    /// Seconds between passes of the calls to Apple inside `ledger serve`; 0: none.
    public var appleCallsInterval = 10
    /// Days back whose granted transactions' accounts the refund catch-up reads.
    public var refundLookbackDays = 90
    /// Seconds between refund catch-up passes inside `ledger serve` (each account is read at most
    /// once a day); 0: none.
    public var refundCatchUpInterval = 3600
    /// Seconds between fetches of App Store Connect's sales reports inside `ledger serve` (with an
    /// App Store Connect key; each day is asked until Apple publishes it); 0: none.
    public var salesFetchInterval = 3600
    /// Whether `ledger serve` backfills the notifications Apple sent while it was away, at start.
    public var backfillNotificationsAtStart = true
    /// Seconds the verifier of proofs uses its copy of the apps before it reads them again
    /// (changes made through another server or `ledger apps set`; this server's own changes and
    /// an app not found are read at once).
    public var appsMaximumAge = 10

    public init() {}

    /// Reads the settings from `values` (environment names as keys); empty values count as unset.
    public static func load(_ values: [String: String]) throws(LedgerConfigurationError) -> LedgerConfiguration {
        let values = values.filter { !$0.value.isEmpty }
        var configuration = LedgerConfiguration()
        var problems: [LedgerConfigurationProblem] = []

        if let url = values[Key.databaseURL] {
            do { configuration.database = .url(try DatabaseURL(url)) } catch { problems.append(error) }
        } else if let directory = values[Key.dataDirectory] {
            configuration.database = .privateCluster(dataDirectory: directory)
        }
        if let host = values[Key.host] {
            if Self.isListenAddress(host) {
                configuration.host = host
            } else {
                problems.append(.init(Key.host, "is \(host), not an IP address or a host name (such as 127.0.0.1, 0.0.0.0, ::1 or localhost)"))
            }
        }
        if let text = values[Key.port] {
            if let port = Int(text), (0...65535).contains(port) {
                configuration.port = port
            } else {
                problems.append(.init(Key.port, "is \(text), not a port number (0 to 65535)"))
            }
        }
        if let text = values[Key.logLevel] {
            if let level = Logger.Level(rawValue: text.lowercased()) {
                configuration.logLevel = level
            } else {
                problems.append(.init(Key.logLevel, "is \(text); use trace, debug, info, notice, warning, error or critical"))
            }
        }
        problems += configuration.apple.load(values)
        let (appStoreConnect, appStoreConnectProblems) = AppStoreConnect.load(values)
        configuration.appStoreConnect = appStoreConnect
        problems += appStoreConnectProblems
        for (key, minimum, apply) in [
            (Key.reconcileInterval, 0, { (c: inout LedgerConfiguration, v: Int) in c.reconcileInterval = v }),
            (Key.reconcileClockSkew, 0, { (c: inout LedgerConfiguration, v: Int) in c.reconciler.clockSkew = TimeInterval(v) }),
            (Key.reconcileMaximumAge, 1, { (c: inout LedgerConfiguration, v: Int) in c.reconciler.maximumAge = TimeInterval(v) }),
            (Key.reconcileSettle, 0, { (c: inout LedgerConfiguration, v: Int) in c.reconciler.settle = TimeInterval(v) }),
            (Key.recoveryAfter, 0, { (c: inout LedgerConfiguration, v: Int) in c.recoveryAfter = v }),
            (Key.recoveryInterval, 0, { (c: inout LedgerConfiguration, v: Int) in c.recoveryInterval = v }),
            (Key.appsMaximumAge, 0, { (c: inout LedgerConfiguration, v: Int) in c.appsMaximumAge = v }),
        ] as [(String, Int, (inout LedgerConfiguration, Int) -> Void)] {
            guard let text = values[key] else { continue }
            // At most ten years: a date that far from now is one PostgreSQL still holds.
            if let seconds = Int(text), (minimum...Self.longestSeconds).contains(seconds) {
                apply(&configuration, seconds)
            } else {
                problems.append(.init(key, "is \(text), not a whole number of seconds (\(minimum) to \(Self.longestSeconds), ten years)"))
            }
        }
        if let text = values[Key.refundLookback] {
            if let days = Int(text), (1...3650).contains(days) {
                configuration.refundLookbackDays = days
            } else {
                problems.append(.init(Key.refundLookback, "is \(text), not a whole number of days (1 to 3650)"))
            }
        }
        for (key, apply) in [
            (Key.reconcileRecoveryOrders, { (c: inout LedgerConfiguration, v: Bool) in c.recoveryOrders = v }),
            (Key.consumptionConsent, { (c: inout LedgerConfiguration, v: Bool) in c.appleCalls.consumption = v }),
            (Key.finishAfterDelivery, { (c: inout LedgerConfiguration, v: Bool) in c.appleCalls.finishAfterDelivery = v }),
            (Key.setTokenAfterPairing, { (c: inout LedgerConfiguration, v: Bool) in c.appleCalls.setTokenAfterPairing = v }),
        ] as [(String, (inout LedgerConfiguration, Bool) -> Void)] {
            guard let text = values[key] else { continue }
            switch text.lowercased() {
            case "true", "1", "yes", "on": apply(&configuration, true)
            case "false", "0", "no", "off": apply(&configuration, false)
            default: problems.append(.init(key, "is \(text); use true or false (1 or 0, yes or no, on or off)"))
            }
        }
        guard problems.isEmpty else { throw LedgerConfigurationError(problems: problems) }
        return configuration
    }
}

extension LedgerConfiguration {
    /// Whether `text` can be listened on by name: an IPv4 or IPv6 address (with a zone, `fe80::1%eth0`),
    /// or a host name of letters, digits, hyphens and underscores (container names have them) in
    /// dot-separated labels, a final dot allowed. Checked with the other settings rather than when
    /// the server binds, after its migrations ran.
    static func isListenAddress(_ text: String) -> Bool {
        var v4 = in_addr(), v6 = in6_addr()
        let parts = text.split(separator: "%", maxSplits: 1, omittingEmptySubsequences: false)
        if inet_pton(AF_INET, text, &v4) == 1 { return true }
        if parts.count == 1 || !parts[1].isEmpty, inet_pton(AF_INET6, String(parts[0]), &v6) == 1 { return true }
        let name = text.hasSuffix(".") ? String(text.dropLast()) : text
        guard !name.isEmpty, name.utf8.count <= 253 else { return false }
        return name.split(separator: ".", omittingEmptySubsequences: false).allSatisfy { label in
            (1...63).contains(label.utf8.count) && label.first != "-" && label.last != "-"
                && label.utf8.allSatisfy {
                    $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: "_") || (48...57).contains($0) || (65...90).contains($0) || (97...122).contains($0)
                }
        }
    }

    /// What is wrong with a key file setting, or nil: missing, unreadable, or no P-256 private key
    /// in PEM (the text of Apple's .p8 file). Checked as the settings are read, so that every
    /// command refuses it, before any of them records it as the configured app's key.
    static func privateKeyProblem(_ file: String) -> String? {
        guard FileManager.default.isReadableFile(atPath: file), let pem = try? String(contentsOfFile: file, encoding: .utf8) else {
            return "names \(file), which is missing or unreadable"
        }
        // The rule a key given to `ledger apps` or `POST /v1/apps` is held to.
        do { _ = try checkedPrivateKeyPEM(pem, field: file) } catch { return "names \(file), which \(error.problem)" }
        return nil
    }
}

extension LedgerConfiguration.Apple {
    mutating func load(_ values: [String: String]) -> [LedgerConfigurationProblem] {
        typealias Key = LedgerConfiguration.Key
        var problems: [LedgerConfigurationProblem] = []
        if let files = values[Key.appleRootCertificates] {
            rootCertificateFiles = files.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
            for file in rootCertificateFiles {
                if !FileManager.default.isReadableFile(atPath: file) {
                    problems.append(.init(Key.appleRootCertificates, "names \(file), which is missing or unreadable"))
                } else if (try? AppleRootCertificates.load(paths: [file])) == nil {
                    problems.append(.init(Key.appleRootCertificates, "names \(file), which holds no PEM or DER certificate"))
                }
            }
        }
        bundleID = values[Key.appleBundleID]
        if let text = values[Key.appleAppID] {
            if let id = Int64(text), id > 0 { appID = id } else { problems.append(.init(Key.appleAppID, "is \(text), not a numeric app id")) }
        }
        if let text = values[Key.appleEnvironment] {
            switch Self.environments(text) {
            case .success(let list): (environments, environmentsGiven) = (list, true)
            case .failure(let problem): problems.append(problem)
            }
        }
        for (key, assign) in [(Key.verifyReceiptURL, \Self.verifyReceiptURL), (Key.verifyReceiptSandboxURL, \Self.verifyReceiptSandboxURL)] {
            guard let text = values[key] else { continue }
            if let url = URL(string: text), ["http", "https"].contains(url.scheme ?? ""), url.host != nil {
                self[keyPath: assign] = text
            } else {
                problems.append(.init(key, "is \(text), not an http(s) URL"))
            }
        }
        sharedSecret = values[Key.appleSharedSecret]
        if let text = values[Key.appleAccountTokens] {
            do { appAccountTokens = try AppAccountTokenScope(setting: text, field: Key.appleAccountTokens) } catch {
                problems.append(.init(Key.appleAccountTokens, error.problem))
            }
        }
        problems += loadAPI(values)
        // A setting already named (an app id that is no number) is not named again as missing.
        let named = Set(problems.map(\.setting))
        problems += identityProblems().filter { !named.contains($0.setting) }
        return problems
    }

    /// `LEDGER_APPLE_ENVIRONMENT`'s list: `Production`, `Sandbox` or both, comma-separated, in
    /// any case. Xcode and LocalTesting are refused: their data is signed by Xcode's own
    /// certificate, which no Apple root vouches for.
    static func environments(_ text: String) -> Result<[AppleEnvironment], LedgerConfigurationProblem> {
        let names = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        var list: [AppleEnvironment] = []
        for name in names {
            guard let environment = AppleEnvironment(name: name), [.production, .sandbox].contains(environment) else {
                return .failure(.init(
                    LedgerConfiguration.Key.appleEnvironment, "is \(text): \(name) is no environment; use Production, Sandbox or Production,Sandbox"))
            }
            if !list.contains(environment) { list.append(environment) }
        }
        guard !list.isEmpty else {
            return .failure(.init(LedgerConfiguration.Key.appleEnvironment, "is \(text), which names no environment; use Production, Sandbox or Production,Sandbox"))
        }
        return .success(list)
    }

    /// The environment of Apple's API host these settings ask by default: production when the
    /// app accepts it, else the sandbox.
    public var apiEnvironment: AppleEnvironment { environments.contains(.production) ? .production : .sandbox }

    /// The App Store Server API's settings: the key's three settings together or not at all.
    private mutating func loadAPI(_ values: [String: String]) -> [LedgerConfigurationProblem] {
        typealias Key = LedgerConfiguration.Key
        var problems: [LedgerConfigurationProblem] = []
        (apiKeyID, apiIssuerID, apiPrivateKeyFile) = (values[Key.appleAPIKeyID], values[Key.appleAPIIssuerID], values[Key.appleAPIPrivateKey])
        let given = [(Key.appleAPIKeyID, apiKeyID), (Key.appleAPIIssuerID, apiIssuerID), (Key.appleAPIPrivateKey, apiPrivateKeyFile)]
        let missing = given.filter { $0.1 == nil }.map(\.0)
        if missing.count < 3 {
            for key in missing { problems.append(.init(key, "is missing: the App Store Server API needs the key id, the issuer id and the key file together")) }
        }
        if let file = apiPrivateKeyFile, let problem = LedgerConfiguration.privateKeyProblem(file) {
            problems.append(.init(Key.appleAPIPrivateKey, problem))
        }
        for (key, assign) in [(Key.appleAPIURL, \Self.apiURL), (Key.appleAPISandboxURL, \Self.apiSandboxURL)] {
            guard let text = values[key] else { continue }
            if let url = URL(string: text), ["http", "https"].contains(url.scheme ?? ""), url.host != nil {
                self[keyPath: assign] = text
            } else {
                problems.append(.init(key, "is \(text), not an http(s) URL"))
            }
        }
        if let text = values[Key.appleAPIRate] {
            // Digits with a point at most, as the other numbers: Double would also read 0x10 and 1e2.
            if text.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }), let rate = Double(text), rate > 0, rate <= 1_000 {
                apiRequestsPerSecond = rate
            } else {
                problems.append(.init(Key.appleAPIRate, "is \(text); use a number of requests per second above 0, at most 1000"))
            }
        }
        return problems
    }

    /// The hosts every app's App Store Server API clients ask (by the environment of the
    /// transaction a call concerns) and the settings they share: `apiURL` for Production (and
    /// for the sandbox too when `apiSandboxURL` is not set), else Apple's hosts. An `apiURL`
    /// naming one of Apple's own hosts overrides nothing: a ledger that named Apple's production
    /// host still sends the calls about Sandbox transactions (App Review's) to the sandbox's.
    public func appStoreServerAPIHosts() -> LazyAppStoreServerAPI.Hosts {
        // Apple's hosts of today, or the older `itunes.apple.com` ones its docs gave.
        let custom = apiURL.flatMap { AppStoreServerAPI.environment(ofHost: $0) == nil ? $0 : nil }
        return LazyAppStoreServerAPI.Hosts(
            productionURL: custom ?? AppStoreServerAPI.productionURL, sandboxURL: apiSandboxURL ?? custom ?? AppStoreServerAPI.sandboxURL,
            template: AppStoreServerAPI.Settings(
                keyID: "", issuerID: "", privateKeyPEM: "", bundleID: "", baseURL: "", requestsPerSecond: apiRequestsPerSecond))
    }

    /// The configured app's App Store Server API settings, or nil when no key is configured
    /// (then the keys are the apps' own: `ledger apps set`). Throws when the key file cannot be
    /// read or holds no P-256 key.
    public func appStoreServerAPI() throws -> AppStoreServerAPI.Settings? {
        guard let keyID = apiKeyID, let issuerID = apiIssuerID, let file = apiPrivateKeyFile else { return nil }
        let pem = try String(contentsOfFile: file, encoding: .utf8)
        try AppStoreServerAPI.key(pem)
        return AppStoreServerAPI.Settings(
            keyID: keyID, issuerID: issuerID, privateKeyPEM: pem, bundleID: bundleID ?? "",
            baseURL: apiURL ?? (apiEnvironment == .sandbox ? AppStoreServerAPI.sandboxURL : AppStoreServerAPI.productionURL),
            environment: apiEnvironment, requestsPerSecond: apiRequestsPerSecond)
    }
}

/// Every problem found in the configuration, one per line.
public struct LedgerConfigurationError: Error, Sendable, CustomStringConvertible {
    public let problems: [LedgerConfigurationProblem]

    public init(problems: [LedgerConfigurationProblem]) {
        self.problems = problems
    }

    public var description: String {
        "invalid configuration: " + problems.map(\.description).joined(separator: "; ")
    }
}

extension LedgerConfiguration.Apple {
    /// The verifier these settings describe. Throws when a root certificate file cannot be read
    /// or holds no certificate: the service refuses to start rather than reject every proof.
    public func verifier(logger: Logger) throws -> AppleProofVerifier {
        // Settings made in code (not read by `load`) are held to the same rule.
        let problems = identityProblems()
        guard problems.isEmpty else { throw LedgerConfigurationError(problems: problems) }
        let roots = try AppleRootCertificates.load(paths: rootCertificateFiles)
        return AppleProofVerifier(
            app: .init(bundleId: bundleID, appAppleId: appID, environments: Set(environments)),
            signedData: SignedDataVerifier(rootCertificates: roots),
            verifyReceipt: VerifyReceiptClient(
                settings: .init(
                    productionURL: verifyReceiptURL, sandboxURL: verifyReceiptSandboxURL, sharedSecret: sharedSecret,
                    timeout: .seconds(verifyReceiptSeconds)),
                logger: logger))
    }
}

extension LedgerConfiguration {
    /// A reconciler pass with these settings.
    public func reconcilerPass(_ services: ServiceAssembly) -> ReconcilerPass {
        services.reconcilerPass(settings: reconciler, recoveryOrders: recoveryOrders)
    }

    /// A history sweep with these settings, asking Apple through `api`.
    public func historySweep(_ services: ServiceAssembly, api: LazyAppStoreServerAPI, verifier: AppleProofVerifier) -> HistorySweep {
        var sweep = services.historySweep(api: api, verifier: verifier)
        sweep.recoverAfter = TimeInterval(recoveryAfter)
        sweep.clockSkew = reconciler.clockSkew
        return sweep
    }

    /// The calls to Apple that events call for, with these switches.
    public func appleCalls(_ services: ServiceAssembly, api: LazyAppStoreServerAPI) -> AppleCalls {
        services.appleCalls(api: api, switches: appleCalls)
    }

    /// A refund catch-up with these settings.
    public func refundCatchUp(_ services: ServiceAssembly, api: LazyAppStoreServerAPI, verifier: AppleProofVerifier) -> RefundCatchUp {
        var catchUp = services.refundCatchUp(api: api, verifier: verifier)
        catchUp.lookbackDays = refundLookbackDays
        return catchUp
    }
}
