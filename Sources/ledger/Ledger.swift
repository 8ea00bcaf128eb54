// ledger: the shipped executable (serve and the operator's commands).

import ArgumentParser

/// The `ledger` command: the service and its operations.
@main
struct Ledger: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ledger",
        abstract: "Order Ledger: an event-sourced ledger of Apple in-app purchase orders.",
        subcommands: [Serve.self, Migrate.self, Keys.self, Projections.self, Reconcile.self, Unmatch.self, Lookup.self, Recover.self, Backfill.self, Products.self, Apps.self, Report.self, Import.self, Sales.self, Demo.self]
    )
}
