import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// Step 3 of a write, and the loop that runs the three steps.
extension LedgerWriter {
    /// Reads, decides and stores `writes` on `connection`: each write's outcome, its refusal as a
    /// failure. `commit`: the routine commits before it answers (a group's own transaction), else
    /// it leaves the caller's transaction open. A write refused because what it was decided on
    /// moved since it was read is read and decided again, up to three times in all.
    /// When `commit` and a round after the first fails (a deadlock PostgreSQL broke, the
    /// connection lost), what earlier rounds stored stands: their outcomes are answered, and the
    /// writes left undecided get `RoundFailed`, for their caller to write again.
    static func write(
        _ writes: [Write], on connection: PostgresConnection, commit: Bool, database: Database, knowing given: Snapshot? = nil,
        remembered: Remembered? = nil
    ) async throws -> [Result<Written, any Error>] {
        var statement = Statement(connection: connection, logger: database.logger, leaseFirst: commit)
        var results = [Result<Written, any Error>?](repeating: nil, count: writes.count)
        var pending = Array(writes.indices)
        for round in 1...3 where !pending.isEmpty {
            do {
                let now = PostgresTime.now()
                let snapshot: Snapshot
                if round == 1, let given {
                    snapshot = given
                } else {
                    snapshot = try await read(pending.map { writes[$0] }, with: &statement, remembered: round == 1 ? remembered : nil)
                }
                var plans: [(index: Int, plan: Plan)] = []
                var refused: [(index: Int, error: any Error)] = []
                var again: [Int] = []
                for index in pending {
                    do {
                        plans.append((index, try plan(writes[index], on: snapshot, at: now.date)))
                    } catch where !snapshot.remembered.isDisjoint(with: writes[index].orderIDs) {
                        // Refused on a remembered order, which may have moved on without this writer
                        // (another server): decided again on the order as read now.
                        remembered?.forget(writes[index].orderIDs)
                        again.append(index)
                    } catch {
                        refused.append((index, error))
                    }
                }
                if !refused.isEmpty {
                    let stored = try await storedEvents(refused.flatMap { writes[$0.index].appends.flatMap(\.events) }, with: &statement)
                    for (index, error) in refused { results[index] = replay(of: writes[index], stored) ?? .failure(error) }
                }
                pending = again
                guard !plans.isEmpty else { continue }
                let verdicts = try await call(plans.map(\.plan), at: now, commit: commit, with: &statement)
                for ((index, plan), verdict) in zip(plans, verdicts) {
                    switch verdict {
                    case .done(let result):
                        results[index] = result
                        if case .success(let written) = result, !written.replayed { remembered?.remember(plan.ordersAfter.values) }
                    case .moved(let error):
                        remembered?.forget(writes[index].orderIDs)
                        if round < 3 { pending.append(index) } else { results[index] = .failure(error) }
                    }
                }
            } catch where commit && round > 1 {
                // What earlier rounds decided stands (stored, or refused for good): thrown, their
                // writes would be written again and answered as replays (an order just created
                // answered as none).
                for index in writes.indices where results[index] == nil {
                    remembered?.forget(writes[index].orderIDs)
                    results[index] = .failure(RoundFailed(error: error))
                }
                break
            }
        }
        return results.map { $0 ?? .failure(AppendError.invalidBatch("the write was not decided")) }
    }

    /// The statements of one write on its connection. On a group's own lease the first statement
    /// sent, when it finds the connection closed, lets `Database.withConnection` lease another
    /// (nothing reached PostgreSQL).
    struct Statement {
        let connection: PostgresConnection
        let logger: Logger
        var leaseFirst: Bool

        mutating func run(_ query: PostgresQuery) async throws -> [PostgresRow] {
            let future = connection.atomicallyGuardedQuery(query, logger: logger)
            defer { leaseFirst = false }
            return leaseFirst ? try await Database.first(try await future.get().rows) : try await future.get().rows
        }

