import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// Reads of the event log: one stream, or the gap-safe global feed. (Appends go through
/// `LedgerWriter`.)
public struct EventStore: Sendable {
    /// The most events one read returns.
    public static let maximumReadLimit = 10_000

    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// The version of the stream's last event, or -1 when the stream has none.
    public func currentVersion(of stream: StreamID) async throws -> Int64 {
        let rows = try await database.query(
            "SELECT coalesce(max(stream_version), -1) FROM events WHERE stream_id = \(stream.rawValue)")
        for try await version in rows.decode(Int64.self) { return version }
        return ExpectedVersion.noStreamVersion
    }

    /// Events of one stream from `version` on, in version order.
    public func readStream(_ stream: StreamID, from version: Int64 = 0, limit: Int = maximumReadLimit) async throws -> [RecordedEvent] {
        let limit = Self.clamp(limit)
        let rows = try await database.query(
            """
            SELECT \(unescaped: Self.columns) FROM events
            WHERE stream_id = \(stream.rawValue) AND stream_version >= \(version)
            ORDER BY stream_version LIMIT \(limit)
            """)
        return try await Self.decode(rows)
    }

    /// The event stored with `id`, if one is, as the caller's transaction sees the log.
    public func event(_ id: EventID, in transaction: DatabaseTransaction) async throws -> RecordedEvent? {
        let rows = try await transaction.connection.guardedQuery(
            "SELECT \(unescaped: Self.columns) FROM events WHERE event_id = \(id.uuid)", logger: database.logger)
        return try await Self.decode(rows).first
    }

    /// How many times support undid a pairing of `transaction` with the order of stream `order`
    /// (`pairing-undone` events there naming it), as the caller's transaction sees the log.
    public func undonePairings(of transaction: String, on order: StreamID, in tx: DatabaseTransaction) async throws -> Int {
        let rows = try await tx.connection.guardedQuery(
            """
            SELECT count(*)::int FROM events
             WHERE stream_id = \(order.rawValue) AND type = 'pairing-undone' AND data->>'transactionId' = \(transaction)
            """, logger: database.logger)
        for try await count in rows.decode(Int.self) { return count }
        return 0
    }

    /// Which of `ids` the log holds, as the caller's transaction sees it: one round trip for many.
    public func storedIDs(_ ids: [EventID], in transaction: DatabaseTransaction) async throws -> Set<EventID> {
        guard !ids.isEmpty else { return [] }
        let rows = try await transaction.connection.atomicallyGuardedExecute(StoredIDs(ids: ids.map(\.uuid)), logger: database.logger)
        return Set(rows.map { EventID($0) })
    }

    /// `storedIDs`' read, prepared once per connection: planned each time, it took longer to
    /// plan than to run (a renewal group asks it once).
    struct StoredIDs: PostgresPreparedStatement {
        static let name = "ledger_stored_event_ids"
        static let sql = "SELECT event_id FROM events WHERE event_id = ANY($1::uuid[])"
        typealias Row = UUID

