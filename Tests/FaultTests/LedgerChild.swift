import AsyncHTTPClient
import Foundation
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import PrivatePostgres
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A `ledger` process started from the build the tests came with: the fault tests kill it and
/// start it again, which an in-process server cannot show.
final class LedgerChild: Sendable {
    let pid: pid_t
    let log: URL
    /// The exit status once the process has ended and been reaped.
    private let ended = Mutex<Int32?>(nil)

    /// The `ledger` executable next to the test bundle (`swift build --build-tests` builds it).
    static func executable() throws -> URL {
        let folder = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
        for candidate in [folder.appendingPathComponent("ledger"), TestServer.packageRoot.appendingPathComponent(".build/debug/ledger")]
        where FileManager.default.isExecutableFile(atPath: candidate.path) {
            return candidate
        }
        throw FaultTestError("the ledger executable is not built next to the tests (\(folder.path)); run `swift build --build-tests` first")
    }

    /// Runs `ledger <arguments>` with the environment given (added to this process's own),
    /// its output appended to `log`.
    init(_ arguments: [String], environment: [String: String], log: URL) throws {
        self.log = log
        pid = try ProcessRunner(workingDirectory: log.deletingLastPathComponent())
            .spawn(Self.executable().path, arguments, outputPath: log.path, environment: environment)
    }

    /// The exit status, or nil while the process runs.
    private func exitStatus() throws -> Int32? {
        try ended.withLock { ended in
            if ended == nil { ended = try ProcessRunner.exitStatus(ofEnded: pid) }
            return ended
        }
    }

    var isRunning: Bool { (try? exitStatus()) == nil }

    func kill(_ signal: Int32) {
        // Never signal a pid that was reaped: it may belong to another process by now.
        if isRunning { Glibc.kill(pid, signal) }
    }

    /// Waits for the process to end (at most `seconds`), answering its exit status.
    func wait(seconds: Double = 30) async throws -> Int32 {
        let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        while true {
            if let status = try exitStatus() { return status }
            guard ContinuousClock.now < deadline else { throw FaultTestError("ledger (pid \(pid)) did not end within \(seconds) s") }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    /// SIGTERM, then the exit status; SIGKILL (and an error) when it does not end in 30 s.
    func stop() async throws -> Int32 {
        kill(SIGTERM)
        do {
            return try await wait()
        } catch {
            kill(SIGKILL)
            _ = try? await wait()
            throw FaultTestError("\(error); its log:\n\(logText().suffix(6000))")
        }
    }

    func logText() -> String {
        (try? String(contentsOf: log, encoding: .utf8)) ?? ""
    }

    /// Runs a `ledger` command to its end and answers its exit status and output.
    static func run(_ arguments: [String], environment: [String: String], log: URL) async throws -> (Int32, String) {
        let child = try LedgerChild(arguments, environment: environment, log: log)
        do {
            return (try await child.wait(seconds: 300), child.logText())
        } catch {
            // SIGQUIT: Swift's backtracer writes every thread's stack into the log.
            child.kill(SIGQUIT)
            if (try? await child.wait(seconds: 60)) == nil { child.kill(SIGKILL) }
            throw FaultTestError("\(error); its output (all of it in \(log.path)):\n\(child.logText().prefix(12000))")
        }
    }
}

/// Ends a fault test's server and HTTP client. After a failure: both stopped as far as they can
/// be, the server's log recorded, the failure rethrown. Otherwise the server must exit 0 on SIGTERM.
func shutDown(_ server: LedgerChild, _ client: HTTPClient, after failure: (any Error)? = nil) async throws {
    if let failure {
        _ = try? await server.stop()
        try? await client.shutdown()
        Issue.record("server log:\n\(server.logText().suffix(4000))")
        throw failure
    }
    try await client.shutdown()
    let exit = try await server.stop()
    #expect(exit == 0, "ledger serve ended with \(exit) on SIGTERM:\n\(server.logText().suffix(4000))")
}

struct FaultTestError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
