import ArgumentParser
import Foundation
import LedgerCore
import LedgerJSON
import LedgerServer
import LedgerStore

/// `ledger keys`: API keys.
struct Keys: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create, list and revoke API keys.",
        subcommands: [Create.self, List.self, Revoke.self]
    )

    /// `ledger keys create --name N --scopes append,read,admin [--apps A,B]`: prints the key alone
    /// on stdout.
    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create a key and print it (only its hash is stored).")

        @OptionGroup var options: ConfigurationOptions
        @Option(help: "A name for the key, recorded with every event appended with it")
        var name: String
        @Option(help: "Comma-separated scopes: append, read, admin (admin includes the others)")
        var scopes: String
        @Option(help: "Comma-separated bundle ids of the apps the key may reach (default: every app, those added later too)")
        var apps: String?

        func run() async throws {
            var parsed = Set<APIScope>()
            for text in scopes.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !text.isEmpty {
                guard let scope = APIScope(rawValue: text) else {
                    throw ValidationError("unknown scope \(text); use append, read or admin")
                }
                parsed.insert(scope)
            }
            let apps = try self.apps.map { list in
                let names = list.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
                guard !names.isEmpty else { throw ValidationError("--apps names no app; leave it out for a key of every app") }
                return try names.map { name in
                    do { return try BundleID(name) } catch { throw ValidationError("--apps: \(name) is not a bundle id: \(error)") }
                }
            }
            guard !parsed.isEmpty else { throw ValidationError("--scopes names no scope; use append, read or admin") }
            // Checked before the database is opened: a usage error, as the other options' are.
            guard APIKeyStore.usableName(name) else { throw ValidationError("--name: \(APIKeyError.invalidName.description)") }
            let name = self.name
            let scopes = parsed
            do {
                let key = try await withLedgerDatabase(options) { client, logger in
                    try await APIKeyStore(database: Database(client: client, logger: logger)).create(name: name, scopes: scopes, apps: apps)
                }
                print(key)
            } catch let error as APIKeyError {
                throw CommandFailure(error.description)
            }
        }
    }

    /// `ledger keys list`.
    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the keys (names, scopes and apps, never the keys).")

        @OptionGroup var options: ConfigurationOptions

        func run() async throws {
            let keys = try await withLedgerDatabase(options) { client, logger in
                try await APIKeyStore(database: Database(client: client, logger: logger)).list()
            }
            for key in keys {
                let scopes = key.scopes.map(\.rawValue).sorted().joined(separator: ",")
                let state = key.revokedAt.map { "revoked \(EventCoding.formatDate($0))" } ?? "active"
                let apps = key.apps.map { "apps " + $0.map(\.rawValue).joined(separator: ",") } ?? "every app"
                print("\(key.name)\t\(scopes)\t\(apps)\tcreated \(EventCoding.formatDate(key.createdAt))\t\(state)")
            }
        }
    }

    /// `ledger keys revoke --name N`.
    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Revoke a key: it is refused from then on.")

        @OptionGroup var options: ConfigurationOptions
        @Option(help: "The key's name")
        var name: String

        func run() async throws {
            let name = self.name
            let revoked = try await withLedgerDatabase(options) { client, logger in
                try await APIKeyStore(database: Database(client: client, logger: logger)).revoke(name: name)
            }
            guard revoked else { throw CommandFailure("no active key is named \(name)") }
            print("revoked \(name)")
        }
    }
}
