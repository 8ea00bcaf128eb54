import ArgumentParser
import LedgerServer
import Logging
import LedgerStore
import NIOPosix
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
        // The connections get an event loop of their own, where the group-commit writer runs too.
        let loop = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let client = PostgresClient(configuration: database.clientConfiguration, eventLoopGroup: loop, backgroundLogger: logger)
        do {
            let application = try buildApplication(
                configuration: configuration, client: client, probing: database.connectionConfiguration, logger: logger, writerExecutor: EventLoopTaskExecutor(loop.next()))
            try await application.runService()
        } catch {
            try? await loop.shutdownGracefully()
            try? database.close(logger: logger)
            throw error
        }
        try await loop.shutdownGracefully()
        try database.close(logger: logger)
    }
}