        let ids: [UUID]

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 1)
            bindings.append(ids)
            return bindings
        }

        func decodeRow(_ row: PostgresRow) throws -> UUID { try row.decode(UUID.self) }
    }

    /// Whether Apple reversed the refund of Apple transaction `transactionId` revoked at `date`,
    /// as `streams` (its own, its order's, its subscription's) hold it in the caller's
    /// transaction: a `REFUND_REVERSED` of it signed after `date` (a `notification-received` of
    /// that type, a `subscription-period-refund-reversed` that kept its signing time, or an
    /// order's `refund-reversed`: its metadata's `reversalSignedDate`, else one without it reverses
    /// the refunds revoked before the `refunded` it undid was recorded), or that
    /// same refund recorded (revoked at `date`, within 2 ms) and a reversal after it on its
    /// stream (an order's `refund-reversed` keeps no time of its own).
    public func refundReversed(_ transactionId: String, revokedAt date: Date, on streams: [StreamID], in transaction: DatabaseTransaction) async throws -> Bool {
        let streams = streams.map(\.rawValue)
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT EXISTS (
                SELECT 1 FROM events
                 WHERE stream_id = ANY(\(streams))
                   AND (type = 'notification-received' AND data->>'notificationType' = 'REFUND_REVERSED'
                        OR type = 'subscription-period-refund-reversed')
                   AND data->>'transactionId' = \(transactionId)
                   AND (data->>'signedDate')::timestamptz > \(date)
            ) OR EXISTS (
                -- An order's (the order of this transaction, among `streams`): signed by Apple
                -- after `date`; or, kept without that time (a backend's own, or written before the
                -- ledger kept it), the reversal of the `refunded` before it, which reverses a refund
                -- revoked no later than that `refunded` was recorded (a refund revoked after it is
                -- another, Apple's new one).
                SELECT 1 FROM events v
                 WHERE v.stream_id = ANY(\(streams)) AND v.type = 'refund-reversed'
                   AND coalesce(v.metadata->>'transactionId', \(transactionId)) = \(transactionId)
                   AND CASE WHEN v.metadata ? 'reversalSignedDate' THEN (v.metadata->>'reversalSignedDate')::timestamptz > \(date)
                            ELSE \(date) <= (SELECT r.recorded_at FROM events r
                                              WHERE r.stream_id = v.stream_id AND r.type = 'refunded' AND r.stream_version < v.stream_version
                                              ORDER BY r.stream_version DESC LIMIT 1) END
            ) OR EXISTS (
                SELECT 1 FROM events r
                 WHERE r.stream_id = ANY(\(streams))
                   AND (r.type = 'refunded'
                        OR r.type = 'subscription-period-refunded' AND r.data->>'transactionId' = \(transactionId)
                        OR r.type = 'notification-received' AND r.data->>'transactionId' = \(transactionId) AND r.data ? 'refund')
                   -- The log's times have three decimals, cut rather than rounded from a Double: one
                   -- Apple signed in milliseconds may read a millisecond early.
                   AND coalesce(r.data->>'revocationDate', r.data->'refund'->>'revocationDate')::timestamptz - \(date)
                       BETWEEN interval '-2 milliseconds' AND interval '2 milliseconds'
                   AND EXISTS (
                       SELECT 1 FROM events v
                        WHERE v.stream_id = r.stream_id AND v.stream_version > r.stream_version
                          AND (v.type = 'refund-reversed'
                               OR v.type = 'subscription-period-refund-reversed' AND v.data->>'transactionId' = \(transactionId)
                               OR v.type = 'notification-received' AND v.data->>'notificationType' = 'REFUND_REVERSED'
                                  AND v.data->>'transactionId' = \(transactionId)))
            )
            """, logger: database.logger)
        for try await found in rows.decode(Bool.self) { return found }
        return false
    }

    /// Whether subscription `subscription`'s period `periodKey` holds the refund revoked at `date`
    /// (within 2 ms, as the log's times are cut) with no reversal of the period after it: the
    /// same refund arriving by another way (a client's proof, then Apple's `REFUND`) is no second one.
    public func periodRefundStands(
        _ subscription: String, periodKey: String, revokedAt date: Date, in transaction: DatabaseTransaction
    ) async throws -> Bool {
        let stream = StreamID.subscription(subscription).rawValue
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT EXISTS (
                SELECT 1 FROM events r
                 WHERE r.stream_id = \(stream) AND r.type = 'subscription-period-refunded' AND r.data->>'periodKey' = \(periodKey)
                   AND (r.data->>'revocationDate')::timestamptz - \(date) BETWEEN interval '-2 milliseconds' AND interval '2 milliseconds'
                   AND NOT EXISTS (SELECT 1 FROM events v
                                    WHERE v.stream_id = r.stream_id AND v.stream_version > r.stream_version
                                      AND v.type = 'subscription-period-refund-reversed' AND v.data->>'periodKey' = \(periodKey)))
            """, logger: database.logger)
        for try await found in rows.decode(Bool.self) { return found }
        return false
    }

    /// The latest refund of subscription `subscription`'s period `periodKey` revoked after `date`
    /// and not reversed by a `REFUND_REVERSED` signed after it: its `subscription-period-refunded`
    /// body as stored, for a reversal Apple signed at `date` (of an earlier refund), which leaves
    /// this one standing.
    public func periodRefund(
        _ subscription: String, periodKey: String, revokedAfter date: Date, in transaction: DatabaseTransaction
    ) async throws -> Data? {
        let stream = StreamID.subscription(subscription).rawValue
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT r.data::text FROM events r
             WHERE r.stream_id = \(stream) AND r.type = 'subscription-period-refunded' AND r.data->>'periodKey' = \(periodKey)
               AND (r.data->>'revocationDate')::timestamptz > \(date)
               AND NOT EXISTS (SELECT 1 FROM events v
                                WHERE v.stream_id = r.stream_id AND v.type = 'subscription-period-refund-reversed'
                                  AND v.data->>'periodKey' = \(periodKey)
                                  AND (v.data->>'signedDate')::timestamptz > (r.data->>'revocationDate')::timestamptz)
             ORDER BY (r.data->>'revocationDate')::timestamptz DESC, r.stream_version
             LIMIT 1
            """, logger: database.logger)
        for try await body in rows.decode(String.self) { return Data(body.utf8) }
        return nil
    }

    /// The latest refund (by revocation date) of Apple transaction `transactionId` that `streams`
    /// (its own, its order's) hold, revoked after `date`: a `refunded` of its order, or a refund
    /// kept on a `notification-received` (one its order's state did not take, or of a pooled
    /// transaction), and not reversed by a `REFUND_REVERSED` Apple signed after it. Its body as
    /// stored, for a `REFUND_REVERSED` Apple signed at `date`, which reverses an earlier refund
    /// and leaves this one standing.
    public func refund(of transactionId: String, revokedAfter date: Date, on streams: [StreamID], in transaction: DatabaseTransaction) async throws -> Data? {
        let streams = streams.map(\.rawValue)
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT x.refund::text FROM (
                SELECT CASE type WHEN 'refunded' THEN data ELSE data->'refund' END AS refund, global_position FROM events
                 WHERE stream_id = ANY(\(streams))
                   AND (type = 'refunded'
                        OR type = 'notification-received' AND data->>'transactionId' = \(transactionId) AND data ? 'refund'
                           AND NOT coalesce((data->>'reversedBefore')::boolean, false))) x
             WHERE (x.refund->>'revocationDate')::timestamptz > \(date)
               -- Not one Apple reversed since (a REFUND_REVERSED signed after it, recorded already).
               AND NOT EXISTS (
                   SELECT 1 FROM events v
                    WHERE v.stream_id = ANY(\(streams))
                      AND (v.type = 'notification-received' AND v.data->>'notificationType' = 'REFUND_REVERSED'
                           AND v.data->>'transactionId' = \(transactionId)
                           AND (v.data->>'signedDate')::timestamptz > (x.refund->>'revocationDate')::timestamptz
                           OR v.type = 'refund-reversed'
                           AND (v.metadata->>'reversalSignedDate')::timestamptz > (x.refund->>'revocationDate')::timestamptz))
             ORDER BY (x.refund->>'revocationDate')::timestamptz DESC, x.global_position
             LIMIT 1
            """, logger: database.logger)
        for try await body in rows.decode(String.self) { return Data(body.utf8) }
        return nil
    }

    /// The first event of `stream`, if it has one, as the caller's transaction sees the log.
    public func firstEvent(of stream: StreamID, in transaction: DatabaseTransaction) async throws -> RecordedEvent? {
        let rows = try await transaction.connection.guardedQuery(
            "SELECT \(unescaped: Self.columns) FROM events WHERE stream_id = \(stream.rawValue) AND stream_version = 0",
            logger: database.logger)
        return try await Self.decode(rows).first
    }

    /// The global feed after `position`, in position order, gap-safe: an event is returned only
    /// once every transaction that could still commit a lower position has ended, so a reader
    /// that resumes after the last position it saw never skips an event.
    public func readAll(after position: Int64, limit: Int = 1000) async throws -> [RecordedEvent] {
        let limit = Self.clamp(limit)
        let rows = try await database.query(
            """
            SELECT \(unescaped: Self.columns) FROM events
            WHERE global_position > \(position) AND global_position <= events_safe_position()
            ORDER BY global_position LIMIT \(limit)
            """)
        return try await Self.decode(rows)
    }

    static let columns =
        "global_position, stream_id, stream_version, event_id, type, data::text, metadata::text, recorded_at"

    static func clamp(_ limit: Int) -> Int { min(max(limit, 1), maximumReadLimit) }

    static func decode(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [RecordedEvent] {
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
}
