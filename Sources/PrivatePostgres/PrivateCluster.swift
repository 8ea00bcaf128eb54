// PrivatePostgres: the private PostgreSQL cluster started when no database is configured.

import Foundation
import Logging
import PostgresNIO

#if canImport(Glibc)
import Glibc
#endif

/// A PostgreSQL cluster of the ledger's own under a data directory, used when no database URL is
/// configured: created on first use, started on a Unix socket inside the directory (no TCP),
/// reused on the next start, and stopped by the process that owns it.
///
/// Ownership: the first process to start the cluster holds `owner.lock` (a `flock`, released by
/// the kernel if the process dies) and stops the cluster when it stops. Other processes that find
/// the cluster owned just connect. A cluster left running by a crashed owner is adopted.
public struct PrivateCluster: Sendable {
    /// Socket name suffix; no TCP port is opened.
    public static let port = 5432
    public static let user = "ledger"
    public static let database = "ledger"

    public let directory: URL
    /// False for test clusters: fsync and synchronous commit off, faster and not crash-safe.
    public let durable: Bool

    public init(directory: String, durable: Bool = true) {
        let url = URL(fileURLWithPath: directory, relativeTo: URL(fileURLWithPath: FileManager.default.currentDirectoryPath))
        self.directory = url.standardizedFileURL
        self.durable = durable
    }

    public var dataPath: String { directory.appendingPathComponent("pgdata").path }
    public var socketDirectory: String { directory.appendingPathComponent("run").path }
    public var socketPath: String { socketDirectory + "/.s.PGSQL.\(Self.port)" }
    public var logPath: String { directory.appendingPathComponent("postgresql.log").path }

    /// The command that opens a shell on the cluster's ledger database.
    public func psqlCommand(database: String = PrivateCluster.database) -> String {
        "psql -h '\(socketDirectory)' -p \(Self.port) -U \(Self.user) \(database)"
    }

    /// How postgres-nio reaches the cluster.
    public func clientConfiguration(database: String = PrivateCluster.database) -> PostgresClient.Configuration {
        PostgresClient.Configuration(unixSocketPath: socketPath, username: Self.user, password: nil, database: database)
    }

    /// Initialises (first time), starts or adopts the cluster. The ledger's database in it is made
    /// by whoever opens it (`ensureDatabaseExists` in LedgerStore): this module holds no SQL.
    public func start(logger: Logger) async throws -> RunningPrivateCluster {
        guard socketPath.utf8.count < 108 else {
            throw PrivateClusterError("the data directory \(directory.path) is too long for a Unix socket path; set LEDGER_DATA_DIR to a shorter one")
        }
        let binaries = try PostgresBinaries.locate()
        let account = try SystemAccount.forPostgres()
        guard isReachable(by: account) else {
            throw PrivateClusterError("the postgres user cannot reach \(directory.path): a parent folder is not searchable by it; set LEDGER_DATA_DIR to a folder under one it can enter (such as /var/tmp)")
        }
        try prepareDirectory(account: account)

        let startLock = try FileLock(path: directory.appendingPathComponent("start.lock").path)
        // Asked again rather than waited for: a thread of the task pool is not ours to block.
        while try !startLock.lock(wait: false) {
            try await Task.sleep(for: .milliseconds(50))
        }
        defer { startLock.unlock() }
        let ownerLock = try FileLock(path: directory.appendingPathComponent("owner.lock").path)
        var owns = try ownerLock.lock(wait: false)
        // Held while no PostgreSQL runs: the owner is stopping, or a child this process spawned
        // has a copy of the owner's descriptor until it execs (a moment, longer on a loaded
        // machine). Either lets go soon; a live owner's server runs.
        var tries = 0
        while !owns, runningServerPID() == nil, tries < 50 {
            tries += 1
            try await Task.sleep(for: .milliseconds(100))
            owns = try ownerLock.lock(wait: false)
        }
        let runner = ProcessRunner(user: account.runAs, workingDirectory: directory)

        if owns {
            try await initialiseIfNeeded(binaries: binaries, runner: runner, account: account, logger: logger)
            try writeSettings(account: account)
            if let pid = runningServerPID() {
                logger.info("adopting the private PostgreSQL left running", metadata: ["pg.pid": "\(pid)"])
            } else {
                removeStaleLockFiles(logger: logger)
                let outcome = try await runner.run(binaries.pgCtl, ["-D", dataPath, "-l", logPath, "-w", "-t", "60", "start"])
                guard outcome.status == 0 else {
                    throw PrivateClusterError("pg_ctl start failed (\(outcome.status)): \(outcome.output); see \(logPath)")
                }
            }
        } else {
            ownerLock.close()
            guard runningServerPID() != nil else {
                throw PrivateClusterError("another ledger process owns \(directory.path) but its PostgreSQL is not running")
            }
        }
        let running = RunningPrivateCluster(cluster: self, binaries: binaries, runner: runner, ownerLock: owns ? ownerLock : nil)
        do {
            try await waitUntilReady(logger: logger)
        } catch {
            try? await running.stop(logger: logger)
            throw error
        }
        logger.info(
            "private PostgreSQL ready",
            metadata: ["pg.data": "\(dataPath)", "pg.log": "\(logPath)", "pg.psql": "\(psqlCommand())"]
        )
        return running
    }

