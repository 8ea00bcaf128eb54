import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// Group commit for standalone appends: appends that arrive while others are being written share
/// one database transaction and one round trip, yet each is checked and answered on its own.
/// Every answer comes after COMMIT returned, so an acknowledged append is durable.
final class AppendBatcher: Sendable {
    /// One append waiting for its answer.
    struct Request: Sendable {
        let stream: StreamID
        let expected: ExpectedVersion
        let events: [NewEvent]
    }

    /// How often a writer yields, at most, for answered callers to append again (measured best
    /// of 0, 2, 4, 8, 16, 32 with `ledger bench append`).
    static let yieldsBetweenBatches = 16

    /// One transaction holds at most this many events (positions are xid * 4096 + n).
    static let maximumEventsPerBatch = 4096

    private let database: Database
    private let queue: GroupCommit<Request, AppendResult>

    init(database: Database, maximumWriters: Int, executor: (any TaskExecutor)? = nil) {
        self.database = database
        self.queue = GroupCommit(
            maximumWriters: maximumWriters, yieldsBetweenBatches: Self.yieldsBetweenBatches, writerExecutor: executor,
            session: { batches in await database.holdingConnection(batches) },
            select: Self.select, execute: { batch in await Self.execute(batch, database) })
    }

    var statistics: GroupCommit<Request, AppendResult>.Statistics { queue.statistics }

    func append(_ events: [NewEvent], to stream: StreamID, expectedVersion: ExpectedVersion) async throws -> AppendResult {
        try await queue.submit(Request(stream: stream, expected: expectedVersion, events: events))
    }

    /// The oldest appends whose events fit in one transaction.
    private static func select(_ pending: [Request]) -> [Int] {
        var events = 0
        var count = 0
        for request in pending {
            if count > 0 && events + request.events.count > maximumEventsPerBatch { break }
            events += request.events.count
            count += 1
        }
        return Array(0..<count)
    }

    private static func execute(_ batch: [GroupCommit<Request, AppendResult>.Pending], _ database: Database) async {
        let requests = batch.map(\.work)
        do {
            let answers = try await database.withHeldConnection { try await Self.writeDurably(requests, on: $0, logger: database.logger) }
            for (pending, answer) in zip(batch, answers) { pending.continuation.resume(with: answer) }
        } catch let error as PSQLError where batch.count > 1 && error.serverInfo != nil {
            // A statement error rolls the whole batch back (an event id stored or repeated, a
            // stream version taken, a deadlock, a body that is not JSON): write each append alone,
            // on the writer's connection (leasing a second one while holding it could wait forever
            // on a pool of one).
            database.logger.debug("batch failed, writing its appends one by one", metadata: ["error": "\(error.sqlState ?? "")"])
            for pending in batch {
                let request = pending.work
                do {
                    let answer = try await database.withHeldConnection { try await Self.writeDurably([request], on: $0, logger: database.logger) }
                    pending.continuation.resume(with: answer[0])
                } catch {
                    pending.continuation.resume(throwing: EventStore.mapError(error, request.stream, request.expected, request.events))
                }
            }
        } catch {
            for pending in batch {
                let request = pending.work
                pending.continuation.resume(throwing: EventStore.mapError(error, request.stream, request.expected, request.events))
            }
        }
    }

    /// Writes the batch with one CALL that commits before it answers, then answers each append.
    static func writeDurably(_ batch: [Request], on connection: PostgresConnection, logger: Logger) async throws -> [Result<AppendResult, any Error>] {
        let events = EventStore.Columns(batch.flatMap(\.events))
        let streams = batch.map(\.stream.rawValue)
        let expected = batch.map { $0.expected.databaseValue ?? -2 }
        let sizes = batch.map { Int32($0.events.count) }
        // The batch's only statement: on a connection found closed, another one is leased.
        let rows = PooledRows(rows: try await Database.first(try await connection.atomicallyGuardedQuery(
            """
            CALL append_batch_durably(\(streams), \(expected), \(sizes), \(events.ids), \(events.types), \(events.data)::jsonb[],
                                      \(events.metadata)::jsonb[],
                                      NULL, NULL, NULL, NULL, NULL, NULL)
            """,
            logger: logger
        ).get().rows))
        var grouped = Array(repeating: [EventStore.StatusRow](), count: batch.count)
        let columns = ([Int32], [String], [String], [UUID], [Int64], [Int64]).self
        for try await (appends, statuses, details, eventIDs, versions, positions) in rows.decode(columns) {
            for row in appends.indices {
                grouped[Int(appends[row]) - 1].append(EventStore.StatusRow(
                    status: statuses[row], detail: details[row].isEmpty ? nil : details[row],
                    eventID: eventIDs[row], version: versions[row] < 0 ? nil : versions[row],
                    position: positions[row] < 0 ? nil : positions[row]))
            }
        }
        // The procedure's arrays are parallel but not sorted: each append's rows in version order.
        return zip(batch, grouped).map { request, rows in
            EventStore.answer(rows.sorted { ($0.version ?? -1) < ($1.version ?? -1) }, request.stream, request.expected)
        }
    }
}
