import Foundation
import LedgerCore
import Logging
import PostgresNIO
import Synchronization

/// Group commit for standalone appends: appends that arrive while others are being written share
/// one database transaction and one round trip, yet each is checked and answered on its own.
///
/// No background task: the caller that finds a writer slot free writes everything pending, then
/// keeps writing what arrived meanwhile; the others wait for their answer. Every answer comes
/// after COMMIT returned, so an acknowledged append is durable.
final class AppendBatcher: Sendable {
    /// One append waiting for its answer.
    struct Request: Sendable {
        let stream: StreamID
        let expected: ExpectedVersion
        let events: [NewEvent]
        let continuation: CheckedContinuation<AppendResult, any Error>
    }

    /// How much batching has happened (for tests and the benchmark).
    struct Statistics: Sendable, Equatable {
        var batches = 0
        var appends = 0
    }

    private struct State: ~Copyable {
        var pending: [Request] = []
        var writers = 0
        var statistics = Statistics()
    }

    /// How often a writer yields, at most, for answered callers to append again (measured best
    /// of 0, 2, 4, 8, 16, 32 with `ledger bench append`).
    static let yieldsBetweenBatches = 16

    /// One transaction holds at most this many events (positions are xid * 4096 + n).
    static let maximumEventsPerBatch = 4096

    private let state = Mutex(State())
    private let database: Database
    private let maximumWriters: Int

    init(database: Database, maximumWriters: Int) {
        self.database = database
        self.maximumWriters = max(1, maximumWriters)
    }

    var statistics: Statistics { state.withLock { $0.statistics } }

    func append(_ events: [NewEvent], to stream: StreamID, expectedVersion: ExpectedVersion) async throws -> AppendResult {
        try await withCheckedThrowingContinuation { continuation in
            let request = Request(stream: stream, expected: expectedVersion, events: events, continuation: continuation)
            let batch: [Request]? = state.withLock { state in
                state.pending.append(request)
                guard state.writers < maximumWriters else { return nil }
                state.writers += 1
                return Self.takeBatch(&state)
            }
            if let batch {
                Task { await self.write(startingWith: batch) }
            }
        }
    }

    private static func takeBatch(_ state: inout State) -> [Request] {
        var events = 0
        var count = 0
        for request in state.pending {
            if count > 0 && events + request.events.count > maximumEventsPerBatch { break }
            events += request.events.count
            count += 1
        }
        let batch = Array(state.pending.prefix(count))
        state.pending.removeFirst(count)
        state.statistics.batches += 1
        state.statistics.appends += count
        return batch
    }

    private func write(startingWith first: [Request]) async {
        var batch = first
        while true {
            await execute(batch)
            // The callers just answered usually append again at once: give them a moment to
            // queue, so that the next transaction carries them all instead of a few.
            for _ in 0..<Self.yieldsBetweenBatches where state.withLock({ $0.pending.count < batch.count }) {
                await Task.yield()
            }
            let next: [Request]? = state.withLock { state in
                if state.pending.isEmpty {
                    state.writers -= 1
                    return nil
                }
                return Self.takeBatch(&state)
            }
            guard let next else { return }
            batch = next
        }
    }

    private func execute(_ batch: [Request]) async {
        do {
            let answers = try await database.withConnection { try await Self.writeDurably(batch, on: $0, logger: database.logger) }
            for (request, answer) in zip(batch, answers) { request.continuation.resume(with: answer) }
        } catch let error as PSQLError where batch.count > 1 && error.serverInfo != nil {
            // A statement error rolls the whole batch back (an event id taken by a writer outside
            // the batch, a deadlock, a body that is not JSON): write each append alone.
            database.logger.debug("batch failed, writing its appends one by one", metadata: ["error": "\(error.sqlState ?? "")"])
            for request in batch {
                do {
                    let answer = try await database.withConnection { try await Self.writeDurably([request], on: $0, logger: database.logger) }
                    request.continuation.resume(with: answer[0])
                } catch {
                    request.continuation.resume(throwing: EventStore.mapError(error, request.stream, request.expected, request.events))
                }
            }
        } catch {
            for request in batch {
                request.continuation.resume(throwing: EventStore.mapError(error, request.stream, request.expected, request.events))
            }
        }
    }

    /// Writes the batch with one CALL that commits before it answers, then answers each append.
    static func writeDurably(_ batch: [Request], on connection: PostgresConnection, logger: Logger) async throws -> [Result<AppendResult, any Error>] {
        let events = EventStore.Columns(batch.flatMap(\.events))
        let streams = batch.map(\.stream.rawValue)
        let expected = batch.map { $0.expected.databaseValue ?? -2 }
        let sizes = batch.map { Int32($0.events.count) }
        // The lease's only statement: on a connection found closed, another connection is leased.
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
        return zip(batch, grouped).map { request, rows in EventStore.answer(rows, request.stream, request.expected) }
    }
}
