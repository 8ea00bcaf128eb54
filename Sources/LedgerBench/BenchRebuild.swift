import ArgumentParser
import Foundation
import LedgerServer
import LedgerStore
import Logging
import PostgresNIO

/// `ledger-bench rebuild`: a log of about `--events` events (orders and orphan transactions,
/// bulk-loaded as the ledger writes them), then `projections rebuild` over all of it and a read of
/// the whole gap-safe feed in pages of 1,000; prints events per second for each.
struct BenchRebuild: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "rebuild", abstract: "Projection rebuild and gap-safe feed read over a large log.")

    @OptionGroup var options: BenchOptions
    @Option(help: "Events in the log (about)") var events = 1_000_000

    func run() async throws {
        let logger = benchLogger
        try await options.withBenchDatabase { bench in
            let (logged, rebuilt, rebuildSeconds, read, readSeconds) = try await withPostgresClient(bench, logger: logger) { client in
                let database = Database(client: client, logger: logger)
                // One event per open order (its stream) and one per orphan (its transaction stream).
                let orphans = events / 10
                try await BenchReconcile.load(orphans: orphans, orders: events - orphans, on: database)
                try await client.query("VACUUM ANALYZE", logger: logger)
                let logged = try await client.query("SELECT count(*)::int FROM events", logger: logger).collect().first!.decode(Int.self)

                let rebuildStart = ContinuousClock.now
                let rebuilt = try await ProjectionRebuilder(database: database).rebuild()
                let rebuildSeconds = (ContinuousClock.now - rebuildStart).inSeconds

                let store = EventStore(database: database)
                let readStart = ContinuousClock.now
                var after: Int64 = 0
                var read = 0
                while true {
                    let page = try await store.readAll(after: after, limit: 1000)
                    guard let last = page.last else { break }
                    read += page.count
                    after = last.position
                }
                return (logged, rebuilt, rebuildSeconds, read, (ContinuousClock.now - readStart).inSeconds)
            }
            print("Projection rebuild and gap-safe feed read over a log of \(logged) events")
            printTableHeader(["operation", "events", "seconds", "events/s"], leftAligned: [0])
            printTableRow(["`projections rebuild` (one transaction)", "\(rebuilt)", format(rebuildSeconds, decimals: 1), format(Double(rebuilt) / max(rebuildSeconds, 0.001))])
            printTableRow(["feed read, `readAll` pages of 1,000", "\(read)", format(readSeconds, decimals: 1), format(Double(read) / max(readSeconds, 0.001))])
        }
    }
}
