import Foundation
import LedgerStore
import Logging
import PostgresNIO
import PrivatePostgres

#if canImport(Glibc)
import Glibc
#endif

/// The PostgreSQL server the tests run on: `LEDGER_TEST_DATABASE_URL` when set (the tests create
/// and drop databases on it), else a private cluster under `.ledger-test` in the package, started
/// once per test process and stopped when the process exits.
///
/// Every test gets a database of its own, cloned from a migrated template, so tests run in parallel.
public actor TestServer {
    public static let shared = TestServer()

    /// The package's root folder, found from this file's path.
    public static let packageRoot = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    public static let templateName = "ledger_test_template"

    private var prepared: Task<URLTemplate, any Error>?

    /// How to reach the server, as a function of the database name.
    struct URLTemplate: Sendable {
        let make: @Sendable (String) -> PostgresClient.Configuration
        let admin: String
    }

    public static let logger: Logger = {
        var logger = Logger(label: "ledger-test")
        logger.logLevel = ProcessInfo.processInfo.environment["LEDGER_TEST_LOG_LEVEL"].flatMap { Logger.Level(rawValue: $0) } ?? .warning
        return logger
    }()

    /// Quieter: pools warn when leased before their run loop has started, which is harmless here.
    public static let clientLogger: Logger = {
        var logger = Logger(label: "ledger-test-client")
        logger.logLevel = .error
        return logger
    }()

    /// A new, migrated database of its own, by name and client configuration.
    public func makeDatabase(migrated: Bool = true) async throws -> (name: String, configuration: PostgresClient.Configuration) {
        let server = try await prepare()
        let name = "ledger_t_" + UUID().uuidString.prefix(12).lowercased().replacingOccurrences(of: "-", with: "")
        let template = migrated ? " TEMPLATE \(Self.templateName)" : ""
        // Again after a failure, a few times: under a CPU hog a full run saw some twenty tests
        // fail here at once, their connections not opened within 10 s; what fails is written out.
        for attempt in 1... {
            do {
                try await Self.admin(server) { connection in
                    try await connection.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name)\(template)"), logger: Self.logger)
                }
                break
            } catch {
                FileHandle.standardError.write(Data("TestServer: CREATE DATABASE \(name), attempt \(attempt): \(String(reflecting: error))\n".utf8))
                if attempt == 4 { throw error }
                await dropDatabase(name)
                try await Task.sleep(for: .milliseconds(250 * attempt))
            }
        }
        return (name, server.make(name))
    }

    /// Drops a database made by `makeDatabase`.
    public func dropDatabase(_ name: String) async {
        guard let server = try? await prepare() else { return }
        try? await Self.admin(server) { connection in
            try await connection.query(PostgresQuery(unsafeSQL: "DROP DATABASE IF EXISTS \(name) WITH (FORCE)"), logger: Self.logger)
        }
    }

    /// The configuration of a database on the test server (for tests that connect on their own).
    public func configuration(database: String) async throws -> PostgresClient.Configuration {
        try await prepare().make(database)
    }

    private func prepare() async throws -> URLTemplate {
        if let prepared { return try await prepared.value }
        let task = Task { try await Self.startServerAndTemplate() }
        prepared = task
        return try await task.value
    }

    private static func startServerAndTemplate() async throws -> URLTemplate {
        let server: URLTemplate
        if let text = ProcessInfo.processInfo.environment["LEDGER_TEST_DATABASE_URL"], !text.isEmpty {
            let url = try DatabaseURL(text)
            server = URLTemplate(make: { url.with(database: $0).clientConfiguration }, admin: url.database)
        } else {
            let cluster = testCluster()
            let running = try await cluster.start(logger: logger)
            ClusterAtExit.register(running)
            server = URLTemplate(make: { cluster.clientConfiguration(database: $0) }, admin: "postgres")
        }
        try await admin(server) { connection in
            let rows = try await connection.query(
                "SELECT datname FROM pg_database WHERE datname LIKE 'ledger_t_%' OR datname = \(templateName)", logger: logger)
            var stale: [String] = []
            for try await name in rows.decode(String.self) { stale.append(name) }
            for name in stale {
                try await connection.query(PostgresQuery(unsafeSQL: "DROP DATABASE IF EXISTS \(name) WITH (FORCE)"), logger: logger)
            }
            try await connection.query(PostgresQuery(unsafeSQL: "CREATE DATABASE \(templateName)"), logger: logger)
        }
        // Migrate the template through a client that is fully shut down afterwards: a template
        // with open connections cannot be cloned.
        let client = PostgresClient(configuration: server.make(templateName), backgroundLogger: clientLogger)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await client.run() }
            try await Migrator(logger: logger).migrate(client)
            group.cancelAll()
        }
        return server
    }

    /// Where test clusters live: the package folder, or a folder of its own under /var/tmp when
    /// the postgres user cannot reach the package (a checkout inside a private folder).
    public static let scratchRoot: URL = {
        let probe = PrivateCluster(directory: packageRoot.appendingPathComponent(".ledger-test").path)
        if probe.isReachableByServerAccount() { return packageRoot }
        // FNV-1a of the package path: stable across runs, so the cluster is reused.
        let hash = packageRoot.path.utf8.reduce(UInt64(0xcbf2_9ce4_8422_2325)) { ($0 ^ UInt64($1)) &* 0x100_0000_01b3 }
        let folder = URL(fileURLWithPath: "/var/tmp/ledger-\(String(hash, radix: 36))")
        try? FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        chmod(folder.path, 0o755)
        return folder
    }()

    static func testCluster() -> PrivateCluster {
        PrivateCluster(directory: scratchRoot.appendingPathComponent(".ledger-test").path, durable: false)
    }

    /// How long the tests' own connections may take to open: on a machine whose every core is
    /// busy, a full run's first minute (a hundred databases made at once) took longer than
    /// postgres-nio's 10 s. The configuration handed to a server under test keeps its default.
    public static let connectTimeoutSeconds: Int64 = 60

    private static func admin(_ server: URLTemplate, _ body: (PostgresConnection) async throws -> Void) async throws {
        var configuration = PostgresConnection.Configuration(server.make(server.admin))
        configuration.options.connectTimeout = .seconds(connectTimeoutSeconds)
        let connection = try await PostgresConnection.connect(configuration: configuration, id: 1, logger: logger)
        do {
            try await body(connection)
        } catch {
            try? await connection.close()
            throw error
        }
        try await connection.close()
    }
}

extension PostgresConnection.Configuration {
    /// A single connection's configuration from a pool's (the test server's: no TLS).
    public init(_ pool: PostgresClient.Configuration) {
        if let path = pool.unixSocketPath {
            self.init(unixSocketPath: path, username: pool.username, password: pool.password, database: pool.database)
        } else {
            let tls: PostgresConnection.Configuration.TLS = .disable
            self.init(host: pool.host ?? "localhost", port: pool.port ?? 5432, username: pool.username,
                      password: pool.password, database: pool.database, tls: tls)
        }
    }
}

/// Stops the test cluster when the test process exits.
enum ClusterAtExit {
    nonisolated(unsafe) static var running: RunningPrivateCluster?

    static func register(_ cluster: RunningPrivateCluster) {
        running = cluster
        atexit {
            try? ClusterAtExit.running?.stopBlocking(logger: TestServer.logger)
        }
    }
}
