import Foundation
import LedgerCore
import Logging
import PostgresNIO
import Synchronization

/// Group commit for order events: events for different orders that arrive together are decided
/// and appended in one database transaction instead of one transaction each: read the orders,
/// decide each event, then one CALL locks the orders, appends every event with the version it was
/// decided on, writes the projection rows and commits (docs/architecture.md, "Order events in
/// groups").
///
/// The group takes only the plain case. Anything else (a refusal, an expected version that does
/// not match, a retried event id, a transaction the ledger already knows, a statement error) is
/// answered `alone`: nothing was written for it, and the caller takes the single-order path,
/// which gives every answer, refusal and retry exactly as before.
///
/// The writer remembers the orders its groups left, and decides on them without reading them
/// again: the CALL takes an event only while its order's stream is still at the version decided
/// on, so an order another instance or the single-order path moved on is refused there and
/// written alone, and forgotten. A creation is decided on no order without a read (the CALL
/// refuses it when the stream exists); only orders the writer does not know are read.
final class OrderGroupCommit: Sendable {
    /// One order event waiting for its group.
    struct Write: Sendable {
        let id: OrderID
        let event: OrderEvent
        let newEvent: NewEvent
        /// What the client expected the order's version to be (nil or `.any`: no check).
        let expected: ExpectedVersion?

        var transaction: TransactionID? {
            if case .receiptReceived(let receipt) = event { return receipt.transactionId }
            return nil
        }
    }

    /// What the group did with one write.
    enum Answer: Sendable {
        /// Appended and committed: the order as it left it; for a creation, the stored event.
        case appended(Order, created: RecordedEvent?)
        /// Not written: take the single-order path.
        case alone
    }

    /// A group holds at most this many orders (one transaction's locks and one statement's rows).
    static let maximumOrdersPerGroup = 256

    private let queue: GroupCommit<Write, Answer>
    /// How many writes groups appended (the others were answered `alone`).
    private let appended = Tally()

    private final class Tally: Sendable {
        let count = Atomic<Int>(0)
    }

    /// The orders as the writer's last groups left them (each only a hint: the CALL checks its
    /// version), at most `capacity` of them.
    final class Remembered: Sendable {
        static let capacity = 50_000
        private let orders = Mutex<[OrderID: Order]>([:])

        func orders(_ ids: some Sequence<OrderID>) -> [OrderID: Order] {
            orders.withLock { known in
                var found: [OrderID: Order] = [:]
                for id in ids { if let order = known[id] { found[id] = order } }
                return found
            }
        }

        func remember(_ order: Order) {
            orders.withLock { known in
                if known.count >= Self.capacity { known.removeAll(keepingCapacity: true) }
                known[order.orderId] = order
            }
        }

        func forget(_ ids: some Sequence<OrderID>) {
            orders.withLock { known in for id in ids { known.removeValue(forKey: id) } }
        }
    }

    init(database: Database) {
        self.queue = GroupCommit(
            // One writer: a second one (measured with `ledger bench http`, again with the writer
            // on the connections' loop) made groups half as large, each CALL as long, and fewer
            // events per second. High priority: HTTP requests queue a lot of work of their own, and
            // a writer behind it all made groups wait (2,863 → 3,674 events/s at 32 clients). On
            // the connections' event loop (`database.writerExecutor`, as `ledger serve` runs) its
            // round trips resume it without waiting for a thread of the global executor, which
            // the HTTP handlers keep busy (about 3,000 → 4,600-5,000 events/s at 32 clients).
            maximumWriters: 1, yieldsBetweenBatches: AppendBatcher.yieldsBetweenBatches, writerPriority: .high,
            writerExecutor: database.writerExecutor,
            session: { groups in await database.holdingConnection(groups) },
            select: Self.select, execute: { [appended, remembered] batch in await Self.execute(batch, database, appended, remembered) })
    }

    private let remembered = Remembered()

    /// Groups written, writes they took, and writes they appended.
    var statistics: (groups: Int, writes: Int, appended: Int) {
        let statistics = queue.statistics
        return (statistics.batches, statistics.items, appended.count.load(ordering: .relaxed))
    }

    func write(_ write: Write) async throws -> Answer {
        try await queue.submit(write)
    }

    /// The oldest writes with one write per order and per Apple transaction: a later write for
    /// the same order waits for the next group, and then sees this one's result.
    private static func select(_ pending: [Write]) -> [Int] {
        var orders = Set<OrderID>()
        var transactions = Set<TransactionID>()
        var chosen: [Int] = []
        for (index, write) in pending.enumerated() where chosen.count < maximumOrdersPerGroup {
            guard !orders.contains(write.id) else { continue }
            if let transaction = write.transaction {
                guard transactions.insert(transaction).inserted else { continue }
            }
            orders.insert(write.id)
            chosen.append(index)
        }
        return chosen
    }

