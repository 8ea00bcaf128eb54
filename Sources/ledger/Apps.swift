import ArgumentParser
import Foundation
import LedgerCore
import LedgerJSON
import LedgerServer
import LedgerStore

/// `ledger apps add|list|set`: the apps the ledger serves. No output shows a shared secret or a
/// private key: only whether the app has them, and where its key is kept.
struct Apps: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Manage the apps the ledger serves (bundle ids, environments, Apple's keys).", subcommands: [Add.self, List.self, Set.self])

    /// What `add` and `set` may say of an app.
    struct AppOptions: ParsableArguments {
        @Option(help: "Apple's numeric id of the app (required by Apple's rules before Production-signed data is accepted)")
        var appAppleId: String?
        @Option(help: "Comma-separated environments whose signed data the app accepts: Production, Sandbox (add: both)")
        var environments: String?
        @Option(help: "Consumption answers, where the product says none: DECLINE, GRANT_FULL or GRANT_PRORATED")
        var refundPreference: String?
        @Option(help: "What the app's appAccountToken names: order (one order; add: the default) or user (the user's account, shared by the user's orders)")
        var appAccountTokens: String?
        @Option(help: "The app's SKU in App Store Connect, as its sales reports name it (Parent Identifier)")
        var sku: String?
        @Option(help: "The app-specific shared secret for verifyReceipt (legacy receipts); seen by anyone who lists processes: --shared-secret-file keeps it off the command line")
        var sharedSecret: String?
        @Option(help: "A file holding the app-specific shared secret (its surrounding whitespace ignored)")
        var sharedSecretFile: String?
        @Option(help: "App Store Server API: the key's issuer id")
        var issuerId: String?
        @Option(help: "App Store Server API: the key's id")
        var keyId: String?
        @Option(help: "App Store Server API: the key's .p8 file, read now and stored where only the ledger's roles read it")
        var privateKeyFile: String?
        @Option(help: "App Store Server API: where the key is read each time it is used, instead of storing it: env:NAME (an environment variable of the ledger) or file:PATH")
        var privateKeyRef: String?

        /// The changes these options give (the private key file read and checked here).
        func changes() throws -> AppChanges {
            var changes = AppChanges()
            if let appAppleId {
                guard let id = Int64(appAppleId) else { throw LedgerInputError(field: "--app-apple-id", problem: "is \(appAppleId), not Apple's numeric app id") }
                changes.appAppleId = .some(try App.appleId(id, field: "--app-apple-id"))
            }
            if let environments {
                changes.environments = try App.Environment.list(
                    environments.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }, field: "--environments")
            }
            if let refundPreference {
                guard let preference = RefundPreference(rawValue: refundPreference) else {
                    throw LedgerInputError(field: "--refund-preference", problem: "is \(refundPreference); use DECLINE, GRANT_FULL or GRANT_PRORATED")
                }
                changes.refundPreference = .some(preference)
            }
            if let sku { changes.sku = .some(try App.sku(sku, field: "--sku")) }
            if let appAccountTokens { changes.appAccountTokens = try AppAccountTokenScope(setting: appAccountTokens, field: "--app-account-tokens") }
            if let secret = try givenSharedSecret() { changes.sharedSecret = .some(secret) }
            if let key = try apiKey() { changes.apiKey = .some(key) }
            return changes
        }

        /// The shared secret, given on the command line or in a file.
        func givenSharedSecret() throws -> String? {
            switch (sharedSecret, sharedSecretFile) {
            case (nil, nil): return nil
            case (let secret?, nil): return try AppCredentials.sharedSecret(secret, field: "--shared-secret")
            case (nil, let file?):
                guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
                    throw LedgerInputError(field: "--shared-secret-file", problem: "names \(file), which is missing or unreadable")
                }
                return try AppCredentials.sharedSecret(text.trimmingCharacters(in: .whitespacesAndNewlines), field: "--shared-secret-file")
            case (_?, _?):
                throw LedgerInputError(field: "--shared-secret-file", problem: "cannot be given with --shared-secret: give one of them")
            }
        }

        /// The API key, when any of its options is given: all of them then.
        func apiKey() throws -> AppCredentials.APIKey? {
            guard issuerId != nil || keyId != nil || privateKeyFile != nil || privateKeyRef != nil else { return nil }
            let together = "an App Store Server API key needs --issuer-id, --key-id and --private-key-file or --private-key-ref together"
            guard let issuerId else { throw LedgerInputError(field: "--issuer-id", problem: "is missing: \(together)") }
            guard let keyId else { throw LedgerInputError(field: "--key-id", problem: "is missing: \(together)") }
            let privateKey: AppPrivateKey
            switch (privateKeyFile, privateKeyRef) {
            case (let file?, nil):
                guard let pem = try? String(contentsOfFile: file, encoding: .utf8) else {
                    throw LedgerInputError(field: "--private-key-file", problem: "names \(file), which is missing or unreadable")
                }
                privateKey = .stored(pem: try checkedPrivateKeyPEM(pem, field: "--private-key-file"))
            case (nil, let reference?):
                privateKey = .reference(try SecretReference(reference, field: "--private-key-ref"))
            case (nil, nil):
                throw LedgerInputError(field: "--private-key-file", problem: "is missing: \(together)")
            case (_?, _?):
                throw LedgerInputError(field: "--private-key-ref", problem: "cannot be given with --private-key-file: give one of them")
            }
            return AppCredentials.APIKey(
                issuerId: try Identifier.validate(issuerId, field: "--issuer-id"), keyId: try Identifier.validate(keyId, field: "--key-id"),
                privateKey: privateKey)
        }
    }

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add an app.")
        @OptionGroup var options: ConfigurationOptions
        @Option(help: "The app's bundle id") var bundleId: String
        @OptionGroup var app: AppOptions

        func run() async throws {
            let id = try optionValue { try BundleID.option(bundleId) }
            let changes = try optionValue { try app.changes() }
            let added = try await withLedgerDatabase(options) { client, logger in
                try await AppCatalog(database: Database(client: client, logger: logger)).add(id, changes)
            }
            print(Apps.line(added))
        }
    }

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Change an app: what is given changes, the rest stays.")
        @OptionGroup var options: ConfigurationOptions
        @Option(help: "The app's bundle id") var bundleId: String
        @OptionGroup var app: AppOptions
        @Option(help: "true: the app is retired; false: it is active again") var retired: Bool?
        @Option(help: "Comma-separated values to remove: app-apple-id, refund-preference, shared-secret, api-key, sku")
        var clear: String?

        func run() async throws {
            let id = try optionValue { try BundleID.option(bundleId) }
            var changes = try optionValue { try app.changes() }
            changes.retired = retired
            for name in (clear ?? "").split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !name.isEmpty {
                // A value both given and cleared is a contradiction, not a choice to make silently.
                func cleared<T>(_ value: inout T??, option: String) throws {
                    guard value == nil else { throw ValidationError("--clear \(name) and --\(option) contradict each other; give one") }
                    value = .some(nil)
                }
                switch name {
                case "app-apple-id": try cleared(&changes.appAppleId, option: "app-apple-id")
                case "refund-preference": try cleared(&changes.refundPreference, option: "refund-preference")
                case "shared-secret": try cleared(&changes.sharedSecret, option: "shared-secret")
                case "api-key": try cleared(&changes.apiKey, option: "key-id")
                case "sku": try cleared(&changes.sku, option: "sku")
                default: throw ValidationError("--clear names \(name); use app-apple-id, refund-preference, shared-secret, api-key or sku")
                }
            }
            let changed = changes
            let saved = try await withLedgerDatabase(options) { client, logger in
                try await AppCatalog(database: Database(client: client, logger: logger)).change(id, changed)
            }
            print(Apps.line(saved))
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the apps (never their secrets).")
        @OptionGroup var options: ConfigurationOptions

        func run() async throws {
            let apps = try await withLedgerDatabase(options) { client, logger in
                try await AppCatalog(database: Database(client: client, logger: logger)).list()
            }
            for app in apps { print(Apps.line(app)) }
        }
    }

    /// One app on one line, tab-separated: bundle id, Apple id, environments, key, shared
    /// secret, refund preference, what its tokens name, state, SKU.
    static func line(_ app: App) -> String {
        [
            app.bundleId.rawValue, app.appAppleId.map { "app-apple-id \($0)" } ?? "no app-apple-id",
            app.environments.map(\.rawValue).joined(separator: ","),
            app.apiKey.map { "api-key \($0.keyId) (\($0.privateKeyReference?.description ?? "stored"))" } ?? "no api-key",
            app.hasSharedSecret ? "shared-secret" : "no shared-secret", app.refundPreference?.rawValue ?? "no refund-preference",
            "app-account-tokens \(app.appAccountTokens.rawValue)", app.retired ? "retired" : "active",
            app.sku.map { "sku \($0)" } ?? "no sku",
        ].joined(separator: "\t")
    }
}

extension BundleID {
    /// A bundle id given as `--bundle-id`.
    static func option(_ text: String) throws -> BundleID {
        do { return try BundleID(text) } catch { throw LedgerInputError(field: "--bundle-id", problem: "is \(text); it \(error.problem)") }
    }
}
