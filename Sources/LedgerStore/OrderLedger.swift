import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// Orders on the event log: creating, appending through the state machine, reading. Each append
/// and its projection rows commit in one database transaction.
public struct OrderLedger: Sendable {
    public let database: Database
    public let store: EventStore
    let projection: OrderProjection
    let group: OrderGroupCommit

    public init(database: Database, store: EventStore) {
        self.database = database
        self.store = store
        self.projection = OrderProjection(logger: database.logger)
        self.group = OrderGroupCommit(database: database)
    }

    /// What an append did to an order.
    public struct Outcome: Sendable {
        public let order: Order
        /// False when this was a retry of an event already stored: nothing was appended.
        public let appended: Bool
        /// The order's whole history when the append knows it without reading it (a creation).
        public var events: [RecordedEvent]? = nil
    }

    /// The order group commit so far: groups written, events they took, events they appended
    /// (the others were written alone).
    public var groupCommitStatistics: (groups: Int, writes: Int, appended: Int) { group.statistics }

    /// Creates the order, or answers the existing one when the same order is created again.
    /// Concurrent creations and appends share one transaction (`OrderGroupCommit`); what the
    /// group does not take is done here alone.
    public func create(_ id: OrderID, _ body: OrderCreated, tokenGiven: Bool, metadata: Data) async throws -> Outcome {
        let event = OrderEvent.created(body)
        let newEvent = try NewEvent(type: event.type.rawValue, data: event.encodedData(), metadata: metadata)
        if case .appended(let order, let created) = try await group.write(.init(id: id, event: event, newEvent: newEvent, expected: nil)) {
            database.appended([newEvent.type], on: nil)
            return Outcome(order: order, appended: true, events: created.map { [$0] })
        }
        if let existing = try await order(id) {
            return try sameOrder(existing, body, tokenGiven: tokenGiven)
        }
        do {
            return try await appendAlone(id, event: event, newEvent: newEvent, expected: .noStream)
        } catch AppendError.wrongExpectedVersion {
            // Created meanwhile by a concurrent request: the same order, or a conflict.
            guard let existing = try await order(id) else { throw OrderDecisionError.noSuchOrder }
            return try sameOrder(existing, body, tokenGiven: tokenGiven)
        } catch let error as PSQLError where error.sqlState == "23505" {
            throw OrderLedgerError.appAccountTokenTaken(body.appAccountToken)
        }
    }

    private func sameOrder(_ existing: Order, _ body: OrderCreated, tokenGiven: Bool) throws -> Outcome {
        let same = existing.userId == body.userId && existing.productId == body.productId && existing.quantity == body.quantity
            && Self.sameDecimal(existing.price, body.price) && existing.currency == body.currency
            && (!tokenGiven || existing.appAccountToken == body.appAccountToken)
        guard same else { throw OrderDecisionError.orderExists(existing.orderId) }
        return Outcome(order: existing, appended: false)
    }

    static func sameDecimal(_ a: String?, _ b: String?) -> Bool {
        switch (a, b) {
        case (nil, nil): true
        case let (a?, b?): Decimal(string: a) == Decimal(string: b)
        default: false
        }
    }

    /// Appends one event through the state machine. A retry of an event id already stored with
    /// the same body answers the order as that event left it, whatever its state now. Concurrent
    /// appends to different orders share one transaction (`OrderGroupCommit`); what the group
    /// does not take is done here alone.
    public func append(
        _ id: OrderID, event: OrderEvent, eventID: EventID, expected: ExpectedVersion?, data: Data? = nil, metadata: Data
    ) async throws -> Outcome {
        // A body given is the one `event` was decoded from; else the order evolves by the event as stored.
        let (event, body) = try data.map { (event, $0) } ?? event.asStored()
        let newEvent = try NewEvent(id: eventID, type: event.type.rawValue, data: body, metadata: metadata)
        if case .appended(let order, _) = try await group.write(.init(id: id, event: event, newEvent: newEvent, expected: expected)) {
            database.appended([newEvent.type], on: nil)
            return Outcome(order: order, appended: true)
        }
        return try await appendAlone(id, event: event, newEvent: newEvent, expected: expected)
    }

