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
            select: Self.select, execute: { [appended] batch in await Self.execute(batch, database, appended) })
    }

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

    private static func execute(_ batch: [GroupCommit<Write, Answer>.Pending], _ database: Database, _ appended: Tally) async {
        let writes = batch.map(\.work)
        let answers: [Answer]
        do {
            answers = try await database.withHeldConnection { connection in try await Self.write(writes, on: connection, logger: database.logger) }
        } catch {
            // A unique violation (a token or transaction taken meanwhile), a deadlock, a lost
            // connection: nothing of the group is known to be written, and each write alone finds
            // out what is stored (its event id makes it a safe retry) and answers accordingly.
            database.logger.debug("order group failed, writing each event alone", metadata: ["error": "\(String(reflecting: error))"])
            answers = Array(repeating: .alone, count: writes.count)
        }
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

    /// Reads the orders, decides each write, and appends what was accepted with one CALL that
    /// commits before it answers (two round trips for the group).
    private static func write(_ writes: [Write], on connection: PostgresConnection, logger: Logger) async throws -> [Answer] {
        let (read, known) = try await orders(writes, on: connection, logger: logger)
        var plans: [Plan] = []
        for (index, write) in writes.enumerated() {
            let current = read[write.id]
            let currentVersion = current?.version ?? ExpectedVersion.noStreamVersion
            if let expected = write.expected, expected != .any, expected.databaseValue != currentVersion { continue }
            guard case .success(let events) = Order.decide(current, write.event),
                  let next = events.reduce(current, { Order.evolve($0, $1, orderID: write.id, version: currentVersion + 1, at: Date()) })
            else { continue }
            var claim: ReceiptReceived?
            if case .receiptReceived(let receipt) = write.event {
                // A transaction the ledger knows (in the pool, or held) needs the single-order path.
                guard !known.contains(receipt.transactionId.rawValue) else { continue }
                claim = receipt
            }
            plans.append(Plan(write: index, current: current, events: events, order: next, claim: claim))
        }
        var answers = Array(repeating: Answer.alone, count: writes.count)
        guard !plans.isEmpty else { return answers }

        let events = EventStore.Columns(plans.map { writes[$0.write].newEvent })
        let streams = plans.map { writes[$0.write].id.streamID.rawValue }
        let expected = plans.map(\.expected)
        let orders = JSONText.array(plans.enumerated().map { orderRow($0.offset + 1, $0.element.order, claims: $0.element.claim != nil) })
        let claims = JSONText.array(plans.enumerated().compactMap { offset, plan in plan.claim.map { claimRow(offset + 1, plan.order, $0) } })
        let rows = try await connection.atomicallyGuardedQuery(
            """
            CALL append_orders_durably(\(streams), \(expected), \(events.ids), \(events.types), \(events.data)::jsonb[],
                                       \(events.metadata)::jsonb[], \(orders)::jsonb,
                                       \(claims)::jsonb, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
            """,
            logger: logger
        ).get().rows
        let columns = ([Int32], [String], [Int64], [Int64], [String], [String], Date).self
        for try await (appends, statuses, versions, positions, data, metadata, now) in PooledRows(rows: rows).decode(columns) {
            for row in appends.indices where statuses[row] == "appended" {
                let plan = plans[Int(appends[row]) - 1]
                let write = writes[plan.write]
                let created = versions[row] == 0
                    ? RecordedEvent(
                        position: positions[row], streamID: write.id.streamID, streamVersion: 0, id: write.newEvent.id,
                        type: write.newEvent.type, data: Data(data[row].utf8), metadata: Data(metadata[row].utf8), recordedAt: now)
                    : nil
                answers[plan.write] = .appended(plan.order(at: now, id: write.id), created: created)
            }
        }
        return answers
    }

    /// The writes' orders as their rows are now (not locked: the CALL refuses an order that moved
    /// on), each row with which of the claimed transactions the ledger already knows, in one round
    /// trip. With no row there is nothing to claim for: a receipt needs its order.
    private static func orders(
        _ writes: [Write], on connection: PostgresConnection, logger: Logger
    ) async throws -> ([OrderID: Order], Set<String>) {
        let ids = writes.map(\.id.rawValue)
        let transactions = writes.compactMap(\.transaction?.rawValue)
        let rows = try await Database.first(try await connection.atomicallyGuardedQuery(
            """
            SELECT \(unescaped: OrderProjection.orderColumns),
                   ARRAY(SELECT transaction_id FROM apple_transactions WHERE transaction_id = ANY(\(transactions)))
            FROM orders WHERE order_id = ANY(\(ids))
            """,
            logger: logger
        ).get().rows)
        var known: Set<String> = []
        var orders: [OrderID: Order] = [:]
        for try await (id, user, product, quantity, price, currency, token, state, version, transaction, created, updated, queued, beforeRefund, failure, knownTransactions)
            in PooledRows(rows: rows).decode((String, String, String, Int, String?, String?, UUID, String, Int64, String?, Date, Date, Date?, String?, String?, [String]).self) {
            let order = OrderProjection.makeOrder((id, user, product, quantity, price, currency, token, state, version, transaction, created, updated, queued, beforeRefund, failure))
            orders[order.orderId] = order
            known = Set(knownTransactions)
        }
        return (orders, known)
    }
}

/// A time as PostgreSQL stores it (and as postgres-nio sends a `Date`): whole microseconds since
/// 2000-01-01 UTC, so that a row written from JSON equals one written from a bound `Date`.
private func postgresMicroseconds(_ date: Date) -> Int64 {
    Int64(date.timeIntervalSince(Date(timeIntervalSince1970: 946_684_800)) * 1_000_000)
}

/// An `orders` row as `append_orders_durably` reads it from JSON (the times it sets itself left
/// out), written with `JSONText`: JSONEncoder took 5% of the server's CPU here. `claims`: the
/// append claims a transaction (its row is inserted, not updated).
private func orderRow(_ n: Int, _ order: Order, claims: Bool) -> String {
    var json = JSONText()
    json.add("n", n)
    json.add("order_id", order.orderId.rawValue)
    json.add("user_id", order.userId.rawValue)
    json.add("product_id", order.productId.rawValue)
    json.add("quantity", order.quantity)
    json.add("price", order.price)
    json.add("currency", order.currency)
    json.add("app_account_token", order.appAccountToken.uuidString)
    json.add("state", order.state.rawValue)
    json.add("version", order.version)
    json.add("transaction_id", order.transactionId?.rawValue)
    json.add("created_at", postgresMicroseconds(order.createdAt))
    json.add("queued_at", integer: order.queuedAt.map(postgresMicroseconds))
    json.add("state_before_refund", order.stateBeforeRefund?.rawValue)
    json.add("failure_reason", order.failureReason)
    json.add("claims", claims)
    return json.result
}

/// An `apple_transactions` row a receipt claims, as `append_orders_durably` reads it from JSON.
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