    /// True when the account that runs PostgreSQL can enter every folder above the data directory.
    public func isReachableByServerAccount() -> Bool {
        guard let account = try? SystemAccount.forPostgres() else { return false }
        return isReachable(by: account)
    }

    private func isReachable(by account: SystemAccount) -> Bool {
        guard account.runAs != nil else { return true }
        var folder = directory.deletingLastPathComponent()
        while true {
            var info = stat()
            if stat(folder.path, &info) == 0 {
                let mode = info.st_mode
                let searchable = (info.st_uid == account.uid && mode & S_IXUSR != 0)
                    || (info.st_gid == account.gid && mode & S_IXGRP != 0) || mode & S_IXOTH != 0
                guard searchable else { return false }
            }
            if folder.path == "/" { return true }
            folder = folder.deletingLastPathComponent()
        }
    }

    private func prepareDirectory(account: SystemAccount) throws {
        var isFolder: ObjCBool = false
        if FileManager.default.fileExists(atPath: directory.path, isDirectory: &isFolder), !isFolder.boolValue {
            throw PrivateClusterError("the data directory \(directory.path) (LEDGER_DATA_DIR, --data-dir) is a file, not a folder")
        }
        do {
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        } catch {
            // The system's reason, asked again (Foundation's says "the file doesn't exist").
            let reason = mkdir(directory.path, 0o700) == 0 ? "\(error)" : String(cString: strerror(errno))
            throw PrivateClusterError("the data directory \(directory.path) (LEDGER_DATA_DIR, --data-dir) could not be created: \(reason)")
        }
        chmod(directory.path, 0o700)
        try account.chown(directory.path)
    }

