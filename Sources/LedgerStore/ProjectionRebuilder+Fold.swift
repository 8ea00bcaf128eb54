import Foundation
import LedgerCore
import PostgresNIO

/// The rebuild's fold: the rows it reads, their decoded bodies, the projections folded from
/// them, and the rows it writes.
extension ProjectionRebuilder {
    /// One event of an order or transaction stream, as the rebuild reads it.
    struct Row: Sendable {
        let stream: String
        let version: Int64
        let type: String
        let data: String
        let recordedAt: Date

        var isOrderEvent: Bool { stream.hasPrefix("order-") }

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

        /// The body decoded (`.none`: a body the fold skips, as one the ledger would have refused).
        var body: Body {
            if isOrderEvent {
                guard let type = OrderEventType(rawValue: type), let event = try? OrderEvent.decodeStored(type: type, text: data) else { return .none }
                return .order(event)
            }
            switch TransactionEventType(rawValue: type) {
            case .unmatched: return (try? StoredJSON.decode(TransactionUnmatched.self, from: data)).map(Body.unmatched) ?? .none
            case .notificationReceived: return (try? StoredJSON.decode(NotificationReceived.self, from: data)).map(Body.notification) ?? .none
            case .matched, nil: return .none
            }
        }
    }

    /// A row's body, decoded ahead of the fold.
    enum Body: Sendable {
        case order(OrderEvent)
        case unmatched(TransactionUnmatched)
        case notification(NotificationReceived)
        case none
    }

    /// The projections folded from the log read stream by stream, each in version order: the
    /// stream being folded, the transactions orders claimed, and the pool of transactions the
    /// ledger recorded as unmatched. An order is handed on as soon as its stream ends.
    struct Fold {
        private var stream: String?
        private var order: Order?
        private var pooled: TransactionRow?
        private(set) var claims: [TransactionID: TransactionRow] = [:]
        private(set) var pool: [TransactionID: TransactionRow] = [:]

        /// Folds `row` (with its decoded body), the next event of the current stream or the first
        /// of the next one; an ended stream's order goes to `finished`.
        mutating func apply(_ row: Row, _ body: Body, finished: (Order) -> Void) {
            // Compared as bytes, as PostgreSQL tells streams apart (Swift's == would take two
            // spellings of one accented letter for the same stream).
            if stream == nil || !row.stream.utf8.elementsEqual(stream!.utf8) {
                finish(finished)
                stream = row.stream
            }
            let event: OrderEvent
            switch body {
            case .order(let orderEvent): event = orderEvent
            case .unmatched(let unmatched):
                pooled = TransactionRow(pooled: unmatched, data: row.data, at: row.recordedAt)
                return
            case .notification(let notification):
                guard let status = NotificationLedger.poolStatus(after: notification.notificationType), pooled?.orderID == nil else { return }
                pooled?.status = status
                pooled?.updatedAt = row.recordedAt
                return
            case .none:
                return
            }
            let id = order?.orderId ?? OrderID(unchecked: String(row.stream.dropFirst("order-".count)))
            guard let next = Order.evolve(order, event, orderID: id, version: row.version, at: row.recordedAt) else { return }
            order = next
            if case .receiptReceived(let receipt) = event {
                claims[receipt.transactionId] = TransactionRow(receipt: receipt, order: next, at: row.recordedAt)
            } else if let transaction = next.transactionId {
                claims[transaction]?.status = next.state.rawValue
                claims[transaction]?.updatedAt = row.recordedAt
            }
        }

        /// Ends the current stream.
        mutating func finish(_ finished: (Order) -> Void) {
            if let order { finished(order) }
            if let pooled, let stream {
                pool[TransactionID(unchecked: String(stream.dropFirst("transaction-".count)))] = pooled
            }
            (stream, order, pooled) = (nil, nil, nil)
        }