    /// One event in a transaction of its own: lock the order, decide, append and write the rows.
    private func appendAlone(_ id: OrderID, event: OrderEvent, newEvent: NewEvent, expected: ExpectedVersion?) async throws -> Outcome {
        let eventID = newEvent.id
        let metadata = newEvent.metadata
        return try await database.transaction { connection in
            let (now, current) = try await projection.lockedOrder(id, on: connection)
            let currentVersion = current?.version ?? ExpectedVersion.noStreamVersion
            let decision = Order.decide(current, event)
            let refusal: (any Error)?
            if let expected, expected != .any, expected.databaseValue != currentVersion {
                refusal = AppendError.wrongExpectedVersion(stream: id.streamID, expected: expected, current: currentVersion)
            } else if case .failure(let error) = decision {
                refusal = error
            } else {
                refusal = nil
            }
            if let refusal {
                // A retry of an event stored before the order moved on is refused by both checks
                // above, yet must get its first answer. (When both pass, append_to_stream itself
                // finds a stored event id.)
                if let retry = try await retried(eventID, newEvent, in: id, on: connection) { return retry }
                throw refusal
            }
            let events = try decision.get()
            // `now` is the transaction's own time, which `recorded_at` holds too: a rebuild from
            // the log then reproduces these rows exactly.
            if let current, case .receiptReceived(let receipt) = event {
                try await recordLeavingPool(receipt, for: id, metadata: metadata, on: connection)
                let folded = Self.fold(events, onto: current, at: now)
                return try await appendAndClaim([newEvent], to: current, as: folded.order, receipt, status: folded.claimStatus, at: now, on: connection)
            }
            // With the order's row locked, the version the event takes is known beforehand.
            let version = (current?.version ?? ExpectedVersion.noStreamVersion) + 1
            guard let next = events.reduce(current, { Order.evolve($0, $1, orderID: id, version: version, at: now) }) else {
                throw OrderDecisionError.noSuchOrder
            }
            return try await appendAndSave([newEvent], to: current, as: next, at: now, on: connection)
        }
    }

    /// Appends `newEvents` after `current` (nil: a new stream) and, only if they were appended,
    /// writes `order`, the order they leave, with its transaction's status, in one statement.
    /// A retry of events already stored answers the order as it stood after them.
    private func appendAndSave(
        _ newEvents: [NewEvent], to current: Order?, as order: Order, at now: Date, on connection: PostgresConnection
    ) async throws -> Outcome {
        let expected = current.map { ExpectedVersion.exact($0.version) } ?? .noStream
        let query = OrderProjection.appendAndSaveQuery(newEvents, stream: order.orderId.streamID, expected: expected, order, at: now)
        let (result, _) = try await runAppend(query, newEvents, to: order.orderId.streamID, expected: expected, on: connection)
        guard !result.replayed else {
            return Outcome(order: try await orderAsOf(order.orderId, version: result.streamVersion, on: connection), appended: false)
        }
        return Outcome(order: order, appended: true)
    }

    /// Runs a statement that appends through `append_to_stream` and answers its rows with one
    /// more column (the claim's outcome, or NULL); answers the append's result and that column.
    private func runAppend(
        _ query: PostgresQuery, _ newEvents: [NewEvent], to stream: StreamID, expected: ExpectedVersion, on connection: PostgresConnection
    ) async throws -> (AppendResult, Bool?) {
        var statusRows: [EventStore.StatusRow] = []
        var extra: Bool?
        do {
            let rows = try await connection.guardedQuery(query, logger: database.logger)
            for try await (rowStatus, detail, id, rowVersion, position, flag) in rows.decode((String, String?, UUID?, Int64?, Int64?, Bool?).self) {
                statusRows.append(EventStore.StatusRow(status: rowStatus, detail: detail, eventID: id, version: rowVersion, position: position))
                extra = flag
            }
        } catch {
            throw EventStore.mapError(error, stream, expected, newEvents)
        }
        let result = try EventStore.answer(statusRows, stream, expected).get()
        database.appended(newEvents, by: result, on: connection)
        return (result, extra)
    }

    /// Appends events the ledger itself decided (receipts, notifications) to an order the caller
    /// has locked in its open transaction, through the same `decide` and `evolve` as any append,
    /// and writes the projection rows. Answers the order as the events leave it.
    func apply(
        _ events: [(OrderEvent, EventID)], to current: Order, at date: Date? = nil, metadata: Data, on connection: PostgresConnection
    ) async throws -> Order {
        var provisional: Order? = current
        var stored: [OrderEvent] = []
        var newEvents: [NewEvent] = []
        for (given, eventID) in events {
            let (event, data) = try given.asStored()
            for accepted in try Order.decide(provisional, event).get() {
                provisional = Order.evolve(provisional, accepted, orderID: current.orderId, version: current.version, at: current.updatedAt)
            }
            stored.append(event)
            newEvents.append(try NewEvent(id: eventID, type: event.type.rawValue, data: data, metadata: metadata))
        }
        let now: Date
        if let date { now = date } else { now = try await transactionTime(on: connection) }
        // With the order's row locked, the versions the events take are known beforehand.
        let folded = Self.fold(stored, onto: current, at: now)
        if let claimed = folded.claimed {
            return try await appendAndClaim(newEvents, to: current, as: folded.order, claimed, status: folded.claimStatus, at: now, on: connection).order
        }
        return try await appendAndSave(newEvents, to: current, as: folded.order, at: now, on: connection).order
    }