    private func initialiseIfNeeded(binaries: PostgresBinaries, runner: ProcessRunner, account: SystemAccount, logger: Logger) async throws {
        let fileManager = FileManager.default
        if fileManager.fileExists(atPath: dataPath + "/PG_VERSION") { return }
        // A half-made data directory (initdb interrupted) is of no use: start again.
        if fileManager.fileExists(atPath: dataPath) { try fileManager.removeItem(atPath: dataPath) }
        logger.info("creating the private PostgreSQL cluster", metadata: ["pg.data": "\(dataPath)"])
        var arguments = ["-D", dataPath, "-U", Self.user, "--auth=trust", "-E", "UTF8", "--locale=C", "--no-instructions"]
        if !durable { arguments.append("--no-sync") }
        let outcome = try await runner.run(binaries.initdb, arguments)
        guard outcome.status == 0 else {
            throw PrivateClusterError("initdb failed (\(outcome.status)): \(outcome.output)")
        }
        let configuration = dataPath + "/postgresql.conf"
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: configuration))
        handle.seekToEndOfFile()
        handle.write(Data("\n# Order Ledger's settings, rewritten at every start\ninclude 'ledger.conf'\n".utf8))
        try handle.close()
    }

    /// Connections the cluster takes. The tests' (not durable) cluster serves every suite's
    /// connection pools at once, and refused connections ("too many clients") at 300, again at
    /// 600 once the subscriptions suites came (85 suites), and at 1200 with 110 suites on a
    /// loaded machine (a run on a quiet one peaked at 1,132).
    var maximumConnections: Int { durable ? 300 : 2400 }

    private func writeSettings(account: SystemAccount) throws {
        try FileManager.default.createDirectory(atPath: socketDirectory, withIntermediateDirectories: true)
        chmod(socketDirectory, 0o700)
        try account.chown(socketDirectory)
        var settings = """
            listen_addresses = ''
            unix_socket_directories = '\(socketDirectory.replacingOccurrences(of: "'", with: "''"))'
            unix_socket_permissions = 0700
            port = \(Self.port)
            max_connections = \(maximumConnections)
            shared_buffers = 256MB
            max_locks_per_transaction = 256

            """
        if !durable {
            settings += "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
        }
        let path = dataPath + "/ledger.conf"
        try settings.write(toFile: path, atomically: true, encoding: .utf8)
        try account.chown(path)
    }

    /// The postmaster's pid when a live PostgreSQL process holds this data directory.
    public func runningServerPID() -> Int32? {
        guard let text = try? String(contentsOfFile: dataPath + "/postmaster.pid", encoding: .utf8),
              let firstLine = text.split(separator: "\n").first,
              let pid = Int32(firstLine.trimmingCharacters(in: .whitespaces)), pid > 0
        else { return nil }
        guard kill(pid, 0) == 0 || errno == EPERM else { return nil }
        // The pid may have been reused after a crash: by an unrelated process, or by another
        // cluster's postmaster (which `pg_ctl stop` on this folder would then shut down); or the
        // postmaster was killed and is a zombie its parent has not reaped yet.
        let command = (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines)
        guard command == "postgres" || command == "postmaster", !Self.isDead(pid), servesThisFolder(pid) else { return nil }
        return pid
    }

    /// Whether process `pid` has ended (a zombie, or dead) though `kill(pid, 0)` still finds it.
    static func isDead(_ pid: Int32) -> Bool {
        // `pid (comm) S …`: the state follows the last parenthesis (a name may hold one).
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return false }
        let state = stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).first
        return state == "Z" || state == "X" || state == "x"
    }

    /// Whether postmaster `pid` serves this data folder: PostgreSQL works in its data folder (its
    /// working directory), and its command line names it (`-D`), which is read when the working
    /// directory cannot be (another user's process).
    private func servesThisFolder(_ pid: Int32) -> Bool {
        let folder = URL(fileURLWithPath: dataPath).resolvingSymlinksInPath().path
        if let cwd = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/cwd") {
            return URL(fileURLWithPath: cwd).resolvingSymlinksInPath().path == folder
        }
        guard let line = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return false }
        let arguments = line.split(separator: 0).map { URL(fileURLWithPath: String(decoding: $0, as: UTF8.self)).resolvingSymlinksInPath().path }
        return arguments.contains(folder)
    }

    /// Removes lock files of a PostgreSQL that is no longer running: PostgreSQL refuses to start
    /// over them when their pid now belongs to another live process.
    private func removeStaleLockFiles(logger: Logger) {
        let stale = [dataPath + "/postmaster.pid", socketPath + ".lock", socketPath]
        for path in stale where FileManager.default.fileExists(atPath: path) {
            try? FileManager.default.removeItem(atPath: path)
            logger.info("removed a stale file of a stopped PostgreSQL", metadata: ["file": "\(path)"])
        }
    }

    private func waitUntilReady(logger: Logger) async throws {
        var lastError: (any Error)?
        for _ in 0..<120 {
            do {
                let connection = try await PostgresConnection.connect(
                    configuration: .init(unixSocketPath: socketPath, username: Self.user, password: nil, database: "postgres"),
                    id: 1, logger: logger)
                try await connection.close()
                return
            } catch {
                lastError = error
                try await Task.sleep(for: .milliseconds(250))
            }
        }
        throw PrivateClusterError("PostgreSQL did not accept connections within 30 s: \(String(describing: lastError)); see \(logPath)")
    }
}

/// A started (or adopted, or shared) private cluster; `stop` shuts it down when this process owns it.
public final class RunningPrivateCluster: Sendable {
    public let cluster: PrivateCluster
    let binaries: PostgresBinaries
    let runner: ProcessRunner
    let ownerLock: FileLock?

    init(cluster: PrivateCluster, binaries: PostgresBinaries, runner: ProcessRunner, ownerLock: FileLock?) {
        self.cluster = cluster
        self.binaries = binaries
        self.runner = runner
        self.ownerLock = ownerLock
    }

    /// True when this process owns the cluster and will stop it.
    public var isOwner: Bool { ownerLock != nil }

    /// Stops the cluster if this process owns it; otherwise leaves it to its owner.
    public func stop(logger: Logger) async throws {
        guard let ownerLock else { return }
        defer { ownerLock.close() }
        guard cluster.runningServerPID() != nil else { return }
        try stopped(try await runner.run(binaries.pgCtl, stopArguments), logger: logger)
    }

    /// `stop`, blocking the calling thread until PostgreSQL has stopped: for exit paths (`defer`,
    /// `atexit`) only, where no task waits for the thread.
    public func stopBlocking(logger: Logger) throws {
        guard let ownerLock else { return }
        defer { ownerLock.close() }
        guard cluster.runningServerPID() != nil else { return }
        try stopped(try runner.runBlocking(binaries.pgCtl, stopArguments), logger: logger)
    }

    private var stopArguments: [String] { ["-D", cluster.dataPath, "-m", "fast", "-w", "-t", "60", "stop"] }

    private func stopped(_ outcome: ProcessRunner.Outcome, logger: Logger) throws {
        guard outcome.status == 0 else {
            throw PrivateClusterError("pg_ctl stop failed (\(outcome.status)): \(outcome.output)")
        }
        logger.info("private PostgreSQL stopped", metadata: ["pg.data": "\(cluster.dataPath)"])
    }
}

/// A private cluster that could not be created, started or stopped, with the reason.
public struct PrivateClusterError: Error, Sendable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