        /// The `apple_transactions` rows: the claims, where a transaction that waited in the
        /// pool and was then claimed keeps what the pool knew, and the pool's other rows.
        var transactionRows: [TransactionRow] {
            var rows = claims
            for (id, pooled) in pool {
                rows[id] = rows[id].map { $0.leavingPool(pooled) } ?? pooled
            }
            return Array(rows.values)
        }
    }

    /// The fold and the COPY it feeds, handed from batch to batch by a chain of tasks in which
    /// each waits for the one before it: one task at a time touches it (hence unchecked).
    final class FoldState: @unchecked Sendable {
        private(set) var fold = Fold()
        private var copy = BinaryCopyRows()
        private(set) var orders = 0
        let writer: PostgresCopyFromWriter

        init(writer: PostgresCopyFromWriter) { self.writer = writer }

        func fold(_ batch: [Row], _ bodies: [Body]) async throws {
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
            copy.append(order)
            orders += 1
        }
    }

    /// An `apple_transactions` row as the inline projection writes it.
    struct TransactionRow {
        let transactionID: String
        var orderID: String?
        var userID: String?
        var productID: String
        var purchaseDate: Date
        var environment: String?
        var status: String
        var receivedAt: Date
        var updatedAt: Date
        var originalTransactionID: String?
        var appTransactionID: String?
        var appAccountToken: UUID?
        var matchedBy: String?
        var verification: String?

        init(receipt: ReceiptReceived, order: Order, at date: Date) {
            transactionID = receipt.transactionId.rawValue
            orderID = order.orderId.rawValue
            userID = order.userId.rawValue
            productID = receipt.productId.rawValue
            purchaseDate = receipt.purchaseDate
            environment = receipt.environment
            status = "claimed"
            receivedAt = date
            updatedAt = date
            originalTransactionID = receipt.originalTransactionId
            appTransactionID = receipt.appTransactionId
            appAccountToken = receipt.appAccountToken
            matchedBy = receipt.matchedBy.rawValue
        }

        init(pooled body: TransactionUnmatched, data: String, at date: Date) {
            let transaction = body.transaction
            transactionID = transaction.transactionId.rawValue
            userID = body.userId?.rawValue
            productID = transaction.productId.rawValue
            purchaseDate = transaction.purchaseDate
            environment = transaction.environment
            status = "unmatched"
            receivedAt = date
            updatedAt = date
            originalTransactionID = transaction.originalTransactionId
            appTransactionID = transaction.appTransactionId
            appAccountToken = transaction.appAccountToken
            verification = data
        }

        /// This claim of a transaction that had waited in `pooled`: as `OrderProjection.claim`
        /// updates the pool's row.
        func leavingPool(_ pooled: TransactionRow) -> TransactionRow {
            var row = pooled
            row.orderID = orderID
            row.userID = userID
            row.status = status
            row.matchedBy = matchedBy
            row.updatedAt = updatedAt
            row.environment = pooled.environment ?? environment
            row.originalTransactionID = pooled.originalTransactionID ?? originalTransactionID
            row.appTransactionID = pooled.appTransactionID ?? appTransactionID
            row.appAccountToken = pooled.appAccountToken ?? appAccountToken
            return row
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
    }

    /// An `apple_transactions` row, in `ProjectionRebuilder.transactionColumns`' order.
    mutating func append(_ claim: ProjectionRebuilder.TransactionRow) {
        row(columns: Int16(ProjectionRebuilder.transactionColumns.count))
        text(claim.transactionID)
        text(claim.orderID)
        text(claim.userID)
        text(claim.productID)
        timestamp(claim.purchaseDate)
        text(claim.environment)
        text(claim.status)
        timestamp(claim.receivedAt)
        timestamp(claim.updatedAt)
        text(claim.originalTransactionID)
        text(claim.appTransactionID)
        uuid(claim.appAccountToken)
        text(claim.matchedBy)
        jsonb(claim.verification)
    }
}