        mutating func run<Prepared: PostgresPreparedStatement>(_ prepared: Prepared) async throws -> [Prepared.Row] {
            defer { leaseFirst = false }
            return leaseFirst
                ? try await Database.first(try await connection.atomicallyGuardedExecute(prepared, logger: logger))
                : try await connection.atomicallyGuardedExecute(prepared, logger: logger)
        }
    }

    /// A write left undecided by a round that failed after an earlier round of its group committed.
    struct RoundFailed: Error {
        let error: any Error
    }

    /// What the routine said of one write.
    enum Verdict {
        /// Stored (or a replay), or refused for good.
        case done(Result<Written, any Error>)
        /// Not stored: what it was decided on moved since it was read.
        case moved(any Error)
    }

    /// `CALL append_events(…)` with every plan, one write each: the routine's verdict on each.
    static func call(_ plans: [Plan], at now: (date: Date, microseconds: Int64), commit: Bool, with statement: inout Statement) async throws -> [Verdict] {
        // One entry per event, its write's and its stream's with it.
        var units: [Int32] = [], streams: [String] = [], expected: [Int64] = []
        var ids: [UUID] = [], types: [String] = [], data: [String] = [], metadata: [String] = []
        var claims: [String] = []
        var orders = ProjectionRows.OrderColumns()
        var transactions = ProjectionRows.TransactionColumns()
        for (offset, plan) in plans.enumerated() {
            let write = offset + 1
            for (append, version) in plan.appends {
                for event in append.events {
                    units.append(Int32(write))
                    streams.append(append.stream.rawValue)
                    expected.append(version.databaseValue ?? -2)
                    ids.append(event.id.uuid)
                    types.append(event.type)
                    data.append(String(decoding: event.data, as: UTF8.self))
                    metadata.append(String(decoding: event.metadata, as: UTF8.self))
                }
            }
            claims.append(plan.claim?.rawValue ?? "")
            for (row, isNew) in plan.orders { orders.append(row, write: write, isNew: isNew) }
            for (row, isNew) in plan.transactions { transactions.append(row, write: write, isNew: isNew) }
        }
        let (o, t) = (orders, transactions)
        // In the order of `AppendEventsCall.sql`'s parameters.
        let values: [any PostgresDynamicTypeEncodable] = [
            units, streams, expected, ids, types, data, metadata, claims,
            o.writes, o.isNew, o.ids, o.users, o.products, o.quantities, o.prices, o.currencies, o.tokens, o.states,
            o.versions, o.transactions, o.created, o.updated, o.queued, o.beforeRefund, o.failures, o.bundles,
            t.writes, t.isNew, t.ids, t.orders, t.users, t.products, t.purchased, t.environments, t.statuses, t.received,
            t.updated, t.originals, t.apps, t.tokens, t.matchedBy, t.verifications, t.bundles,
            t.storefronts, now.microseconds, commit,
        ]
        var binds = PostgresBindings(capacity: values.count)
        for value in values { binds.append(value) }
        guard let row = try await statement.run(AppendEventsCall(bindings: binds)).first else {
            throw AppendError.invalidBatch("the database answered nothing")
        }
        let (statuses, details, versions, positions) = row
        var verdicts: [Verdict] = []
        var event = 0
        for (offset, plan) in plans.enumerated() {
            let (status, detail) = (statuses[offset], details[offset])
            var appended: [Appended] = []
            for (index, (append, _)) in plan.appends.enumerated() {
                let range = event..<(event + append.events.count)
                event = range.upperBound
                guard status == "appended" || status == "replayed" else { continue }
                let stored = status == "appended"
                let recorded = stored ? zip(append.events, range).map { new, at in
                    RecordedEvent(position: positions[at], streamID: append.stream, streamVersion: versions[at], id: new.id,
                                  type: new.type, data: new.data, metadata: new.metadata, recordedAt: now.date)
                } : []
                appended.append(Appended(
                    stream: append.stream,
                    result: AppendResult(streamVersion: versions[range.upperBound - 1], positions: Array(positions[range]), replayed: !stored),
                    order: stored ? plan.ordersAfter[index] : nil, events: recorded))
            }
            switch status {
            case "appended", "replayed":
                verdicts.append(.done(.success(Written(appends: appended))))
            case "event-id-conflict":
                verdicts.append(.done(.failure(AppendError.eventIDConflict(EventID(UUID(uuidString: detail) ?? UUID())))))
            case "wrong-expected-version":
                // '<current version> <stream>' (a stream id may hold spaces, a version none).
                let (current, name) = detail.firstIndex(of: " ").map { (Int64(detail[..<$0]), String(detail[detail.index(after: $0)...])) } ?? (nil, "")
                let index = plan.appends.firstIndex { $0.append.stream.rawValue == name } ?? 0
                let stream = plan.appends[index].append.stream
                let callerExpected = index < plan.callerExpected.count ? plan.callerExpected[index] : .any
                let error = AppendError.wrongExpectedVersion(stream: stream, expected: callerExpected, current: current ?? ExpectedVersion.noStreamVersion)
                // The caller's own expectation is refused for good; the one the writer read is read again.
                verdicts.append(callerExpected == .any ? .moved(error) : .done(.failure(error)))
            case "claimed":
                verdicts.append(.moved(OrderLedgerError.duplicateTransaction(TransactionID(unchecked: detail))))
            default:
                verdicts.append(.done(.failure(AppendError.invalidBatch("the database answered \(status)"))))
            }
        }
        return verdicts
    }