    private static func execute(
        _ batch: [GroupCommit<Write, Answer>.Pending], _ database: Database, _ appended: Tally, _ remembered: Remembered
    ) async {
        let writes = batch.map(\.work)
        let answers: [Answer]
        do {
            answers = try await database.withHeldConnection { connection in
                try await Self.write(writes, remembered: remembered, on: connection, logger: database.logger)
            }
        } catch {
            // A unique violation (a token, event id or stream version taken meanwhile), a
            // deadlock, a lost connection: nothing of the group is known to be written, and each
            // write alone finds out what is stored (its event id makes it a safe retry) and
            // answers accordingly.
            database.logger.debug("order group failed, writing each event alone", metadata: ["error": "\(String(reflecting: error))"])
            answers = Array(repeating: .alone, count: writes.count)
        }
        // What goes alone may change its order without this writer: decide on it afresh next time.
        remembered.forget(zip(writes, answers).compactMap { write, answer in
            if case .alone = answer { write.id } else { nil }
        })
        let appendedCount = answers.count { if case .appended = $0 { true } else { false } }
        appended.count.add(appendedCount, ordering: .relaxed)
        for (pending, answer) in zip(batch, answers) { pending.continuation.resume(returning: answer) }
    }

    /// One event decided for the group: the order it was decided on, the events `decide` gave,
    /// the order they leave (its times are the write's, set when the write answers), the claim.
    private struct Plan {
        let write: Int
        let current: Order?
        let events: [OrderEvent]
        let order: Order
        let claim: ReceiptReceived?

        var expected: Int64 { current?.version ?? ExpectedVersion.noStreamVersion }

        /// The order as the events leave it at `date`, the time their transaction recorded.
        func order(at date: Date, id: OrderID) -> Order {
            events.reduce(current) { Order.evolve($0, $1, orderID: id, version: expected + 1, at: date) } ?? order
        }
    }

    /// Decides each write on its order as this writer left it (else as read now; a creation on
    /// no order) and appends what was accepted with one CALL that commits before it answers:
    /// one round trip for the group when the writer knows its orders, two when it does not.
    private static func write(
        _ writes: [Write], remembered: Remembered, on connection: PostgresConnection, logger: Logger
    ) async throws -> [Answer] {
        var current = remembered.orders(writes.map(\.id))
        var statementsSent = false
        /// A statement of the group; the lease's first one, when a connection found closed before
        /// it was sent, leases another (nothing reached PostgreSQL).
        func send<T>(_ statement: () async throws -> T) async throws -> T {
            defer { statementsSent = true }
            return statementsSent ? try await statement() : try await Database.first(try await statement())
        }
        let unknown = Set(writes.filter { write in
            if case .created = write.event { return false }
            return current[write.id] == nil
        }.map(\.id))
        if !unknown.isEmpty {
            current.merge(try await send { try await orders(Array(unknown), on: connection, logger: logger) }) { remembered, _ in remembered }
        }
        var decided = writes.indices.map { plan($0, writes[$0], current[writes[$0].id]) }
        // A remembered order refused here may have moved on by another path of this process
        // (a verified receipt, a notification, the reconciler, support), which appends alone:
        // read it and decide again, rather than send the event alone too. (What is still refused
        // goes alone, and is forgotten then.)
        let stale = writes.indices.filter { decided[$0] == nil && current[writes[$0].id] != nil && !unknown.contains(writes[$0].id) }
        if !stale.isEmpty {
            let ids = Array(Set(stale.map { writes[$0].id }))
            let fresh = try await send { try await orders(ids, on: connection, logger: logger) }
            for id in ids { current[id] = fresh[id] }
            for index in stale { decided[index] = plan(index, writes[index], current[writes[index].id]) }
        }
        let plans = decided.compactMap { $0 }
        var answers = Array(repeating: Answer.alone, count: writes.count)
        guard !plans.isEmpty else { return answers }

        let events = EventStore.Columns(plans.map { writes[$0.write].newEvent })
        let rows = GroupOrderRows(plans.map(\.order))
        let claims = plans.map { $0.claim?.transactionId.rawValue ?? "" }
        let claimRows = JSONText.array(plans.enumerated().compactMap { offset, plan in plan.claim.map { claimRow(offset + 1, plan.order, $0) } })
        let result = try await send { try await connection.atomicallyGuardedQuery(
            """
            CALL append_order_group(\(rows.ids), \(plans.map { writes[$0.write].id.streamID.rawValue }), \(plans.map(\.expected)),
                \(events.ids), \(events.types), \(events.data)::jsonb[], \(events.metadata)::jsonb[],
                \(rows.users), \(rows.products), \(rows.quantities), \(rows.prices), \(rows.currencies), \(rows.tokens),
                \(rows.states), \(rows.transactions), \(rows.queued), \(rows.queuedAt), \(rows.statesBeforeRefund),
                \(rows.failureReasons), \(claims), \(claimRows)::jsonb, NULL, NULL, NULL, NULL, NULL)
            """,
            logger: logger
        ).get().rows }
        let columns = ([String], [Int64], [String], [String], Date).self
        for try await (statuses, positions, data, metadata, now) in PooledRows(rows: result).decode(columns) {
            for (row, plan) in plans.enumerated() where statuses[row] == "appended" {
                let write = writes[plan.write]
                let created = plan.expected == ExpectedVersion.noStreamVersion
                    ? RecordedEvent(
                        position: positions[row], streamID: write.id.streamID, streamVersion: 0, id: write.newEvent.id,
                        type: write.newEvent.type, data: Data(data[row].utf8), metadata: Data(metadata[row].utf8), recordedAt: now)
                    : nil
                let order = plan.order(at: now, id: write.id)
                remembered.remember(order)
                answers[plan.write] = .appended(order, created: created)
            }
        }
        return answers
    }

