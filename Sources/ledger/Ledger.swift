// ledger: the shipped executable (serve and the operator's commands).

import ArgumentParser
import Foundation
import LedgerStore

/// The `ledger` command: the service and its operations.
@main
struct Ledger: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ledger",
        abstract: "Order Ledger: an event-sourced ledger of Apple in-app purchase orders.",
        subcommands: [Serve.self, Migrate.self, Keys.self, Projections.self, Reconcile.self, Unmatch.self, Lookup.self, Recover.self, Backfill.self, Products.self, Apps.self, Report.self, Import.self, Sales.self, Demo.self]
    )

    /// ArgumentParser's own, but a bad option's value found as the command runs is followed by
    /// that command's usage (not the root's), and a database's error is said as PostgreSQL said it.
    static func main() async {
        let parsed: any ParsableCommand
        do {
            parsed = try parseAsRoot()
        } catch {
            exit(withError: error)
        }
        do {
            var command = parsed
            if var command = command as? any AsyncParsableCommand {
                try await command.run()
            } else {
                try command.run()
            }
        } catch let error as ValidationError {
            let command = type(of: parsed)
            let name = ([Ledger.configuration.commandName ?? "ledger"] + path(to: command)).joined(separator: " ")
            FileHandle.standardError.write(Data(
                "Error: \(error.message)\nUsage: \(usageString(for: command))\n  See '\(name) --help' for more information.\n".utf8))
            Foundation.exit(ExitCode.validationFailure.rawValue)
        } catch {
            exit(withError: databaseErrorDescription(error).map(DatabaseFailure.init) ?? error)
        }
    }

    /// The names of the subcommands from the root down to `command`.
    static func path(to command: any ParsableCommand.Type, from root: any ParsableCommand.Type = Ledger.self) -> [String] {
        for sub in root.configuration.subcommands {
            let name = sub.configuration.commandName ?? "\(sub)".lowercased()
            if sub == command { return [name] }
            let below = path(to: command, from: sub)
            if !below.isEmpty { return [name] + below }
        }
        return []
    }
}

/// A database's error, as PostgreSQL said it.
struct DatabaseFailure: Error, CustomStringConvertible {
    let description: String
}