    /// An event already in the log, and whether it is stored as the one given with its id.
    struct StoredEvent {
        let stream: StreamID
        let type: String
        let version: Int64
        let position: Int64
        let sameData: Bool
    }

    /// The events of `events` that are in the log, by id.
    static func storedEvents(_ events: [NewEvent], with statement: inout Statement) async throws -> [EventID: StoredEvent] {
        let rows = try await statement.run(
            """
            SELECT e.event_id, e.stream_id, e.type, e.stream_version, e.global_position, e.data = g.data
              FROM unnest(\(events.map(\.id.uuid))::uuid[], \(events.map { String(decoding: $0.data, as: UTF8.self) })::jsonb[]) AS g(id, data)
              JOIN events e ON e.event_id = g.id
            """)
        var stored: [EventID: StoredEvent] = [:]
        for row in rows {
            let (id, stream, type, version, position, same) = try row.decode((UUID, String, String, Int64, Int64, Bool).self)
            stored[EventID(id)] = StoredEvent(stream: StreamID(unchecked: stream), type: type, version: version, position: position, sameData: same)
        }
        return stored
    }

    /// The first answer again, for a write refused on the state it was decided on whose every
    /// event is stored as given: a retry of a write stored before its order moved on (promise 3).
    /// A conflict when one of its ids is stored as something else; nil when none is stored.
    static func replay(of write: Write, _ stored: [EventID: StoredEvent]) -> Result<Written, any Error>? {
        let events = write.appends.flatMap { append in append.events.map { (append.stream, $0) } }
        let found = events.compactMap { stream, event in stored[event.id].map { (stream, event, $0) } }
        guard !found.isEmpty else { return nil }
        if let other = found.first(where: { stream, event, stored in stored.stream != stream || stored.type != event.type || !stored.sameData }) {
            return .failure(AppendError.eventIDConflict(other.1.id))
        }
        guard found.count == events.count else { return .failure(AppendError.eventIDConflict(found[0].1.id)) }
        let appends = write.appends.map { append in
            let events = append.events.compactMap { stored[$0.id] }
            return Appended(
                stream: append.stream,
                result: AppendResult(streamVersion: events.map(\.version).max() ?? -1, positions: events.map(\.position), replayed: true),
                order: nil, events: [])
        }
        return .success(Written(appends: appends))
    }

