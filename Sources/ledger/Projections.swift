import ArgumentParser
import Foundation
import LedgerServer
import LedgerStore

/// `ledger projections rebuild|verify`.
struct Projections: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Rebuild the projections from the event log, or verify them against a rebuild.",
        subcommands: [Rebuild.self, Verify.self]
    )

    /// Progress on standard error, only when it is a terminal.
    static var progress: (@Sendable (Int, Int) -> Void)? {
        guard isatty(STDERR_FILENO) == 1 else { return nil }
        return { @Sendable (read: Int, total: Int) in
            let percent = total > 0 ? read * 100 / total : 100
            FileHandle.standardError.write(Data("\r\(read) of \(total) events (\(percent)%)".utf8))
            if read >= total { FileHandle.standardError.write(Data("\n".utf8)) }
        }
    }

    struct Rebuild: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Empty the projections and replay the log into them.")
        @OptionGroup var options: ConfigurationOptions

        func run() async throws {
            let events = try await withLedgerDatabase(options) { client, logger in
                try await ProjectionRebuilder(database: Database(client: client, logger: logger), progress: Projections.progress).rebuild()
            }
            print("rebuilt the projections from \(events) events")
        }
    }

    struct Verify: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Rebuild into a scratch schema and compare row for row; non-zero on any difference.")
        @OptionGroup var options: ConfigurationOptions

        func run() async throws {
            let differences = try await withLedgerDatabase(options) { client, logger in
                try await ProjectionRebuilder(database: Database(client: client, logger: logger), progress: Projections.progress).verify()
            }
            for line in differences { print(line) }
            guard differences.isEmpty else {
                throw CommandFailure("the projections differ from a rebuild in \(differences.count) rows; `ledger projections rebuild` restores them")
            }
            print("the projections equal a rebuild from the log")
        }
    }
}

/// A command that failed for a reason that is not a usage mistake: printed as one line.
struct CommandFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