    /// `events` folded onto `current` with the versions that follow it: the order they leave,
    /// the transaction they claim (if any), and the status that claim's row ends in (`claimed`,
    /// or the order's state once later events moved it, as a replay reaches it event by event).
    static func fold(_ events: [OrderEvent], onto current: Order, at now: Date) -> (order: Order, claimed: ReceiptReceived?, claimStatus: String) {
        var order = current
        var claimed: ReceiptReceived?
        var movedSinceClaim = false
        for (offset, event) in events.enumerated() {
            order = Order.evolve(order, event, orderID: current.orderId, version: current.version + 1 + Int64(offset), at: now) ?? order
            if case .receiptReceived(let receipt) = event {
                claimed = receipt
                movedSinceClaim = false
            } else {
                movedSinceClaim = true
            }
        }
        return (order, claimed, movedSinceClaim ? order.state.rawValue : "claimed")
    }

    /// A transaction leaves the pool only by `transaction-matched` (DESIGN.md promise 8): an order
    /// event that claims a pooled transaction appends it too, in the same transaction. (If the
    /// claim then fails, both roll back.)
    private func recordLeavingPool(_ receipt: ReceiptReceived, for id: OrderID, metadata: Data, on connection: PostgresConnection) async throws {
        guard try await projection.pooledTransaction(receipt.transactionId, on: connection) != nil else { return }
        let matched = TransactionMatched(orderId: id, matchedBy: receipt.matchedBy, candidates: 1, rule: receipt.matchedBy.rawValue)
        let event = try NewEvent(
            id: ReceiptLedger.eventID("matched", receipt.transactionId.rawValue, id.rawValue), type: TransactionEventType.matched.rawValue,
            data: try LedgerJSON.encoder.encode(matched), metadata: metadata)
        _ = try await store.append([event], to: receipt.transactionId.streamID, expectedVersion: .any, on: connection)
    }

    /// A claim's events and projection rows in one statement (`append_to_stream`, then
    /// `save_order_and_claim` only if it appended). A transaction another order holds is refused
    /// by the claim's primary key: `duplicate-transaction`, and the caller's transaction rolls back.
    private func appendAndClaim(
        _ newEvents: [NewEvent], to current: Order, as order: Order, _ claimed: ReceiptReceived, status: String, at now: Date,
        on connection: PostgresConnection
    ) async throws -> Outcome {
        let stream = current.orderId.streamID
        let expected = ExpectedVersion.exact(current.version)
        let query = OrderProjection.appendSaveAndClaimQuery(newEvents, stream: stream, expected: expected, order, claimed, status: status, at: now)
        let (result, wasClaimed) = try await runAppend(query, newEvents, to: stream, expected: expected, on: connection)
        guard !result.replayed else {
            return Outcome(order: try await orderAsOf(current.orderId, version: result.streamVersion, on: connection), appended: false)
        }
        guard wasClaimed == true else { throw OrderLedgerError.duplicateTransaction(claimed.transactionId) }
        return Outcome(order: order, appended: true)
    }

    /// Creates an order inside the caller's transaction (a recovery order the reconciler makes
    /// for an orphan), through `decide` and `evolve` like any creation.
    func createLocked(_ id: OrderID, _ body: OrderCreated, eventID: EventID, at now: Date, metadata: Data, on connection: PostgresConnection) async throws -> Order {
        let event = OrderEvent.created(body)
        _ = try Order.decide(nil, event).get()
        guard let order = Order.evolve(nil, event, orderID: id, version: 0, at: now) else { throw OrderDecisionError.noSuchOrder }
        let newEvent = try NewEvent(id: eventID, type: event.type.rawValue, data: event.encodedData(), metadata: metadata)
        return try await appendAndSave([newEvent], to: nil, as: order, at: now, on: connection).order
    }

