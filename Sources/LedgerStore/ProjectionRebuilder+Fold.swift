import Foundation
import LedgerCore
import LedgerJSON
import PostgresNIO

/// The rebuild's fold: the rows it reads, their decoded bodies, the projections folded from them
/// (by `Projection`, as the writer computes them), and the rows it writes.
extension ProjectionRebuilder {
    /// One event of an order, transaction or subscription stream, as the rebuild reads it.
    struct Row: Sendable {
        let stream: String
        let version: Int64
        let type: String
        let data: String
        let recordedAt: Date

        /// A row of the log query (stream_id, stream_version, type, data, recorded_at), its cells
        /// decoded one by one: postgres-nio's tuple decoding builds generic metadata for every
        /// row, a second a million rows.
        init(_ row: PostgresRow) throws {
            var cells = row.makeIterator()
            func next<Value: PostgresDecodable>(_ type: Value.Type) throws -> Value {
                guard let cell = cells.next() else { throw ProjectionRebuildError(message: "the log query answered too few columns") }
                return try cell.decode(Value.self)
            }
            stream = try next(String.self)
            version = try next(Int64.self)
            type = try next(String.self)
            data = try next(String.self)
            recordedAt = try next(Date.self)
        }

        /// The body decoded (nil: a body the fold skips, as one the ledger would have refused).
        var body: EventBody? {
            try? EventCoding.body(stream: StreamID(unchecked: stream), type: type, text: data)
        }
    }

    /// The projections folded from the log read stream by stream, each in version order, with
    /// `Projection`'s rules: the order of the stream being folded (handed on as soon as its
    /// stream ends), and every Apple transaction's row (written at the end, when every order and
    /// transaction stream has been folded).
    struct Fold {
        private var stream: String?
        private var order: Order?
        private(set) var transactions: [TransactionID: AppleTransactionRecord] = [:]
        /// Every subscription's row, by its originalTransactionId (written at the end too).
        private(set) var subscriptions: [String: Subscription] = [:]
        /// A claim an order stream's receipt took over while folding it, held until that stream
        /// undoes its own pairing. Streams are folded one after another, not in time: when support
        /// undid a pairing and the transaction went to a second order, the second order's stream
        /// may be folded first, and its claim must survive the first order's claim and undo.
        private var displaced: [TransactionID: AppleTransactionRecord] = [:]

        /// Folds `row` (with its decoded body), the next event of the current stream or the first
        /// of the next one; an ended stream's order goes to `finished`.
        mutating func apply(_ row: Row, _ body: EventBody?, finished: (Order) -> Void) {
            // Compared as bytes, as PostgreSQL tells streams apart (Swift's == would take two
            // spellings of one accented letter for the same stream).
            if stream == nil || !row.stream.utf8.elementsEqual(stream!.utf8) {
                finish(finished)
                stream = row.stream
            }
            switch body {
            case .order(let event):
                let id = order?.orderId ?? OrderID(unchecked: StreamID.id(in: row.stream, after: "order-") ?? row.stream)
                let claimedID = event.touchedTransaction
                if case .receiptReceived(let receipt) = event, let held = transactions[receipt.transactionId],
                   let holder = held.orderId, holder != id {
                    displaced[receipt.transactionId] = held
                }
                let next = Projection.apply(
                    event, to: order, id: id, claimed: claimedID.flatMap { transactions[$0] }, version: row.version, at: row.recordedAt)
                order = next.order
                if let claimedID, let claimed = next.claimed { transactions[claimedID] = claimed }
                if case .pairingUndone(let undone) = event, next.order?.transactionId == nil,
                   let held = displaced.removeValue(forKey: undone.transactionId) {
                    transactions[undone.transactionId] = held
                }
            case .transaction(let event):
                let id = TransactionID(unchecked: StreamID.id(in: row.stream, after: "transaction-") ?? row.stream)
                transactions[id] = Projection.apply(event, data: Data(row.data.utf8), to: transactions[id], at: row.recordedAt)
            case .subscription(let event):
                guard let id = StreamID(unchecked: row.stream).subscriptionID else { return }
                subscriptions[id] = Subscription.evolve(subscriptions[id], event, version: row.version, at: row.recordedAt)
            case .opaque, nil:
                return
            }
        }

        /// Ends the current stream.
        mutating func finish(_ finished: (Order) -> Void) {
            if let order { finished(order) }
            (stream, order) = (nil, nil)
        }
    }

    /// The fold and the COPY it feeds, handed from batch to batch by a chain of tasks in which
    /// each waits for the one before it: one task at a time touches it (hence unchecked).
    final class FoldState: @unchecked Sendable {
        private(set) var fold = Fold()
        private var copy = BinaryCopyRows()
        private(set) var orders = 0
        let writer: PostgresCopyFromWriter
        let firstApp: BundleID?

        init(writer: PostgresCopyFromWriter, firstApp: BundleID?) {
            self.writer = writer
            self.firstApp = firstApp
        }

        func fold(_ batch: [Row], _ bodies: [EventBody?]) async throws {
            for index in batch.indices {
                fold.apply(batch[index], bodies[index], finished: write)
                try await copy.flushIfFull(to: writer)
            }
        }

        /// Ends the last stream and the COPY's data.
        func finish() async throws {
            fold.finish(write)
            try await copy.finish(to: writer)
        }

        private func write(_ order: Order) {
            copy.append(Projection.inFirstApp(order, firstApp))
            orders += 1
        }
    }

}

extension BinaryCopyRows {
    /// An `orders` row, in `ProjectionRebuilder.orderColumns`' order.
    mutating func append(_ order: Order) {
        row(columns: Int16(ProjectionRebuilder.orderColumns.count))
        text(order.orderId.rawValue)
        text(order.userId.rawValue)
        text(order.productId.rawValue)
        int32(Int32(order.quantity))
        numeric(order.price)
        text(order.currency)
        uuid(order.appAccountToken)
        text(order.state.rawValue)
        int64(order.version)
        text(order.transactionId?.rawValue)
        timestamp(order.createdAt)
        timestamp(order.updatedAt)
        timestamp(order.queuedAt)
        text(order.stateBeforeRefund?.rawValue)
        text(order.failureReason)
        text(order.bundleId?.rawValue)
    }

    /// An `apple_transactions` row, in `ProjectionRebuilder.transactionColumns`' order.
    mutating func append(_ transaction: AppleTransactionRecord) {
        row(columns: Int16(ProjectionRebuilder.transactionColumns.count))
        text(transaction.transactionId.rawValue)
        text(transaction.orderId?.rawValue)
        text(transaction.userId?.rawValue)
        text(transaction.productId.rawValue)
        timestamp(transaction.purchaseDate)
        text(transaction.environment)
        text(transaction.status.rawValue)
        timestamp(transaction.receivedAt)
        timestamp(transaction.updatedAt)
        text(transaction.originalTransactionId)
        text(transaction.appTransactionId)
        uuid(transaction.appAccountToken)
        text(transaction.matchedBy?.rawValue)
        jsonb(transaction.verification.map { String(decoding: $0, as: UTF8.self) })
        text(transaction.bundleId?.rawValue)
        text(transaction.storefront)
    }
}