    /// The write decided on `order`: nil when the group cannot take it (an expected version that
    /// does not match, a refusal of the state machine).
    private static func plan(_ index: Int, _ write: Write, _ order: Order?) -> Plan? {
        let currentVersion = order?.version ?? ExpectedVersion.noStreamVersion
        if let expected = write.expected, expected != .any, expected.databaseValue != currentVersion { return nil }
        guard case .success(let events) = Order.decide(order, write.event),
              let next = events.reduce(order, { Order.evolve($0, $1, orderID: write.id, version: currentVersion + 1, at: Date()) })
        else { return nil }
        var claim: ReceiptReceived?
        if case .receiptReceived(let receipt) = write.event { claim = receipt }
        return Plan(write: index, current: order, events: events, order: next, claim: claim)
    }

    /// The orders as their rows are now (not locked: the CALL refuses an order that moved on),
    /// in one round trip. With no row there is nothing to decide on: the write goes alone.
    private static func orders(_ ids: [OrderID], on connection: PostgresConnection, logger: Logger) async throws -> [OrderID: Order] {
        let rows = try await connection.atomicallyGuardedQuery(
            "SELECT \(unescaped: OrderProjection.orderColumns) FROM orders WHERE order_id = ANY(\(ids.map(\.rawValue)))",
            logger: logger
        ).get().rows
        var orders: [OrderID: Order] = [:]
        for order in try await OrderProjection.decodeOrders(PooledRows(rows: rows)) { orders[order.orderId] = order }
        return orders
    }
}

/// The order rows a group leaves, as the typed arrays `append_order_group` takes: '' for text
/// that is absent (no identifier, price, currency or failure reason is empty), a flag beside the
/// queued time.
private struct GroupOrderRows {
    var ids: [String] = [], users: [String] = [], products: [String] = [], quantities: [Int32] = []
    var prices: [String] = [], currencies: [String] = [], tokens: [UUID] = [], states: [String] = []
    var transactions: [String] = [], queued: [Bool] = [], queuedAt: [Date] = []
    var statesBeforeRefund: [String] = [], failureReasons: [String] = []

    init(_ orders: [Order]) {
        for order in orders {
            ids.append(order.orderId.rawValue)
            users.append(order.userId.rawValue)
            products.append(order.productId.rawValue)
            quantities.append(Int32(order.quantity))
            prices.append(order.price ?? "")
            currencies.append(order.currency ?? "")
            tokens.append(order.appAccountToken)
            states.append(order.state.rawValue)
            transactions.append(order.transactionId?.rawValue ?? "")
            queued.append(order.queuedAt != nil)
            queuedAt.append(order.queuedAt ?? order.createdAt)
            statesBeforeRefund.append(order.stateBeforeRefund?.rawValue ?? "")
            failureReasons.append(order.failureReason ?? "")
        }
    }
}

/// A time as PostgreSQL stores it (and as postgres-nio sends a `Date`): whole microseconds since
/// 2000-01-01 UTC, so that a row written from JSON equals one written from a bound `Date`.
private func postgresMicroseconds(_ date: Date) -> Int64 {
    Int64(date.timeIntervalSince(Date(timeIntervalSince1970: 946_684_800)) * 1_000_000)
}

/// An `apple_transactions` row a receipt claims, as `append_order_group` reads it from JSON.
private func claimRow(_ n: Int, _ order: Order, _ receipt: ReceiptReceived) -> String {
    var json = JSONText()
    json.add("n", n)
    json.add("transaction_id", receipt.transactionId.rawValue)
    json.add("order_id", order.orderId.rawValue)
    json.add("user_id", order.userId.rawValue)
    json.add("product_id", receipt.productId.rawValue)
    json.add("purchase_date", postgresMicroseconds(receipt.purchaseDate))
    json.add("environment", receipt.environment)
    json.add("original_transaction_id", receipt.originalTransactionId)
    json.add("app_transaction_id", receipt.appTransactionId)
    json.add("app_account_token", receipt.appAccountToken?.uuidString)
    json.add("matched_by", receipt.matchedBy.rawValue)
    return json.result
}
