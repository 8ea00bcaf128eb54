import Foundation
import LedgerCore
import LedgerJSON
import Logging
import PostgresNIO
import Synchronization

/// Steps 1 and 2 of a write: reading what it touches, and deciding it.
extension LedgerWriter {
    /// The orders the writer's own groups left, as they left them: where its next groups start
    /// deciding, instead of reading them again (at most `capacity`, forgotten all at once when
    /// full). Only a hint: `append_events` refuses a write decided on an order that moved since
    /// (by another server, or by this one's writes in callers' transactions, which forget what
    /// they touch), and it is then read again.
    final class Remembered: Sendable {
        static let capacity = 50_000
        private let known = Mutex<[OrderID: Order]>([:])

        func orders(_ ids: [OrderID]) -> [OrderID: Order] {
            known.withLock { known in
                var found: [OrderID: Order] = [:]
                for id in ids { if let order = known[id] { found[id] = order } }
                return found
            }
        }

        func remember(_ orders: some Sequence<Order>) {
            known.withLock { known in
                for order in orders {
                    if known.count >= Self.capacity { known.removeAll(keepingCapacity: true) }
                    known[order.orderId] = order
                }
            }
        }

        func forget(_ ids: some Sequence<OrderID>) {
            known.withLock { known in for id in ids { known.removeValue(forKey: id) } }
        }
    }

    /// The orders and Apple transactions some writes touch, as read before deciding them. A
    /// snapshot is only where deciding starts: `append_events` refuses a write whose streams or
    /// claim moved since, and the writer then reads again.
    public struct Snapshot: Sendable {
        var orders: [OrderID: Order] = [:]
        var transactions: [TransactionID: AppleTransactionRecord] = [:]
        /// The version of each known transaction's stream (-1: it has none).
        var transactionVersions: [TransactionID: Int64] = [:]
        /// The orders taken from what the writer remembers rather than read.
        var remembered: Set<OrderID> = []

        public func order(_ id: OrderID) -> Order? { orders[id] }
        public func transaction(_ id: TransactionID) -> AppleTransactionRecord? { transactions[id] }
    }

    /// A write as decided: what to store, and what to check first.
    struct Plan {
        /// The appends to store, each with the version it was decided on (or the caller's, for a
        /// stream no projection reads), then `transaction-matched` for a claim from the pool.
        var appends: [(append: Append, expected: ExpectedVersion)] = []
        /// The version the caller expected of each of its appends, to tell a refusal it asked
        /// for from a stream that moved since it was read.
        var callerExpected: [ExpectedVersion] = []
        /// The rows the write leaves, and whether each is new.
        var orders: [(row: Order, isNew: Bool)] = []
        var transactions: [(row: AppleTransactionRecord, isNew: Bool)] = []
        /// A transaction claimed while the ledger did not know it: still unknown when stored.
        var claim: TransactionID?
        /// The order each order append leaves, by append.
        var ordersAfter: [Int: Order] = [:]
    }

    /// Reads the orders and Apple transactions `writes` touch. With `remembered` (a group's first
    /// try), only what deciding cannot start without: an order the writer does not remember
    /// (none for a creation, decided on no order) and a transaction's stream appended to; a
    /// transaction claimed is taken for unknown. `append_events` refuses a write for which any of
    /// this was wrong, and it is then read again in full.
    static func read(_ writes: [Write], with statement: inout Statement, remembered: Remembered? = nil) async throws -> Snapshot {
        var orderIDs: [OrderID] = []
        var transactionIDs: [TransactionID] = []
        for write in writes {
            for append in write.appends {
                if let id = append.stream.orderID {
                    if case .order(.created)? = append.events.first?.body, remembered != nil { continue }
                    orderIDs.append(id)
                }
                if let id = append.stream.transactionID { transactionIDs.append(id) }
                for event in append.events {
                    // The rows an order's events may change (`OrderEvent.touchedTransaction`): the one
                    // a receipt claims or an undone pairing releases, taken for unknown on a group's
                    // first try; the one a `verified` names, read always (the routine would not tell
                    // a row that was not read from one that did not change), unless the write's own
                    // receipt claims it, whose row the plan has.
                    guard case .order(let event) = event.body, let id = event.touchedTransaction else { continue }
                    if case .verified = event {
                        if !write.claims(id) { transactionIDs.append(id) }
                    } else if remembered == nil {
                        transactionIDs.append(id)
                    }
                }
            }
        }
        let known = remembered?.orders(orderIDs) ?? [:]
        var snapshot = try await read(orders: orderIDs.filter { known[$0] == nil }, transactions: transactionIDs, with: &statement)
        snapshot.orders.merge(known) { read, _ in read }
        snapshot.remembered = Set(known.keys)
        return snapshot
    }

