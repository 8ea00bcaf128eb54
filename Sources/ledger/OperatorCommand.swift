import AppleReceipts
import ArgumentParser
import Foundation
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore

/// Progress on standard error ("12 of 40 users"), only when it is a terminal.
func terminalProgress(_ unit: String) -> (@Sendable (Int, Int) -> Void)? {
    guard isatty(STDERR_FILENO) == 1 else { return nil }
    return { @Sendable (done: Int, total: Int) in
        FileHandle.standardError.write(Data("\r\(done) of \(total) \(unit)".utf8))
        if done >= total { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}

/// The metadata of the events a command appends: who ran it, as `ledger <command>` and the
/// operating-system user (over HTTP, a key's name is recorded instead).
func operatorMetadata(_ command: String) throws -> Data {
    let who = "ledger \(command) (\(operatingSystemUser()))"
    return try JSONSerialization.data(withJSONObject: ["appendedBy": who])
}

/// `body`'s value; a bad option's value it refuses (`LedgerInputError`) is a usage error (exit 64).
func optionValue<Value>(_ body: () throws -> Value) throws -> Value {
    do {
        return try body()
    } catch let error as LedgerInputError {
        throw ValidationError("\(error.field.hasPrefix("--") ? "" : "--")\(error.field) \(error.problem)")
    }
}

/// `--user`, refused as the routes refuse a user id (padded included: what Apple answers is
/// recorded as this user's), as a usage error naming the option.
func userOption(_ user: String?) throws -> UserID? {
    try optionValue {
        try user.map { text throws(LedgerInputError) in
            do throws(LedgerInputError) {
                return try UserID(given: text)
            } catch {
                throw LedgerInputError(field: "--user", problem: error.problem)
            }
        }
    }
}

/// The operating-system user running the command: `$USER`, else the name of the process's user id
/// (systemd, cron and `docker exec` set no `USER`), else its number.
func operatingSystemUser() -> String {
    if let name = ProcessInfo.processInfo.environment["USER"], !name.isEmpty { return name }
    let uid = getuid()
    if let entry = getpwuid(uid), let name = entry.pointee.pw_name { return String(cString: name) }
    return "uid \(uid)"
}

/// What a command that asks Apple works with: its configuration, the apps' App Store Server API
/// clients, the verifier, and the ledger's services on its database.
struct AppleWork: Sendable {
    let configuration: LedgerConfiguration
    let api: LazyAppStoreServerAPI
    let verifier: AppleProofVerifier
    let services: ServiceAssembly
}

/// Runs `body` for a command that asks Apple with an App Store Server API key: each app's
/// own, read from the apps' catalog (the configured app's recorded first); refused when no app
/// has one, unless `requiringKey` is false (the command then checks `api.anyKey()` itself).
func withAppleWork<Result: Sendable>(
    _ options: ConfigurationOptions, requiringKey: Bool = true, _ body: @Sendable (AppleWork) async throws -> Result
) async throws -> Result {
    let configuration = try options.configuration()
    // A configured key that cannot be read stops the command before the database is opened.
    _ = try configuration.apple.appStoreServerAPI()
    return try await withLedgerDatabase(options) { client, logger in
        let database = Database(client: client, logger: logger)
        let api = LazyAppStoreServerAPI(catalog: AppCatalog(database: database), hosts: configuration.apple.appStoreServerAPIHosts(), logger: logger)
        let hasKey = try await api.anyKey()
        guard hasKey || !requiringKey else {
            throw CommandFailure("the App Store Server API is not configured: set LEDGER_APPLE_API_KEY_ID, LEDGER_APPLE_API_ISSUER_ID and LEDGER_APPLE_API_PRIVATE_KEY, or give an app its key with `ledger apps set`")
        }
        // What Apple signs is checked against the app the ledger holds for its bundle id.
        let apps = AppDirectory(catalog: AppCatalog(database: database), maximumAge: .seconds(configuration.appsMaximumAge), logger: logger)
        return try await body(AppleWork(
            configuration: configuration, api: api, verifier: try configuration.apple.verifier(logger: logger).choosingApps(from: apps),
            services: ServiceAssembly(database: database, purchaseAllowance: configuration.reconciler.clockSkew)))
    }
}

/// The app `--bundle-id` names (any case), as the ledger holds it; nil when none is named, which
/// is refused (`bundle-id-required`, `why`) when `required` and the ledger holds several apps.
func namedApp(_ bundleId: String?, required: Bool, why: String = "", on database: Database) async throws -> BundleID? {
    let apps = try await AppCatalog(database: database).list()
    guard let bundleId else {
        if required, apps.count > 1 {
            throw CommandFailure("bundle-id-required: the ledger holds \(apps.count) apps\(why); name one with --bundle-id")
        }
        return nil
    }
    guard let held = apps.first(where: { $0.bundleId.rawValue.lowercased() == bundleId.lowercased() }) else {
        throw CommandFailure("unknown-app: the ledger holds no app \(bundleId)")
    }
    return held.bundleId
}
