import AsyncHTTPClient
import Foundation
import LedgerStore
import PostgresNIO
import PrivatePostgres

/// A `ledger serve` child process (`server`: the ledger executable) on the benchmark database,
/// for the HTTP benchmarks: started with the settings they add, driven through a keep-alive
/// client once ready, then stopped; answers what the benchmark measured and the server's peak
/// resident set (KiB).
enum BenchServerChild {
    static func run<Result>(
        server path: String, database: PostgresClient.Configuration, work: URL, environment extra: [String: String] = [:],
        _ drive: (HTTPClient, _ base: String, _ server: pid_t) async throws -> Result
    ) async throws -> (Result, peakRSSKiB: Int) {
        let port = try ProcessRunner.freeLocalPort()
        var environment = [
            "LEDGER_DATABASE_URL": database.url, "LEDGER_PORT": "\(port)",
            "LEDGER_HOST": "127.0.0.1", "LEDGER_LOG_LEVEL": "warning",
            // No background reconciler: its passes would land in the measurements (bench http
            // measures pgbench while this server is up).
            "LEDGER_RECONCILE_INTERVAL": "0",
        ]
        environment.merge(extra) { $1 }
        let log = work.appendingPathComponent("server.log")
        let server = try ProcessRunner(workingDirectory: work).spawn(path, ["serve"], outputPath: log.path, environment: environment)
        var settings = HTTPClient.Configuration()
        // AsyncHTTPClient keeps 8 connections per host unless told otherwise: 32 clients would
        // share 8 connections, and the server would see 8.
        settings.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 256)
        settings.httpVersion = .http1Only
        let client = HTTPClient(eventLoopGroupProvider: .singleton, configuration: settings)
        defer { _ = client.shutdown() }
        let result: Result
        do {
            let base = "http://127.0.0.1:\(port)"
            try await BenchHTTP.waitUntilReady(client, base, server: server, log: log)
            result = try await drive(client, base, server)
        } catch {
            kill(server, SIGKILL)
            _ = try? ProcessRunner.wait(for: server)
            throw error
        }
        let peakRSS = BenchHTTP.peakRSSKiB(of: server)
        kill(server, SIGTERM)
        _ = try ProcessRunner.wait(for: server)
        return (result, peakRSS)
    }

    /// A scratch folder for one benchmark's files (server log, pgbench script, roots).
    static func workDirectory(_ name: String) throws -> URL {
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-bench-\(name)-\(getpid())")
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        return work
    }
}