    /// Reads orders and Apple transactions (with their streams' versions) in one round trip
    /// (none when there is nothing to lock or read), after taking the locks of `locking`.
    static func read(
        locking: [StreamID] = [], orders orderIDs: [OrderID], transactions transactionIDs: [TransactionID], with statement: inout Statement
    ) async throws -> Snapshot {
        let orderIDs = orderIDs.map(\.rawValue)
        let transactionIDs = transactionIDs.map(\.rawValue)
        var snapshot = Snapshot()
        guard !locking.isEmpty || !orderIDs.isEmpty || !transactionIDs.isEmpty else { return snapshot }
        let read = ReadRows(locking: locking.map(\.rawValue), orderIDs: orderIDs, transactionIDs: transactionIDs)
        for row in try await statement.run(read) {
            let cells = row.makeRandomAccess()
            if var order = try ProjectionRows.order(cells, at: 0) {
                order.environment = try cells[ProjectionRows.orderColumnCount + ProjectionRows.transactionColumnCount + 1].decode(String?.self)
                snapshot.orders[order.orderId] = order
            } else if let transaction = try ProjectionRows.transaction(cells, at: ProjectionRows.orderColumnCount) {
                snapshot.transactions[transaction.transactionId] = transaction
                let version = ProjectionRows.orderColumnCount + ProjectionRows.transactionColumnCount
                snapshot.transactionVersions[transaction.transactionId] = try cells[version].decode(Int64.self)
            }
        }
        return snapshot
    }

    /// `read_for_write` (`sql/routines/read_for_write.sql`), prepared once per connection, its
    /// rows as the columns of `ProjectionRows`, then an order's transaction's environment (so an
    /// answer about the order shows it; one index lookup, outside the routine).
    struct ReadRows: PostgresPreparedStatement {
        static let name = "ledger_read_for_write"
        static let sql = """
            SELECT \(columns(ProjectionRows.orderColumns, of: "r.o")), \(columns(ProjectionRows.transactionColumns, of: "r.t")),
                   r.transaction_version,
                   (SELECT x.environment FROM apple_transactions x WHERE x.transaction_id = (r.o).transaction_id)
              FROM read_for_write($1::text[], $2::text[], $3::text[]) AS r
            """
        typealias Row = PostgresRow

        let locking: [String]
        let orderIDs: [String]
        let transactionIDs: [String]

        func makeBindings() -> PostgresBindings {
            var bindings = PostgresBindings(capacity: 3)
            bindings.append(locking)
            bindings.append(orderIDs)
            bindings.append(transactionIDs)
            return bindings
        }

        /// `order_id, price::text` as the fields of the row `row`: `(r.o).order_id, (r.o).price::text`.
        private static func columns(_ list: String, of row: String) -> String {
            list.split(separator: ",").map { "(\(row)).\($0.trimmingCharacters(in: .whitespacesAndNewlines))" }.joined(separator: ", ")
        }
    }

