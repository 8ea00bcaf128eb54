import Foundation
import LedgerCore
import LedgerStore
import Logging
import PostgresNIO
import Synchronization

/// A fresh migrated database with a running client, for the length of one test.
public struct TestDatabase: Sendable {
    public let name: String
    public let configuration: PostgresClient.Configuration
    public let client: PostgresClient
    public let database: Database
    /// One writer for the whole test, so that its appends share the group commit.
    public let writer: LedgerWriter
    public let store: EventStore

    init(name: String, configuration: PostgresClient.Configuration, client: PostgresClient) {
        self.name = name
        self.configuration = configuration
        self.client = client
        self.database = Database(client: client, logger: TestServer.logger)
        self.writer = LedgerWriter(database: database)
        self.store = EventStore(database: database)
    }

    /// Appends `events` to `stream` through the writer, in a transaction of its own.
    @discardableResult
    public func append(_ events: [NewEvent], to stream: StreamID, expectedVersion: ExpectedVersion = .any) async throws -> AppendResult {
        try await writer.append(events, to: stream, expected: expectedVersion).result
    }

    /// Appends `events` to `stream` through the writer, in the transaction open on `connection`.
    @discardableResult
    public func append(
        _ events: [NewEvent], to stream: StreamID, expectedVersion: ExpectedVersion = .any, on connection: PostgresConnection
    ) async throws -> AppendResult {
        try await writer.append(.init(.init(events, to: stream, expected: expectedVersion)), in: DatabaseTransaction(connection)).appends[0].result
    }

    /// Opens a single connection of its own (for tests that hold transactions open).
    public func connect(id: Int = 1) async throws -> PostgresConnection {
        var single = PostgresConnection.Configuration(configuration)
        single.options.connectTimeout = .seconds(TestServer.connectTimeoutSeconds)
        return try await PostgresConnection.connect(configuration: single, id: id, logger: TestServer.logger)
    }

    /// `body` with a `Database` on a pool of at most one connection of this database: each
    /// statement goes on the connection the one before it used, unless that one was replaced.
    public func withPoolOfOne<Result: Sendable>(_ body: @Sendable (Database) async throws -> Result) async throws -> Result {
        var configuration = configuration
        configuration.options.maximumConnections = 1
        configuration.options.minimumConnections = 0
        let client = PostgresClient(configuration: configuration, backgroundLogger: TestServer.clientLogger)
        let running = Task { await client.run() }
        defer { running.cancel() }
        return try await body(Database(client: client, logger: TestServer.logger))
    }
}

/// Runs `body` with a fresh database (migrated unless asked otherwise), dropped afterwards.
public func withTestDatabase<Result: Sendable>(
    migrated: Bool = true, _ body: @Sendable (TestDatabase) async throws -> Result
) async throws -> Result {
    let (name, configuration) = try await TestServer.shared.makeDatabase(migrated: migrated)
    // The test's own pool waits longer for a connection than a server under test's does.
    var own = configuration
    own.options.connectTimeout = .seconds(TestServer.connectTimeoutSeconds)
    let client = PostgresClient(configuration: own, backgroundLogger: TestServer.clientLogger)
    // Not a child task: a statement postgres-nio (1.33) never answers (one written to a
    // connection that had closed; Database.query and Database.withConnection guard against it)
    // holds its lease, and the pool's run() would not end; a task group would wait for it forever.
    let running = Task { await client.run() }
    let outcome: Swift.Result<Result, any Error>
    do {
        outcome = .success(try await body(TestDatabase(name: name, configuration: configuration, client: client)))
    } catch {
        outcome = .failure(error)
    }
    running.cancel()
    if !(await ended(running, within: .seconds(10))) {
        FileHandle.standardError.write(Data("withTestDatabase: the PostgresClient of \(name) did not end within 10 s of its cancellation; left behind\n".utf8))
    }
    await TestServer.shared.dropDatabase(name)
    return try outcome.get()
}

/// `body`'s outcome, or nil when it has none within `limit` (it is then left running, so that a
/// test reports a wait that never ends instead of hanging with it).
public func answered<T: Sendable>(
    within limit: Duration, _ body: @escaping @Sendable () async throws -> T
) async -> Swift.Result<T, any Error>? {
    let task = Task { try await body() }
    guard await ended(Task { _ = await task.result }, within: limit) else { return nil }
    return await task.result
}

/// Whether `task` ends within `limit` (it is left running when not).
func ended(_ task: Task<Void, Never>, within limit: Duration) async -> Bool {
    /// The first of the two answers.
    final class FirstAnswer: Sendable {
        let continuation: Mutex<CheckedContinuation<Bool, Never>?>
        init(_ continuation: CheckedContinuation<Bool, Never>) { self.continuation = Mutex(continuation) }
        func resume(_ value: Bool) { continuation.withLock { $0.take() }?.resume(returning: value) }
    }
    return await withCheckedContinuation { continuation in
        let answer = FirstAnswer(continuation)
        Task {
            await task.value
            answer.resume(true)
        }
        Task {
            try? await Task.sleep(for: limit)
            answer.resume(false)
        }
    }
}

/// Parses JSON text for comparisons that ignore jsonb's formatting.
public func jsonObject(_ data: Data) -> NSObject? {
    try? JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed]) as? NSObject
}

/// How long a test waits for the gap-safe feed to pass its events. The feed withholds events
/// while any older writing transaction of the cluster is open, in any database: other tests'
/// too. Under a CPU hog, a finished test's `DROP DATABASE … WITH (FORCE)` held its transaction
/// 18–21 s and a test's deliberately open transaction 19–22 s (pg_stat_activity, polled each
/// second); CI once saw the feed held past 20 s, the earlier limit. Waiting this long is never a
/// race with the machine's speed; a wait that runs out means a transaction that never ends.
public let feedVisibilityPatience = Duration.seconds(600)

extension EventStore {
    /// Reads the feed until it holds at least `count` events after `position` (or
    /// `feedVisibilityPatience` passes).
    public func readAllWhenVisible(after position: Int64, count: Int, limit: Int = 1000) async throws -> [RecordedEvent] {
        let deadline = ContinuousClock.now + feedVisibilityPatience
        while true {
            let events = try await readAll(after: position, limit: limit)
            if events.count >= min(count, limit) || ContinuousClock.now > deadline { return events }
            try await Task.sleep(for: .milliseconds(20))
        }
    }
}
