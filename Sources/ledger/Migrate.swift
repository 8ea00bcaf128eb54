import ArgumentParser
import LedgerServer
import LedgerStore
import Logging
import PostgresNIO

/// `ledger migrate`: apply pending migrations and exit.
struct Migrate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Apply the pending SQL migrations.")

    @OptionGroup var options: ConfigurationOptions

    func run() async throws {
        let applied = try await withLedgerDatabase(options, migrate: false) { client, logger in
            try await Migrator(logger: logger).migrate(client)
        }
        print(applied.isEmpty ? "migrations are current" : "applied: \(applied.joined(separator: ", "))")
    }
}

/// Opens the configured database (starting the private cluster when no URL is set), applies
/// pending migrations unless asked not to (and then records the configured app), runs `body`,
/// and closes everything again.
func withLedgerDatabase<Result: Sendable>(
    _ options: ConfigurationOptions, migrate: Bool = true, _ body: @Sendable (PostgresClient, Logger) async throws -> Result
) async throws -> Result {
    let configuration = try options.load()
    // One-off commands keep stdout for their answer and log only warnings unless asked for more.
    var quiet = Logger(label: "ledger")
    let asked = options.values()[LedgerConfiguration.Key.logLevel] != nil
    quiet.logLevel = asked ? configuration.logLevel : .warning
    let logger = quiet
    // The app the LEDGER_APPLE_* settings describe, created or updated as `ledger serve` does.
    let configuredApp = migrate ? try configuration.apple.configuredApp() : nil
    let database = try await OpenedDatabase.open(configuration.database, logger: logger)
    defer { try? database.close(logger: logger) }
    if let problem = await database.firstConnectionProblem(logger: logger) { throw CommandFailure(problem) }
    return try await withPostgresClient(database.clientConfiguration, logger: logger) { client in
        if migrate { try await Migrator(logger: logger).migrate(client) }
        if let configuredApp { try await configuredApp.record(in: AppCatalog(database: Database(client: client, logger: logger)), logger: logger) }
        return try await body(client, logger)
    }
}
