import ArgumentParser
import Foundation
import LedgerServer
import LedgerStore
import Logging

/// The settings (docs/operations.md) as flags; each falls back to its environment variable.
struct ConfigurationOptions: ParsableArguments {
    @Option(help: "PostgreSQL URL (LEDGER_DATABASE_URL); unset: a private cluster under --data-dir")
    var databaseURL: String?
    @Option(help: "Private cluster directory (LEDGER_DATA_DIR, default ./.ledger)")
    var dataDir: String?
    @Option(help: "Listen address (LEDGER_HOST, default 127.0.0.1)")
    var host: String?
    @Option(help: "Listen port (LEDGER_PORT, default 8080)")
    var port: String?
    @Option(help: "trace, debug, info, notice, warning, error or critical (LEDGER_LOG_LEVEL, default info)")
    var logLevel: String?
    @Option(help: "Comma-separated Apple root certificate files, PEM or DER (LEDGER_APPLE_ROOT_CERTS)")
    var appleRootCerts: String?
    @Option(help: "The app's bundle id, required with root certificates (LEDGER_APPLE_BUNDLE_ID)")
    var appleBundleId: String?
    @Option(help: "The app's Apple id, required with root certificates in production (LEDGER_APPLE_APP_ID)")
    var appleAppId: String?
    @Option(help: "The environments accepted: Production,Sandbox (the default), Production or Sandbox (LEDGER_APPLE_ENVIRONMENT)")
    var appleEnvironment: String?
    @Option(help: "verifyReceipt production URL (LEDGER_APPLE_VERIFY_RECEIPT_URL)")
    var appleVerifyReceiptUrl: String?
    @Option(help: "verifyReceipt sandbox URL (LEDGER_APPLE_VERIFY_RECEIPT_SANDBOX_URL)")
    var appleVerifyReceiptSandboxUrl: String?
    @Option(help: "App-specific shared secret for verifyReceipt (LEDGER_APPLE_SHARED_SECRET)")
    var appleSharedSecret: String?
    @Option(help: "What the app's appAccountToken names: order (one order, the default for a new app) or user (LEDGER_APPLE_ACCOUNT_TOKENS)")
    var appleAccountTokens: String?
    @Option(help: "App Store Server API: the In-App Purchase key's id (LEDGER_APPLE_API_KEY_ID)")
    var appleApiKeyId: String?
    @Option(help: "App Store Server API: the issuer id (LEDGER_APPLE_API_ISSUER_ID)")
    var appleApiIssuerId: String?
    @Option(help: "App Store Server API: path of the key's .p8 PEM file (LEDGER_APPLE_API_PRIVATE_KEY)")
    var appleApiPrivateKey: String?
    @Option(help: "App Store Server API base URL for Production transactions, and for Sandbox ones too unless the next is set (LEDGER_APPLE_API_URL, default Apple's production host)")
    var appleApiUrl: String?
    @Option(help: "App Store Server API base URL for Sandbox transactions (LEDGER_APPLE_API_SANDBOX_URL, default LEDGER_APPLE_API_URL when set to a host other than Apple's own, else Apple's sandbox host)")
    var appleApiSandboxUrl: String?
    @Option(help: "App Store Server API: at most this many requests per second to any one endpoint, each also within Apple's limit for it (LEDGER_APPLE_API_RATE, default 10)")
    var appleApiRate: String?
    @Option(help: "Seconds between background reconciler passes in serve, 0: none (LEDGER_RECONCILE_INTERVAL, default 60)")
    var reconcileInterval: String?
    @Option(help: "Seconds an order may be created after the purchase and still match (LEDGER_RECONCILE_CLOCK_SKEW, default 300)")
    var reconcileClockSkew: String?
    @Option(help: "Seconds before the purchase an order may be created and still match (LEDGER_RECONCILE_MAX_AGE, default 2592000)")
    var reconcileMaxAge: String?
    @Option(help: "Seconds every orphan of a user and product must have waited before a pass pairs them (LEDGER_RECONCILE_SETTLE, default 120)")
    var reconcileSettle: String?
    @Option(help: "true: orphans with no candidate get a recovery order, active catalog products only (LEDGER_RECONCILE_RECOVERY_ORDERS, default false)")
    var reconcileRecoveryOrders: String?
    @Option(help: "Seconds an order stays open before its user's Apple accounts are swept (LEDGER_RECOVERY_AFTER, default 600)")
    var recoveryAfter: String?
    @Option(help: "Seconds between history sweeps in serve, 0: none; needs the App Store Server API key (LEDGER_RECOVERY_INTERVAL, default 300)")
    var recoveryInterval: String?
    @Option(help: "true: the app's terms obtain the customer's consent, so the ledger answers Apple's consumption requests (LEDGER_APPLE_CONSUMPTION_CONSENT, default false)")
    var appleConsumptionConsent: String?
    @Option(help: "true: finish each delivered order's transaction at Apple (LEDGER_APPLE_FINISH_AFTER_DELIVERY, default false)")
    var appleFinishAfterDelivery: String?
    @Option(help: "true: set the order's appAccountToken at Apple after a reconciler or support pairing (LEDGER_APPLE_SET_TOKEN_AFTER_PAIRING, default false)")
    var appleSetTokenAfterPairing: String?
    @Option(help: "Days back whose granted transactions' accounts the refund catch-up reads (LEDGER_REFUND_LOOKBACK, default 90)")
    var refundLookback: String?
    @Option(help: "Seconds the verifier of proofs keeps its copy of the apps before reading them again (LEDGER_APPS_MAX_AGE, default 10)")
    var appsMaxAge: String?

