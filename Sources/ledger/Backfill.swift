import AppleReceipts
import ArgumentParser
import Foundation
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore

/// `ledger backfill notifications|refunds`: what Apple said while the ledger was not listening
/// (App Store Server API), through the paths live notifications take.
struct Backfill: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Take in the notifications and refunds Apple sent while the ledger was not listening (App Store Server API).",
        subcommands: [Notifications.self, Refunds.self])

    struct Notifications: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Apply Apple's notification history (at most 180 days back in production, 30 in the sandbox) from the last notification recorded, or --since; a stopped backfill resumes.")
        @OptionGroup var options: ConfigurationOptions
        @Option(help: "Start here instead: a day (2026-11-01, midnight UTC) or an ISO 8601 time (2026-11-01T12:00:00Z); Apple keeps 180 days (30 in the sandbox)") var since: String?

        func run() async throws {
            let start = try since.map { text in
                let date: Date
                do { date = try ReportPeriod.date(text, field: "--since") } catch { throw ValidationError("\(error)") }
                // Apple's history ends now: a start after it is a mistake (a year typed wrong), not an empty backfill.
                guard date <= Date() else { throw ValidationError("--since is \(text), after now: Apple's history ends now") }
                return date
            }
            let metadata = try operatorMetadata("backfill notifications")
            let progress = terminalProgress("notifications").map { report in { @Sendable (seen: Int) in report(seen, seen + 1) } }
            // One backfill per app with a key and environment it accepts, each from its own position.
            // One's failure (Apple away for that app or environment) leaves the others to run.
            let (summaries, failures) = try await withAppleWork(options) { work in
                var summaries: [(String, NotificationBackfill.Summary)] = []
                var failures: [String] = []
                for backfill in try await work.services.notificationBackfills(api: work.api, verifier: work.verifier) {
                    let name = "\(backfill.app?.rawValue ?? "the first app") (\(backfill.environment.rawValue))"
                    do {
                        summaries.append((name, try await backfill.run(since: start, metadata: metadata, progress: progress)))
                    } catch let error where !(error is CancellationError) {
                        print("\(name): failed, \(error); the next run resumes where it stopped")
                        failures.append(name)
                    }
                }
                return (summaries, failures)
            }
            var refusals: [String] = []
            for (name, summary) in summaries {
                if summary.busy {
                    print("\(name): another server is running its notification backfill, or a run stopped part way still holds it (at most 10 minutes); try again later")
                    continue
                }
                let dates = [summary.startDate, summary.endDate].map { $0.map { ISO8601DateFormatter().string(from: $0) } ?? "-" }
                // Stopped by Apple's refusal: what it read before, not a history read.
                let read = summary.refusal == nil ? (summary.resumed ? "resumed" : "read") : "stopped by Apple's refusal, having read"
                print("\(name): \(read) Apple's notification history from \(dates[0]) to \(dates[1]): \(summary.pages) pages, \(summary.notifications) notifications")
                print("applied \(summary.applied) new to the ledger; \(summary.repeated) applied before; \(summary.refused) refused by verification")
                if let reason = summary.restarted {
                    print("Apple refused the stored position (\(reason)): started again from \(dates[0])")
                }
                if let refusal = summary.refusal { refusals.append("\(name): Apple refused the request (\(refusal))") }
            }
            if summaries.contains(where: { $0.1.busy }) && summaries.allSatisfy({ $0.1.busy }) {
                throw CommandFailure("another server is running the notification backfill, or a run stopped part way still holds it (at most 10 minutes); try again later")
            }
            if !refusals.isEmpty {
                // The others that failed, named too: the one line says every backfill that did not end.
                let failed = failures.isEmpty ? "" : "; \(failures.count) more failed (\(failures.joined(separator: ", "))) and resume where they stopped"
                throw CommandFailure("stopped: \(refusals.joined(separator: "; ")); the next run asks afresh instead of repeating it\(failed)")
            }
            if !failures.isEmpty {
                throw CommandFailure("\(failures.count) of \(failures.count + summaries.count) backfills failed (\(failures.joined(separator: ", "))); the others ran")
            }
        }
    }

    struct Refunds: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Read the refund history of the accounts with transactions granted in the last LEDGER_REFUND_LOOKBACK days and apply refunds the ledger missed.")
        @OptionGroup var options: ConfigurationOptions
        @Flag(help: "Read every account in the look-back, also those read in the last day") var all = false

        func run() async throws {
            let metadata = try operatorMetadata("backfill refunds")
            let progress = terminalProgress("Apple accounts")
            let summary = try await withAppleWork(options) { work in
                try await work.configuration.refundCatchUp(work.services, api: work.api, verifier: work.verifier)
                    .run(all: all, metadata: metadata, progress: progress)
            }
            print("read the refund history of \(summary.accounts) Apple accounts: \(summary.pages) pages, \(summary.transactions) refunded transactions")
            print("applied \(summary.applied) refunds new to the ledger; \(summary.known) recorded before; \(summary.refused) refused by verification")
            if summary.busy > 0 { print("\(summary.busy) accounts left to another server reading them") }
            if summary.unknownClaims > 0 {
                print("\(summary.unknownClaims) accounts not read: Apple does not know the transaction a backend claimed for an order (logged)")
            }
            if summary.failed > 0 {
                let why = summary.failures.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
                throw CommandFailure("\(summary.failed) accounts could not be read (\(why)); the next run starts them where this one stopped")
            }
        }
    }
}
