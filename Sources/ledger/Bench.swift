import ArgumentParser

/// `ledger bench`: measurements printed next to a baseline measured in the same run.
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run benchmarks against a pgbench baseline measured in the same run.",
        subcommands: [BenchAppend.self, BenchHTTP.self, BenchReceipts.self, BenchRebuild.self, BenchReconcile.self]
    )
}