    /// Each setting's flag, with what the command line gave it.
    private var flags: [(key: String, flag: String, value: String?)] {
        typealias Key = LedgerConfiguration.Key
        return [
            (Key.databaseURL, "--database-url", databaseURL), (Key.dataDirectory, "--data-dir", dataDir), (Key.host, "--host", host),
            (Key.port, "--port", port), (Key.logLevel, "--log-level", logLevel), (Key.appleRootCertificates, "--apple-root-certs", appleRootCerts),
            (Key.appleBundleID, "--apple-bundle-id", appleBundleId), (Key.appleAppID, "--apple-app-id", appleAppId),
            (Key.appleEnvironment, "--apple-environment", appleEnvironment),
            (Key.verifyReceiptURL, "--apple-verify-receipt-url", appleVerifyReceiptUrl),
            (Key.verifyReceiptSandboxURL, "--apple-verify-receipt-sandbox-url", appleVerifyReceiptSandboxUrl),
            (Key.appleSharedSecret, "--apple-shared-secret", appleSharedSecret), (Key.appleAccountTokens, "--apple-account-tokens", appleAccountTokens),
            (Key.appleAPIKeyID, "--apple-api-key-id", appleApiKeyId), (Key.appleAPIIssuerID, "--apple-api-issuer-id", appleApiIssuerId),
            (Key.appleAPIPrivateKey, "--apple-api-private-key", appleApiPrivateKey), (Key.appleAPIURL, "--apple-api-url", appleApiUrl),
            (Key.appleAPISandboxURL, "--apple-api-sandbox-url", appleApiSandboxUrl), (Key.appleAPIRate, "--apple-api-rate", appleApiRate),
            (Key.reconcileInterval, "--reconcile-interval", reconcileInterval),
            (Key.reconcileClockSkew, "--reconcile-clock-skew", reconcileClockSkew), (Key.reconcileMaximumAge, "--reconcile-max-age", reconcileMaxAge),
            (Key.reconcileSettle, "--reconcile-settle", reconcileSettle),
            (Key.reconcileRecoveryOrders, "--reconcile-recovery-orders", reconcileRecoveryOrders),
            (Key.recoveryAfter, "--recovery-after", recoveryAfter), (Key.recoveryInterval, "--recovery-interval", recoveryInterval),
            (Key.consumptionConsent, "--apple-consumption-consent", appleConsumptionConsent),
            (Key.finishAfterDelivery, "--apple-finish-after-delivery", appleFinishAfterDelivery),
            (Key.setTokenAfterPairing, "--apple-set-token-after-pairing", appleSetTokenAfterPairing),
            (Key.refundLookback, "--refund-lookback", refundLookback), (Key.appsMaximumAge, "--apps-max-age", appsMaxAge),
        ]
    }

    /// The environment with the flags given on the command line laid over it.
    func values(environment: [String: String] = ProcessInfo.processInfo.environment) -> [String: String] {
        var values = environment.filter { LedgerConfiguration.Key.all.contains($0.key) }
        for (key, _, value) in flags { if let value { values[key] = value } }
        return values
    }

    /// The settings, validated; a bad value given as a flag is named by its flag, one from the
    /// environment by its variable, and a missing one by both ways of giving it.
    func configuration(environment: [String: String] = ProcessInfo.processInfo.environment) throws -> LedgerConfiguration {
        do {
            return try LedgerConfiguration.load(values(environment: environment))
        } catch {
            let given = Dictionary(flags.compactMap { $0.value == nil ? nil : ($0.key, $0.flag) }, uniquingKeysWith: { first, _ in first })
            let offered = Dictionary(flags.map { ($0.key, $0.flag) }, uniquingKeysWith: { first, _ in first })
            throw LedgerConfigurationError(problems: error.problems.map { problem in
                if let flag = given[problem.setting] { return LedgerConfigurationProblem(flag, problem.problem) }
                if environment[problem.setting] == nil, let flag = offered[problem.setting] {
                    return LedgerConfigurationProblem("\(flag) (or \(problem.setting))", problem.problem)
                }
                return problem
            })
        }
    }

    /// The validated configuration, with logging set up at its level.
    func load() throws -> LedgerConfiguration {
        let configuration = try configuration()
        LoggingSystem.bootstrap { label in LedgerLogHandler(label: label, level: configuration.logLevel) }
        return configuration
    }
}