    /// The first answer again when `eventID` is stored as this same event of this order; nil
    /// when it is not stored; `event-id-conflict` when it is stored as something else.
    private func retried(_ eventID: EventID, _ event: NewEvent, in id: OrderID, on connection: PostgresConnection) async throws -> Outcome? {
        guard let stored = try await storedEvent(eventID, on: connection) else { return nil }
        guard stored.streamID == id.streamID, stored.type == event.type, try await sameJSON(stored.data, event.data, on: connection) else {
            throw AppendError.eventIDConflict(eventID)
        }
        return Outcome(order: try await orderAsOf(id, version: stored.streamVersion, on: connection), appended: false)
    }

    /// The order as it stood right after its event `version`: what the first answer to an append
    /// said, given again to its retries (DESIGN.md promise 3).
    private func orderAsOf(_ id: OrderID, version: Int64, on connection: PostgresConnection) async throws -> Order {
        let rows = try await connection.guardedQuery(
            """
            SELECT \(unescaped: EventStore.columns) FROM events
            WHERE stream_id = \(id.streamID.rawValue) AND stream_version <= \(version) ORDER BY stream_version
            """,
            logger: database.logger)
        var order: Order?
        for event in try await EventStore.decode(rows) {
            guard let type = OrderEventType(rawValue: event.type), let body = try? OrderEvent.decode(type: type, data: event.data) else { continue }
            order = Order.evolve(order, body, orderID: id, version: event.streamVersion, at: event.recordedAt)
        }
        guard let order else { throw OrderDecisionError.noSuchOrder }
        return order
    }

    /// The order as its projection row has it, or nil.
    public func order(_ id: OrderID) async throws -> Order? {
        try await database.withConnection { connection in try await Database.first(try await projection.order(id, on: connection)) }
    }

    /// Orders filtered by user, product and state (`open`: not finished, failed or refunded),
    /// oldest first, after the order id `after` (for paging).
    public func orders(userID: UserID?, productID: ProductID?, states: [OrderState]?, after: OrderID?, limit: Int) async throws -> [Order] {
        let states = states?.map(\.rawValue)
        let rows = try await database.query(
            """
            SELECT \(unescaped: OrderProjection.orderColumns) FROM orders
            WHERE (\(userID?.rawValue)::text IS NULL OR user_id = \(userID?.rawValue))
              AND (\(productID?.rawValue)::text IS NULL OR product_id = \(productID?.rawValue))
              AND (\(states)::text[] IS NULL OR state = ANY(\(states)::text[]))
              AND (\(after?.rawValue)::text IS NULL OR order_id > \(after?.rawValue))
            ORDER BY order_id LIMIT \(min(max(limit, 1), 1000))
            """)
        return try await OrderProjection.decodeOrders(rows)
    }

    private func storedEvent(_ id: EventID, on connection: PostgresConnection) async throws -> RecordedEvent? {
        let rows = try await connection.guardedQuery(
            "SELECT \(unescaped: EventStore.columns) FROM events WHERE event_id = \(id.uuid)", logger: database.logger)
        return try await EventStore.decode(rows).first
    }

    func transactionTime(on connection: PostgresConnection) async throws -> Date {
        let rows = try await connection.guardedQuery("SELECT now()", logger: database.logger)
        for try await now in rows.decode(Date.self) { return now }
        return Date()
    }

    private func sameJSON(_ stored: Data, _ sent: Data, on connection: PostgresConnection) async throws -> Bool {
        let rows = try await connection.guardedQuery(
            "SELECT \(String(decoding: stored, as: UTF8.self))::jsonb = \(String(decoding: sent, as: UTF8.self))::jsonb",
            logger: database.logger)
        for try await same in rows.decode(Bool.self) { return same }
        return false
    }
}

/// Refusals of the order ledger beyond the state machine, with stable codes.
public enum OrderLedgerError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The Apple transaction already belongs to another order.
    case duplicateTransaction(TransactionID)
    /// Another order already uses this appAccountToken.
    case appAccountTokenTaken(UUID)

    public var code: String {
        switch self {
        case .duplicateTransaction: "duplicate-transaction"
        case .appAccountTokenTaken: "app-account-token-taken"
        }
    }

    public var description: String {
        switch self {
        case .duplicateTransaction(let id): "Apple transaction \(id) already belongs to another order"
        case .appAccountTokenTaken(let token): "appAccountToken \(token.uuidString.lowercased()) already belongs to another order"
        }
    }
}