    /// What a write that failed alone is refused with: a body PostgreSQL cannot store as JSON,
    /// the unique key a racing writer took.
    static func refusal(_ error: any Error, of write: Write) -> any Error {
        guard let error = error as? PSQLError, let state = error.sqlState else { return error }
        if let refusal = appRefusal(error, of: write) { return refusal }
        if state == .invalidTextRepresentation || state == .untranslatableCharacter {
            return AppendError.invalidBatch("data and metadata must be JSON that PostgreSQL can store (no \\u0000): \(error.serverMessage ?? state.raw)")
        }
        guard state == .uniqueViolation else { return error }
        switch error.serverInfo?[.constraintName] {
        case "app_account_tokens_key":
            for append in write.appends {
                for event in append.events {
                    if case .order(.created(let body)) = event.body { return OrderLedgerError.appAccountTokenTaken(body.appAccountToken) }
                }
            }
            return error
        case "events_event_id_key":
            let detail = error.serverInfo?[.detail] ?? ""
            let events = write.appends.flatMap(\.events)
            return AppendError.eventIDConflict(events.first { detail.contains($0.id.description) }?.id ?? events[0].id)
        case "apple_transactions_pkey", "apple_transactions_order_key":
            for append in write.appends {
                for event in append.events {
                    if case .order(.receiptReceived(let receipt)) = event.body { return OrderLedgerError.duplicateTransaction(receipt.transactionId) }
                }
            }
            return error
        default:
            return error
        }
    }
}

/// `CALL append_events(…)`, prepared once per connection: PostgreSQL parses and analyses the call
/// once, not at every group (a 47-argument CALL is planned as a utility statement each time it is
/// sent unprepared). Each parameter names the type its values are sent as; the bodies go as text
/// and become jsonb in the call.
struct AppendEventsCall: PostgresPreparedStatement {
    static let name = "ledger_append_events"
    static let sql = """
        CALL append_events($1::integer[], $2::text[], $3::bigint[], $4::uuid[], $5::text[], $6::text[]::jsonb[],
            $7::text[]::jsonb[], $8::text[],
            $9::integer[], $10::boolean[], $11::text[], $12::text[], $13::text[], $14::integer[], $15::text[], $16::text[],
            $17::uuid[], $18::text[], $19::bigint[], $20::text[], $21::bigint[], $22::bigint[], $23::bigint[], $24::text[],
            $25::text[], $26::text[],
            $27::integer[], $28::boolean[], $29::text[], $30::text[], $31::text[], $32::text[], $33::bigint[], $34::text[],
            $35::text[], $36::bigint[], $37::bigint[], $38::text[], $39::text[], $40::uuid[], $41::text[], $42::text[],
            $43::text[], $44::text[], $45::bigint, $46::boolean, NULL, NULL, NULL, NULL)
        """
    typealias Row = ([String], [String], [Int64], [Int64])

    let bindings: PostgresBindings

    func makeBindings() -> PostgresBindings { bindings }
    func decodeRow(_ row: PostgresRow) throws -> Row { try row.decode(Row.self) }
}

extension LedgerWriter {
    /// The refusal `append_events` raised for an app (its app checks, issue 39) or an Apple
    /// account known for another user (issue 41), if `error` is one.
    static func appRefusal(_ error: PSQLError, of write: Write) -> OrderLedgerError? {
        let detail = error.serverInfo?[.detail] ?? ""
        let bundle = write.appends.lazy.flatMap(\.events).compactMap { event -> BundleID? in
            if case .order(.created(let body)) = event.body { return body.bundleId }
            return nil
        }.first
        switch error.sqlState?.raw {
        case "LE391": return .bundleIDRequired
        case "LE392": return .unknownApp(bundle ?? BundleID(unchecked: detail))
        case "LE393": return .appRetired(bundle ?? BundleID(unchecked: detail))
        case "LE394": return .appMismatch(TransactionID(unchecked: detail))
        case "LE395": return .accountConflict(TransactionID(unchecked: detail))
        case "LE396": return UUID(uuidString: detail).map { .appAccountTokenTaken($0) }
        default: return nil
        }
    }
}