    /// Decides `write` on `snapshot` at `now`: what to store; throws why not.
    static func plan(_ write: Write, on snapshot: Snapshot, at now: Date) throws -> Plan {
        var plan = Plan()
        // The transactions this write changes, over the snapshot's (a copy of the snapshot's
        // dictionary per write would cost a group of many writes the square of its size).
        var changed: [TransactionID: AppleTransactionRecord] = [:]
        func transaction(_ id: TransactionID) -> AppleTransactionRecord? { changed[id] ?? snapshot.transactions[id] }
        /// A row the write leaves: one entry per transaction, the last row it leaves.
        func leave(_ row: AppleTransactionRecord, isNew: Bool) {
            if let index = plan.transactions.firstIndex(where: { $0.row.transactionId == row.transactionId }) {
                plan.transactions[index].row = row
            } else {
                plan.transactions.append((row, isNew))
            }
            changed[row.transactionId] = row
        }
        var streams = Set<StreamID>()
        let ids = write.appends.flatMap { $0.events.map(\.id) }
        guard Set(ids).count == ids.count else { throw AppendError.invalidBatch("an event id appears twice in one write") }
        for (index, append) in write.appends.enumerated() {
            guard streams.insert(append.stream).inserted else {
                throw AppendError.invalidBatch("a write appends to stream \(append.stream) once")
            }
            guard !append.events.isEmpty else { throw AppendError.invalidBatch("a batch holds at least one event") }
            plan.callerExpected.append(append.expected)
            if let id = append.stream.orderID {
                let current = snapshot.orders[id]
                if index == 0, let condition = write.condition {
                    guard let current, condition(current) else { throw WriteConditionFailed() }
                }
                let version = current?.version ?? ExpectedVersion.noStreamVersion
                if let refusal = expectedRefusal(append, version) { throw refusal }
                var order = current
                for (offset, event) in append.events.enumerated() {
                    guard case .order(let orderEvent) = event.body else {
                        throw AppendError.invalidBatch("an order's stream takes order events, not \(event.type)")
                    }
                    if case .failure(let refusal) = Order.decide(order, orderEvent) { throw refusal }
                    if case .verified(let verified) = orderEvent, let named = verified.transactionId,
                       let own = order?.transactionId, named != own {
                        throw OrderLedgerError.verifiedOtherTransaction(named, order: own)
                    }
                    let claimed = orderEvent.touchedTransaction.flatMap(transaction)
                    if case .receiptReceived(let receipt) = orderEvent {
                        if let known = claimed {
                            // Another app's transaction is refused as that before anything else of it
                            // (held, its product, its quantity) is told (docs/apps.md); the append
                            // routine refuses it too (LE394).
                            if let app = known.bundleId, let orderApp = order?.bundleId, app != orderApp {
                                throw OrderLedgerError.appMismatch(receipt.transactionId)
                            }
                            // Held for support (an Apple-account conflict): support's pairing alone takes it.
                            if known.isHeldForSupport, receipt.matchedBy != .support {
                                throw OrderLedgerError.accountConflict(receipt.transactionId)
                            }
                            if known.orderId == nil, known.status == .renewal || known.status == .shared || known.status == .restore {
                                // A subscription's later period, a family member's share or a restore,
                                // as Apple signed it: never an order's (issue 40), told as that.
                                throw OrderLedgerError.laterTransaction(receipt.transactionId, original: known.originalTransactionId ?? receipt.transactionId.rawValue)
                            }
                            if known.orderId == nil, known.status == .refunded {
                                // A family member's share whose access Apple ended is a share still, never an order's.
                                if let entry = (try? known.pooled()) ?? nil,
                                   entry.reason == AppleTransactionRecord.familyShareRevokedReason || entry.transaction.isFamilyShared {
                                    throw OrderLedgerError.laterTransaction(receipt.transactionId, original: receipt.transactionId.rawValue)
                                }
                                throw OrderLedgerError.refundedInPool(receipt.transactionId)
                            }
                            guard known.isPooled || known.isHeldForSupport else { throw OrderLedgerError.duplicateTransaction(receipt.transactionId) }
                            // Waiting for another user (a client claimed it for that one first): a
                            // client's own claim (a write carrying the allowance), whatever `matchedBy`
                            // it says, crosses users no more than support may without force; nor does
                            // a proof's common case (a write with a condition), which then takes the
                            // locked path, where the intake decides by the user the ledger knows.
                            if write.purchaseAllowance != nil || write.condition != nil, receipt.matchedBy != .support, receipt.matchedBy != .imported,
                               known.isPooled, let pooledUser = known.userId, let order, pooledUser != order.userId {
                                throw OrderLedgerError.pooledForAnotherUser(receipt.transactionId, user: pooledUser)
                            }
                            if receipt.matchedBy == .imported, let order, let refusal = importRefusal(receipt, of: order, known: known) { throw refusal }
                            // What Apple signed outranks the claim: another product or quantity never pays the order.
                            if receipt.matchedBy != .imported, receipt.matchedBy != .support, let order, let refusal = mismatch(of: order, known: known) {
                                throw refusal
                            }
                            if let allowance = write.purchaseAllowance, receipt.matchedBy != .support, let order,
                               Reconciler.purchasedBeforeOrder(known.purchaseDate, created: order.createdAt, allowance: allowance) {
                                throw OrderLedgerError.purchasedBeforeOrder(receipt.transactionId)
                            }
                            if receipt.matchedBy == .imported, let refusal = importSignedOtherwise(receipt, known: known) { throw refusal }
                            plan.appends.append(try matched(receipt, order: id, receiptID: event.id, known: known, snapshot, write.pairing, metadata: event.metadata))
                        } else {
                            // A claim of a transaction the ledger does not hold (a backend's own): one
                            // that names another product than the order's contradicts itself, and
                            // would grant the order's goods for it (promise 7).
                            if receipt.matchedBy != .imported, receipt.matchedBy != .support, let order, receipt.productId != order.productId {
                                throw OrderLedgerError.productMismatch(receipt.transactionId, apple: receipt.productId, order: order.productId)
                            }
                            plan.claim = receipt.transactionId
                        }
                    }
                    let next = Projection.apply(orderEvent, to: order, id: id, claimed: claimed, version: version + 1 + Int64(offset), at: now)
                    order = next.order
                    if orderEvent.touchedTransaction != nil, let row = next.claimed, row != claimed { leave(row, isNew: claimed == nil) }
                }
                guard let order else { throw OrderDecisionError.noSuchOrder }
                plan.orders.append((order, current == nil))
                plan.ordersAfter[index] = order
                plan.appends.insert((append, .exact(version)), at: index)
            } else if let id = append.stream.transactionID {
                let before = transaction(id)
                let version = snapshot.transactionVersions[id] ?? ExpectedVersion.noStreamVersion
                if let refusal = expectedRefusal(append, version) { throw refusal }
                var row = before
                for event in append.events {
                    guard case .transaction(let transactionEvent) = event.body else {
                        throw AppendError.invalidBatch("a transaction's stream takes transaction events, not \(event.type)")
                    }
                    row = Projection.apply(transactionEvent, data: event.data, to: row, at: now)
                }
                if let row, row != before { leave(row, isNew: before == nil) }
                plan.appends.insert((append, .exact(version)), at: index)
            } else {
                plan.appends.insert((append, append.expected), at: index)
            }
        }
        return plan
    }

