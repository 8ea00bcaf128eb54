import Foundation
import PrivatePostgres
import LedgerTestSupport
import Logging
import PostgresNIO
import Testing

@Suite("The private PostgreSQL cluster", .serialized)
struct PrivateClusterTests {
    /// A cluster directory of its own inside the package (the postgres user must reach it).
    func clusterDirectory() throws -> String {
        let root = TestServer.scratchRoot.appendingPathComponent(".ledger-clusters")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        chmod(root.path, 0o755)
        return root.appendingPathComponent(String(UUID().uuidString.prefix(8))).path
    }

    func count(_ cluster: PrivateCluster) async throws -> Int {
        let connection = try await PostgresConnection.connect(
            configuration: .init(unixSocketPath: cluster.socketPath, username: PrivateCluster.user, password: nil, database: "postgres"),
            id: 1, logger: TestServer.logger)
        defer { Task { try? await connection.close() } }
        try await connection.query("CREATE TABLE IF NOT EXISTS marks (n int)", logger: TestServer.logger)
        try await connection.query("INSERT INTO marks VALUES (1)", logger: TestServer.logger)
        let rows = try await connection.query("SELECT count(*) FROM marks", logger: TestServer.logger)
        for try await n in rows.decode(Int.self) { return n }
        return 0
    }

    @Test("starts, is shared with a second process's start, stops, and is reused with its data")
    func lifecycle() async throws {
        let directory = try clusterDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cluster = PrivateCluster(directory: directory, durable: false)
        let owner = try await cluster.start(logger: TestServer.logger)
        #expect(owner.isOwner)
        #expect(try await count(cluster) == 1)

        // A second start while the owner runs joins it and does not stop it.
        let guest = try await cluster.start(logger: TestServer.logger)
        #expect(!guest.isOwner)
        try await guest.stop(logger: TestServer.logger)
        #expect(cluster.runningServerPID() != nil)

        try await owner.stop(logger: TestServer.logger)
        #expect(cluster.runningServerPID() == nil)

        let again = try await cluster.start(logger: TestServer.logger)
        #expect(again.isOwner)
        #expect(try await count(cluster) == 2, "the data of the first run is gone")
        try await again.stop(logger: TestServer.logger)
    }

    @Test("a stale pid file left by a crash does not block the next start")
    func stalePidFile() async throws {
        let directory = try clusterDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cluster = PrivateCluster(directory: directory, durable: false)
        try await cluster.start(logger: TestServer.logger).stop(logger: TestServer.logger)

        // A crash leaves postmaster.pid behind; its pid now belongs to a live, unrelated process
        // (this test process), which PostgreSQL itself would take for a running server.
        let pidFile = cluster.dataPath + "/postmaster.pid"
        let stale = "\(getpid())\n\(cluster.dataPath)\n1700000000\n5432\n\(cluster.socketDirectory)\n\n  5432001         0\nready   \n"
        try stale.write(toFile: pidFile, atomically: true, encoding: .utf8)
        try stale.write(toFile: cluster.socketPath + ".lock", atomically: true, encoding: .utf8)
        #expect(cluster.runningServerPID() == nil)

        let running = try await cluster.start(logger: TestServer.logger)
        #expect(try await count(cluster) == 1)
        try await running.stop(logger: TestServer.logger)
    }

