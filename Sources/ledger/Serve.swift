import ArgumentParser
import LedgerServer
import Logging
import LedgerStore
import PostgresNIO

/// `ledger serve`: migrate, then serve HTTP until SIGTERM or SIGINT.
struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Migrate the database, then serve the HTTP API.")

    @OptionGroup var options: ConfigurationOptions

    func run() async throws {
        let configuration = try options.load()
        let logger = Logger(label: "ledger")
        // The Apple roots are read before anything starts: a bad file stops here, not later.
        _ = try configuration.apple.verifier(logger: logger)
        let database = try await OpenedDatabase.open(configuration.database, logger: logger)
        let client = PostgresClient(configuration: database.clientConfiguration, backgroundLogger: logger)
        do {
            let application = try buildApplication(configuration: configuration, client: client, logger: logger)
            try await application.runService()
        } catch {
            try? database.close(logger: logger)
            throw error
        }
        try database.close(logger: logger)
    }
}