    /// The refusal of an imported grant of `known`, which waits in the pool, when the history's
    /// line names another user than the one it waits for, or another product than Apple signed
    /// (a granted transaction alone names neither, and takes it as granted before).
    private static func importRefusal(_ receipt: ReceiptReceived, of order: Order, known: AppleTransactionRecord) -> OrderLedgerError? {
        let otherUser = order.userId.rawValue != HistoryRecord.unknownUser && known.userId.map { $0 != order.userId } == true
        let otherProduct = receipt.productId.rawValue != HistoryRecord.unknownProduct && receipt.productId != known.productId
        return otherUser || otherProduct ? .pooledOtherwise(receipt.transactionId, user: known.userId, product: known.productId) : nil
    }

    /// The refusal of an imported grant of `known`, which waits in the pool, whose line says
    /// another purchase date or environment than Apple signed: the reports date and place the sale
    /// by the line's order.
    private static func importSignedOtherwise(_ receipt: ReceiptReceived, known: AppleTransactionRecord) -> OrderLedgerError? {
        // A line's time has whole seconds at least; a line of a grant alone may have none.
        if receipt.purchaseDate != HistoryRecord.unknownDate, abs(receipt.purchaseDate.timeIntervalSince(known.purchaseDate)) >= 1 {
            return .pooledSignedOtherwise(
                receipt.transactionId, field: "purchaseDate", apple: EventCoding.formatDate(known.purchaseDate), line: EventCoding.formatDate(receipt.purchaseDate))
        }
        if let apple = known.environment, let line = receipt.environment, apple != line {
            return .pooledSignedOtherwise(receipt.transactionId, field: "environment", apple: apple, line: line)
        }
        return nil
    }

    /// The refusal of a claim of `known`, which waits in the pool, by `order` of another product or
    /// quantity than Apple signed (an entry without its verified transaction is checked by product).
    private static func mismatch(of order: Order, known: AppleTransactionRecord) -> OrderLedgerError? {
        let quantity = (try? known.verifiedTransaction())??.quantity
        switch order.mismatch(product: known.productId, quantity: quantity ?? order.quantity) {
        case nil: return nil
        case .product?: return .productMismatch(known.transactionId, apple: known.productId, order: order.productId)
        case .quantity?: return .quantityMismatch(known.transactionId, apple: quantity ?? order.quantity, order: order.quantity)
        }
    }

    /// The refusal of an append whose caller expected another version than `current`, if so.
    private static func expectedRefusal(_ append: Append, _ current: Int64) -> AppendError? {
        guard let expected = append.expected.databaseValue, expected != current else { return nil }
        return .wrongExpectedVersion(stream: append.stream, expected: append.expected, current: current)
    }

    /// `transaction-matched` for a receipt of order `order` that takes `known` out of the pool
    /// (promise 8: a transaction leaves the pool only by that event).
    private static func matched(
        _ receipt: ReceiptReceived, order: OrderID, receiptID: EventID, known: AppleTransactionRecord, _ snapshot: Snapshot, _ pairing: Pairing?,
        metadata: Data
    ) throws -> (append: Append, expected: ExpectedVersion) {
        let body = TransactionMatched(
            orderId: order, matchedBy: receipt.matchedBy, candidates: pairing?.candidates ?? 1,
            rule: pairing?.rule ?? receipt.matchedBy.rawValue,
            otherCandidates: pairing.flatMap { $0.otherCandidates.isEmpty ? nil : $0.otherCandidates })
        // Named by the claim's event as well: a pairing support undid and made again is another.
        let id = EventID.named("matched", receipt.transactionId.rawValue, order.rawValue, receiptID.uuid.uuidString.lowercased())
        let event = try EventCoding.newEvent(.matched(body), id: id, metadata: metadata)
        let version = snapshot.transactionVersions[known.transactionId] ?? ExpectedVersion.noStreamVersion
        return (Append([event], to: receipt.transactionId.streamID), .exact(version))
    }
}
