import AsyncHTTPClient
import Foundation
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A `ledger` process started from the build the tests came with: the fault tests kill it and
/// start it again, which an in-process server cannot show.
final class LedgerChild: @unchecked Sendable {
    let process: Process
    let log: URL

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
    /// its output going to `log`.
    init(_ arguments: [String], environment: [String: String], log: URL) throws {
        process = Process()
        process.executableURL = try Self.executable()
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        FileManager.default.createFile(atPath: log.path, contents: nil)
        let handle = try FileHandle(forWritingTo: log)
        handle.seekToEndOfFile()
        process.standardOutput = handle
        process.standardError = handle
        self.log = log
        try process.run()
    }

    var isRunning: Bool { process.isRunning }

    func kill(_ signal: Int32) {
        Glibc.kill(process.processIdentifier, signal)
    }

    /// Waits for the process to end (at most `seconds`), answering its exit status.
    func wait(seconds: Double = 30) async throws -> Int32 {
        let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        while process.isRunning {
            guard ContinuousClock.now < deadline else { throw FaultTestError("ledger \(process.arguments ?? []) did not end within \(seconds) s") }
            try await Task.sleep(for: .milliseconds(50))
        }
        return process.terminationStatus
    }

    /// SIGTERM, then the exit status; SIGKILL (and an error) when it does not end in 30 s.
    func stop() async throws -> Int32 {
        if process.isRunning { kill(SIGTERM) }
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
        let status = try await child.wait(seconds: 300)
        return (status, child.logText())
    }

    /// A TCP port that was free a moment ago on 127.0.0.1.
    static func freePort() throws -> Int {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw FaultTestError("cannot open a socket") }
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) == 0 && getsockname(descriptor, $0, &length) == 0 }
        }
        guard bound else { throw FaultTestError("cannot find a free port") }
        return Int(UInt16(bigEndian: address.sin_port))
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
