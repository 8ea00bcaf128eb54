import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// The append-only event log in PostgreSQL: appends with optimistic concurrency and
/// idempotency, and reads of one stream or of the gap-safe global feed.
public struct EventStore: Sendable {
    /// The most events one read returns.
    public static let maximumReadLimit = 10_000

    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// Appends `events` to `stream` in a transaction of its own.
    public func append(
        _ events: [NewEvent], to stream: StreamID, expectedVersion: ExpectedVersion = .any
    ) async throws -> AppendResult {
        try await database.client.withConnection { connection in
            try await append(events, to: stream, expectedVersion: expectedVersion, on: connection)
        }
    }

    /// Appends `events` to `stream` on `connection`, inside whatever transaction it has open: the
    /// stream stays locked for other writers until that transaction ends.
    public func append(
        _ events: [NewEvent], to stream: StreamID, expectedVersion: ExpectedVersion = .any,
        on connection: PostgresConnection
    ) async throws -> AppendResult {
        guard !events.isEmpty else { throw AppendError.invalidBatch("a batch holds at least one event") }
        let ids = events.map(\.id.uuid)
        let types = events.map(\.type)
        let data = events.map { String(decoding: $0.data, as: UTF8.self) }
        let metadata = events.map { String(decoding: $0.metadata, as: UTF8.self) }
        let expected = expectedVersion.databaseValue
        var versions: [Int64] = []
        var positions: [Int64] = []
        var replayed = false
        do {
            let rows = try await connection.query(
                """
                SELECT r_stream_version, r_global_position, r_replayed
                FROM append_events(\(stream.rawValue), \(expected), \(ids), \(types), \(data)::jsonb[], \(metadata)::jsonb[])
                """,
                logger: database.logger
            )
            for try await (version, position, wasReplayed) in rows.decode((Int64, Int64, Bool).self) {
                versions.append(version)
                positions.append(position)
                replayed = wasReplayed
            }
        } catch let error as PSQLError {
            throw Self.appendError(error, stream: stream, expected: expectedVersion, events: events)
        }
        guard let last = versions.last else {
            throw AppendError.invalidBatch("the database appended nothing")
        }
        return AppendResult(streamVersion: last, positions: positions, replayed: replayed)
    }

    /// The version of the stream's last event, or -1 when the stream has none.
    public func currentVersion(of stream: StreamID) async throws -> Int64 {
        let rows = try await database.client.query(
            "SELECT coalesce(max(stream_version), -1) FROM events WHERE stream_id = \(stream.rawValue)",
            logger: database.logger
        )
        for try await version in rows.decode(Int64.self) { return version }
        return ExpectedVersion.noStreamVersion
    }

    /// Events of one stream from `version` on, in version order.
    public func readStream(_ stream: StreamID, from version: Int64 = 0, limit: Int = maximumReadLimit) async throws -> [RecordedEvent] {
        let limit = Self.clamp(limit)
        let rows = try await database.client.query(
            """
            SELECT \(unescaped: Self.columns) FROM events
            WHERE stream_id = \(stream.rawValue) AND stream_version >= \(version)
            ORDER BY stream_version LIMIT \(limit)
            """,
            logger: database.logger
        )
        return try await Self.decode(rows)
    }

    /// The global feed after `position`, in position order, gap-safe: an event is returned only
    /// once every transaction that could still commit a lower position has ended, so a reader
    /// that resumes after the last position it saw never skips an event.
    public func readAll(after position: Int64, limit: Int = 1000) async throws -> [RecordedEvent] {
        let limit = Self.clamp(limit)
        let rows = try await database.client.query(
            """
            SELECT \(unescaped: Self.columns) FROM events
            WHERE global_position > \(position) AND global_position <= events_safe_position()
            ORDER BY global_position LIMIT \(limit)
            """,
            logger: database.logger
        )
        return try await Self.decode(rows)
    }

    static let columns =
        "global_position, stream_id, stream_version, event_id, type, data::text, metadata::text, recorded_at"

    static func clamp(_ limit: Int) -> Int { min(max(limit, 1), maximumReadLimit) }

    static func decode(_ rows: PostgresRowSequence) async throws -> [RecordedEvent] {
        var events: [RecordedEvent] = []
        let types = (Int64, String, Int64, UUID, String, String, String, Date).self
        for try await (position, stream, version, id, type, data, metadata, recordedAt) in rows.decode(types) {
            events.append(RecordedEvent(
                position: position, streamID: try StreamID(stream), streamVersion: version, id: EventID(id),
                type: type, data: Data(data.utf8), metadata: Data(metadata.utf8), recordedAt: recordedAt
            ))
        }
        return events
    }

    static func appendError(_ error: PSQLError, stream: StreamID, expected: ExpectedVersion, events: [NewEvent]) -> any Error {
        switch error.sqlState {
        case "LE001":
            let current = error.serverInfo?[.detail].flatMap(Int64.init) ?? ExpectedVersion.noStreamVersion
            return AppendError.wrongExpectedVersion(stream: stream, expected: expected, current: current)
        case "LE002":
            let id = error.serverInfo?[.detail].flatMap { try? EventID($0) } ?? events[0].id
            return AppendError.eventIDConflict(id)
        case "LE003":
            return AppendError.invalidBatch(error.serverMessage ?? "invalid batch")
        case "22P02", "22032":
            return AppendError.invalidBatch("data and metadata must be JSON: \(error.serverMessage ?? "")")
        case "23505" where error.serverInfo?[.constraintName] == "events_event_id_key":
            // Another transaction took this event id for another stream at the same moment.
            return AppendError.eventIDConflict(events[0].id)
        default:
            return error
        }
    }
}