    @Test("a pid file naming another cluster's postmaster, or a killed postmaster not yet reaped, is stale: the start leaves the other cluster running")
    func pidOfAnotherCluster() async throws {
        let (directory, otherDirectory) = (try clusterDirectory(), try clusterDirectory())
        defer { for path in [directory, otherDirectory] { try? FileManager.default.removeItem(atPath: path) } }
        let cluster = PrivateCluster(directory: directory, durable: false)
        try await cluster.start(logger: TestServer.logger).stop(logger: TestServer.logger)
        let other = PrivateCluster(directory: otherDirectory, durable: false)
        let otherRunning = try await other.start(logger: TestServer.logger)
        let otherPID = try #require(other.runningServerPID())

        // After a crash and a reboot, this folder's old pid is the other cluster's postmaster's.
        let stale = "\(otherPID)\n\(cluster.dataPath)\n1700000000\n5432\n\(cluster.socketDirectory)\n\n  5432001         0\nready   \n"
        try stale.write(toFile: cluster.dataPath + "/postmaster.pid", atomically: true, encoding: .utf8)
        #expect(cluster.runningServerPID() == nil)
        let running = try await cluster.start(logger: TestServer.logger)
        #expect(running.isOwner)
        #expect(try await count(cluster) == 1)
        try await running.stop(logger: TestServer.logger)
        #expect(other.runningServerPID() == otherPID && kill(otherPID, 0) == 0, "the other cluster still runs")
        #expect(try await count(other) == 1)
        try await otherRunning.stop(logger: TestServer.logger)

        // A postmaster killed a moment ago: a zombie named postgres until its parent reaps it.
        let program = directory + "/postgres"
        try FileManager.default.copyItem(atPath: "/bin/true", toPath: program)
        var pid: pid_t = 0
        let arguments: [UnsafeMutablePointer<CChar>?] = [strdup(program), nil]
        defer { arguments.forEach { free($0) } }
        #expect(posix_spawn(&pid, program, nil, nil, arguments, nil) == 0)
        var zombie = false
        for _ in 0..<200 where !zombie {
            zombie = (try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8))?.contains(") Z") == true
            if !zombie { try await Task.sleep(for: .milliseconds(10)) }
        }
        #expect(zombie, "the child ended and was not reaped")
        try "\(pid)\n\(cluster.dataPath)\n".write(toFile: cluster.dataPath + "/postmaster.pid", atomically: true, encoding: .utf8)
        #expect(cluster.runningServerPID() == nil)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
    }

    @Test("a data directory too long for a Unix socket is refused with a clear reason")
    func longPathIsRefused() async throws {
        let cluster = PrivateCluster(directory: "/tmp/" + String(repeating: "x", count: 120))
        do {
            _ = try await cluster.start(logger: TestServer.logger)
            Issue.record("started with an impossible socket path")
        } catch let error as PrivateClusterError {
            #expect(error.description.contains("LEDGER_DATA_DIR"))
        }
    }

    @Test("LEDGER_POSTGRES_BIN names the programs' folder or stops the start: a mistyped one never runs another PostgreSQL")
    func configuredBinaries() throws {
        let found = try PostgresBinaries.locate(environment: ["PATH": ProcessInfo.processInfo.environment["PATH"] ?? ""])
        #expect(try PostgresBinaries.locate(environment: ["LEDGER_POSTGRES_BIN": found.directory]).directory == found.directory)
        #expect(throws: PrivateClusterError.self) { try PostgresBinaries.locate(environment: ["LEDGER_POSTGRES_BIN": "/nope"]) }
        do {
            _ = try PostgresBinaries.locate(environment: ["LEDGER_POSTGRES_BIN": "/nope", "PATH": found.directory])
            Issue.record("a folder without the programs was passed over")
        } catch let error as PrivateClusterError {
            #expect(error.description.contains("LEDGER_POSTGRES_BIN is /nope"), "\(error)")
        }
    }
}

@Suite("The private PostgreSQL cluster: reachability")
struct PrivateClusterReachabilityTests {
    @Test("a data directory the postgres user cannot enter is refused with a clear reason", .enabled(if: geteuid() == 0))
    func unreachableDirectory() async throws {
        let hidden = "/tmp/ledger-private-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: hidden, withIntermediateDirectories: true)
        chmod(hidden, 0o700)
        defer { try? FileManager.default.removeItem(atPath: hidden) }
        let cluster = PrivateCluster(directory: hidden + "/data")
        #expect(!cluster.isReachableByServerAccount())
        do {
            _ = try await cluster.start(logger: TestServer.logger)
            Issue.record("started in a folder postgres cannot reach")
        } catch let error as PrivateClusterError {
            #expect(error.description.contains("cannot reach"))
        }
    }
}
