import ArgumentParser
import Foundation
import LedgerCore
import LedgerJSON
import LedgerServer
import LedgerServices
import LedgerStore

/// `ledger import FILE…`: a team's history into the ledger (docs/import.md), with a progress bar
/// on a terminal and a summary. Exits 2 when a line was refused (each is listed), 65 when a file
/// as a whole was (then nothing is imported).
struct Import: AsyncParsableCommand {
    /// The exit status when a file cannot be read as a whole (sysexits' EX_DATAERR).
    static let fileRefused: Int32 = 65

    static let configuration = CommandConfiguration(
        abstract: "Import a team's history: orders with their final state and granted Apple transactions (CSV or JSON Lines).")
    @OptionGroup var options: ConfigurationOptions
    @Argument(help: "Files to import: .csv (with a header) or .jsonl / .ndjson; docs/import.md names the columns")
    var files: [String]

    func run() async throws {
        var inputs: [(name: String, file: HistoryFile, lines: Int)] = []
        for path in files {
            guard let format = HistoryFile.Format(path: path) else {
                throw ValidationError("\(path) is neither .csv nor .jsonl / .ndjson")
            }
            guard let data = FileManager.default.contents(atPath: path) else { throw ValidationError("\(path) is missing or unreadable") }
            do {
                let file = try HistoryFile(data, format: format)
                inputs.append((path, file, data.reduce(0) { $1 == UInt8(ascii: "\n") ? $0 + 1 : $0 } + (data.last == UInt8(ascii: "\n") ? 0 : 1)))
            } catch {
                // The file as a whole (its CSV header): nothing of any file is imported.
                FileHandle.standardError.write(Data("Error: \(path): \(error); nothing was imported\n".utf8))
                throw ExitCode(Self.fileRefused)
            }
        }
        let chosen = inputs
        let allowance = try options.configuration().reconciler.clockSkew
        let summaries = try await withLedgerDatabase(options) { client, logger in
            let orders = ServiceAssembly(database: Database(client: client, logger: logger), purchaseAllowance: allowance).orders
            let history = HistoryImport(orders: orders)
            var summaries: [(String, HistoryImport.Summary)] = []
            for input in chosen {
                let bar = ProgressBar(name: URL(fileURLWithPath: input.name).lastPathComponent, total: max(1, input.lines - (input.file.format == .csv ? 1 : 0)))
                let summary = try await history.run(input.file.lines, source: URL(fileURLWithPath: input.name).lastPathComponent, progress: bar?.show)
                bar?.end()
                summaries.append((input.name, summary))
            }
            if summaries.contains(where: { $0.1.imported > 0 }) {
                // The import has committed: a failed ANALYZE is told, never in place of its summary.
                do { try await orders.analyzeImported() } catch {
                    FileHandle.standardError.write(Data(
                        "Warning: ANALYZE after the import failed (\(databaseErrorDescription(error) ?? "\(error)")); autovacuum will analyse the tables later\n".utf8))
                }
            }
            return summaries
        }
        var refused = false
        for (name, summary) in summaries {
            print("\(name): read \(summary.read), imported \(summary.imported), already present \(summary.alreadyPresent), refused \(summary.refused)")
            for refusal in summary.refusals { print("  line \(refusal.line): \(refusal.code): \(refusal.message)") }
            if summary.refused > summary.refusals.count { print("  … and \(summary.refused - summary.refusals.count) more refused lines") }
            refused = refused || summary.refused > 0
        }
        if refused { throw ExitCode(2) }
    }
}

/// A progress bar on standard error, only when it is a terminal: lines, lines per second and the
/// time left.
final class ProgressBar: Sendable {
    let name: String
    let total: Int
    let started = ContinuousClock.now

    init?(name: String, total: Int) {
        guard isatty(STDERR_FILENO) == 1 else { return nil }
        self.name = name
        self.total = total
    }

    @Sendable func show(_ done: Int) {
        let seconds = max(0.001, (ContinuousClock.now - started) / .seconds(1))
        let rate = Double(done) / seconds
        let left = rate > 0 ? Double(max(0, total - done)) / rate : 0
        let width = 30
        let filled = min(width, done * width / max(1, total))
        let bar = String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled)
        let text = "\r\(name) [\(bar)] \(done)/\(total) lines, \(Int(rate)) lines/s, \(Int(left.rounded())) s left "
        FileHandle.standardError.write(Data(text.utf8))
    }

    func end() {
        FileHandle.standardError.write(Data("\n".utf8))
    }
}
