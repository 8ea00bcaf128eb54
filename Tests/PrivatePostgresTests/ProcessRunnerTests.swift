import Foundation
import LedgerTestSupport
import PrivatePostgres
import Testing

@Suite("Running PostgreSQL's programs")
struct ProcessRunnerTests {
    /// A folder of its own (removed by the caller) and a runner working there.
    static func scratch() throws -> (URL, ProcessRunner) {
        let folder = TestServer.scratchRoot.appendingPathComponent(".ledger-runner-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        return (folder, ProcessRunner(workingDirectory: folder))
    }

    /// Swift's task pool has a thread per core. Each command here waits until this task has seen
    /// every one of them start, so a run that held a thread while its command ran would leave this
    /// task no thread to look with: the commands would give up and end with status 1.
    @Test("a command's run holds no thread: more commands than cores, waiting on this task, all end well")
    func runsHoldNoThread() async throws {
        let (folder, runner) = try Self.scratch()
        defer { try? FileManager.default.removeItem(at: folder) }
        let commands = ProcessInfo.processInfo.activeProcessorCount + 1
        let go = folder.appendingPathComponent("go").path
        let script = "touch started-$0; i=0; while [ ! -f '\(go)' ]; do i=$((i+1)); [ $i -gt 1200 ] && exit 1; sleep 0.05; done"

        let statuses = try await withThrowingTaskGroup(of: Int32.self) { group in
            for index in 0..<commands {
                group.addTask { try await runner.run("/bin/sh", ["-c", script, "\(index)"]).status }
            }
            let started = { (0..<commands).allSatisfy { FileManager.default.fileExists(atPath: folder.appendingPathComponent("started-\($0)").path) } }
            while !started() { try await Task.sleep(for: .milliseconds(20)) }
            FileManager.default.createFile(atPath: go, contents: nil)
            return try await group.reduce(into: [Int32]()) { $0.append($1) }
        }
        #expect(statuses == Array(repeating: 0, count: commands))
    }

    /// An initdb stopped half way is of no use: a cancelled caller still gets the command's end.
    @Test("a cancelled caller's run waits for the command to end and answers its status and output")
    func cancelledRunEnds() async throws {
        let (folder, runner) = try Self.scratch()
        defer { try? FileManager.default.removeItem(at: folder) }
        let run = Task { try await runner.run("/bin/sh", ["-c", "sleep 0.3; echo done; exit 3"]) }
        run.cancel()
        let outcome = try await run.value
        #expect(outcome.status == 3)
        #expect(outcome.output == "done")
    }
}
