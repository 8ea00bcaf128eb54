import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// Rebuilds the projections from the event log with the same `Order.evolve` the inline
/// projection uses, and verifies that the live projections equal a fresh rebuild, row for row.
public struct ProjectionRebuilder: Sendable {
    public let database: Database
    /// Called with (events read, events in the log) as the rebuild goes.
    public var progress: (@Sendable (Int, Int) -> Void)?

    public init(database: Database, progress: (@Sendable (Int, Int) -> Void)? = nil) {
        self.database = database
        self.progress = progress
    }

    /// The projection tables, in the order they are compared.
    static let tables = ["orders", "apple_transactions"]
    static let scratchSchema = "ledger_projection_verify"

    /// Empties the projections and fills them again from the log, in one transaction.
    @discardableResult
    public func rebuild() async throws -> Int {
        try await database.transaction { connection in
            // One snapshot for the whole replay; the TRUNCATE holds appends to orders until COMMIT.
            try await connection.guardedQuery("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", logger: database.logger)
            try await connection.guardedQuery("TRUNCATE orders, apple_transactions", logger: database.logger)
            return try await fill(schema: "public", on: connection)
        }
    }

    /// Rebuilds into a scratch schema and compares with the live projections; answers the
    /// differing rows (empty when they are identical). The scratch schema is dropped afterwards.
    public func verify() async throws -> [String] {
        try await database.transaction { connection in
            // One snapshot: the replay and the comparison see the same log and the same rows,
            // so appends committed meanwhile are not reported as differences.
            try await connection.guardedQuery("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", logger: database.logger)
            let scratch = Self.scratchSchema
            try await connection.guardedQuery("DROP SCHEMA IF EXISTS \(unescaped: scratch) CASCADE", logger: database.logger)
            try await connection.guardedQuery("CREATE SCHEMA \(unescaped: scratch)", logger: database.logger)
            for table in Self.tables {
                try await connection.guardedQuery(
                    "CREATE TABLE \(unescaped: scratch).\(unescaped: table) (LIKE public.\(unescaped: table) INCLUDING ALL)",
                    logger: database.logger)
            }
            try await fill(schema: scratch, on: connection)
            var differences: [String] = []
            for table in Self.tables {
                let rows = try await connection.guardedQuery(
                    """
                    SELECT 'only in the live projection: ' || row_to_json(live)::text FROM
                      (SELECT * FROM public.\(unescaped: table) EXCEPT SELECT * FROM \(unescaped: scratch).\(unescaped: table)) AS live
                    UNION ALL
                    SELECT 'only in the rebuild: ' || row_to_json(fresh)::text FROM
                      (SELECT * FROM \(unescaped: scratch).\(unescaped: table) EXCEPT SELECT * FROM public.\(unescaped: table)) AS fresh
                    """,
                    logger: database.logger)
                for try await line in rows.decode(String.self) { differences.append("\(table): \(line)") }
            }
            try await connection.guardedQuery("DROP SCHEMA \(unescaped: scratch) CASCADE", logger: database.logger)
            return differences
        }
    }

    /// One event of an order or transaction stream, as the rebuild reads it.
    struct Row: Sendable {
        let stream: String
        let version: Int64
        let type: String
        let data: String
        let recordedAt: Date
        /// An order event's body, decoded ahead of the fold (nil: not an order event, or not
        /// one `OrderEvent.decodeStored` accepts, which the fold then skips).
        var event: OrderEvent?

        var isOrderEvent: Bool { stream.hasPrefix("order-") }

        /// The row with its order event decoded.
        func decoded() -> Row {
            guard isOrderEvent, let type = OrderEventType(rawValue: type) else { return self }
            var row = self
            row.event = try? OrderEvent.decodeStored(type: type, text: data)
            return row
        }
    }

    /// Rows read before they are folded: their bodies are decoded in parallel, one slice per
    /// processor (decoding is most of the fold's time), then folded in order.
    static let decodeBatch = 8192

    /// The projections being folded from the log: orders, the transactions they claimed, and
    /// the pool of transactions the ledger recorded as unmatched.
    struct Fold {
        /// One stream's projection so far and the version it takes next.
        struct Stream<Value> {
            var value: Value?
            var next: Int64 = 0
        }

        var orders: [OrderID: Stream<Order>] = [:]
        var claims: [TransactionID: TransactionRow] = [:]
        var pool: [TransactionID: Stream<TransactionRow>] = [:]

        /// Folds `row` into its stream unless it is not the stream's next version (then answers
        /// false and changes nothing); with `anyVersion`, folds it regardless.
        mutating func apply(_ row: Row, anyVersion: Bool = false) -> Bool {
            if row.stream.hasPrefix("transaction-") {
                let id = TransactionID(unchecked: String(row.stream.dropFirst("transaction-".count)))
                var stream = pool[id] ?? Stream()
                guard anyVersion || stream.next == row.version else { return false }
                ProjectionRebuilder.fold(transactionEvent: row.type, data: row.data, at: row.recordedAt, into: &stream.value)
                stream.next = row.version + 1
                pool[id] = stream
                return true
            }
            let id = OrderID(unchecked: String(row.stream.dropFirst("order-".count)))
            var stream = orders[id] ?? Stream()
            guard anyVersion || stream.next == row.version else { return false }
            stream.next = row.version + 1
            defer { orders[id] = stream }
            guard let event = row.event,
                  let next = Order.evolve(stream.value, event, orderID: id, version: row.version, at: row.recordedAt)
            else { return true }
            stream.value = next
            if case .receiptReceived(let receipt) = event {
                claims[receipt.transactionId] = TransactionRow(receipt: receipt, order: next, at: row.recordedAt)
            } else if let transaction = next.transactionId {
                claims[transaction]?.status = next.state.rawValue
                claims[transaction]?.updatedAt = row.recordedAt
            }
            return true
        }

        /// The `apple_transactions` rows: the claims, where a transaction that waited in the
        /// pool and was then claimed keeps what the pool knew, and the pool's other rows.
        var transactionRows: [TransactionRow] {
            var rows = claims
            for (id, stream) in pool {
                guard let pooled = stream.value else { continue }
                rows[id] = rows[id].map { $0.leavingPool(pooled) } ?? pooled
            }
            return Array(rows.values)
        }
    }

    /// Folds every order and transaction stream, each in version order, into `schema`'s tables.
    ///
    /// One pass over the log in position order (an index scan in about the table's physical
    /// order, no sort). A stream's events come in version order, except when a writer committed
    /// version n + 1 with a lower position than version n (its transaction took its id before
    /// the stream lock): such an event waits in `held` until its predecessor has been folded.
    /// `rows` with their order events decoded, in the same order.
    static func decoded(_ rows: [Row]) async -> [Row] {
        let slices = max(1, min(ProcessInfo.processInfo.activeProcessorCount, rows.count / 256))
        guard slices > 1 else { return rows.map { $0.decoded() } }
        let size = (rows.count + slices - 1) / slices
        return await withTaskGroup(of: (Int, [Row]).self) { group in
            for start in stride(from: 0, to: rows.count, by: size) {
                let slice = rows[start..<min(start + size, rows.count)]
                group.addTask { (start, slice.map { $0.decoded() }) }
            }
            var parts: [(Int, [Row])] = []
            for await part in group { parts.append(part) }
            return parts.sorted { $0.0 < $1.0 }.flatMap(\.1)
        }
    }

    @discardableResult
    private func fill(schema: String, on connection: PostgresConnection) async throws -> Int {
        let total = try await count(on: connection)
        let started = ContinuousClock.now
        var fold = Fold()
        var held: [String: [Row]] = [:]
        var read = 0
        let rows = try await connection.guardedQuery(
            """
            SELECT stream_id, stream_version, type, data::text, recorded_at FROM events
            WHERE stream_id LIKE 'order-%' OR stream_id LIKE 'transaction-%'
            ORDER BY global_position
            """,
            logger: database.logger)
        var batch: [Row] = []
        batch.reserveCapacity(Self.decodeBatch)
        func foldBatch() async {
            for var row in await Self.decoded(batch) {
                while true {
                    guard fold.apply(row) else {
                        held[row.stream, default: []].append(row)
                        break
                    }
                    // Its successor may have come first.
                    guard !held.isEmpty, var waiting = held[row.stream],
                          let index = waiting.firstIndex(where: { $0.version == row.version + 1 }) else { break }
                    row = waiting.remove(at: index)
                    held[row.stream] = waiting.isEmpty ? nil : waiting
                }
            }
            batch.removeAll(keepingCapacity: true)
        }
        for try await (stream, version, type, data, recordedAt) in rows.decode((String, Int64, String, String, Date).self) {
            read += 1
            batch.append(Row(stream: stream, version: version, type: type, data: data, recordedAt: recordedAt))
            if batch.count == Self.decodeBatch {
                await foldBatch()
                progress?(read, total)
            }
        }
        await foldBatch()
        // Versions are gapless, so nothing stays held; should something, fold it in version order.
        for row in held.values.joined().sorted(by: { ($0.stream, $0.version) < ($1.stream, $1.version) }) {
            _ = fold.apply(row, anyVersion: true)
        }
        progress?(read, total)
        let folded = ContinuousClock.now
        database.logger.info("projections folded", metadata: [
            "rebuild.events": "\(read)", "rebuild.seconds": "\(Self.seconds(folded - started))"])
        try await write(orders: fold.orders.values.compactMap(\.value), claims: fold.transactionRows, schema: schema, on: connection)
        return read
    }

    static func seconds(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        return String(format: "%.2f", Double(seconds) + Double(attoseconds) / 1e18)
    }

    private func count(on connection: PostgresConnection) async throws -> Int {
        let rows = try await connection.guardedQuery("SELECT count(*) FROM events WHERE stream_id LIKE 'order-%' OR stream_id LIKE 'transaction-%'", logger: database.logger)
        for try await count in rows.decode(Int.self) { return count }
        return 0
    }

    /// Writes the rows with the tables' keys and indexes dropped, then builds each again once:
    /// one sort per index instead of a million random inserts into each. A duplicate that a
    /// unique index refuses fails the rebuild as an insert would have.
    private func write(orders: [Order], claims: [TransactionRow], schema: String, on connection: PostgresConnection) async throws {
        var recreate: [String] = []
        let definitions = try await connection.guardedQuery(
            """
            SELECT format('ALTER TABLE %I.%I DROP CONSTRAINT %I', n.nspname, t.relname, c.conname),
                   format('ALTER TABLE %I.%I ADD CONSTRAINT %I %s', n.nspname, t.relname, c.conname, pg_get_constraintdef(c.oid))
            FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace
            WHERE n.nspname = \(schema) AND t.relname = ANY(\(Self.tables)) AND c.contype IN ('p', 'u', 'x')
            UNION ALL
            SELECT format('DROP INDEX %I.%I', n.nspname, i.relname), pg_get_indexdef(x.indexrelid)
            FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
                 JOIN pg_namespace n ON n.oid = t.relnamespace
            WHERE n.nspname = \(schema) AND t.relname = ANY(\(Self.tables))
              AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = x.indexrelid AND c.conrelid = x.indrelid)
            """,
            logger: database.logger)
        var drops: [String] = []
        for try await (drop, create) in definitions.decode((String, String).self) {
            drops.append(drop)
            recreate.append(create)
        }
        for statement in drops {
            try await connection.guardedQuery(PostgresQuery(unsafeSQL: statement), logger: database.logger)
        }
        let started = ContinuousClock.now
        try await insert(orders: orders, claims: claims, schema: schema, on: connection)
        let inserted = ContinuousClock.now
        // Bigger sorts for the index builds, for this transaction only.
        try await connection.guardedQuery("SET LOCAL maintenance_work_mem = '256MB'", logger: database.logger)
        for statement in recreate {
            try await connection.guardedQuery(PostgresQuery(unsafeSQL: statement), logger: database.logger)
        }
        database.logger.info("projections written", metadata: [
            "rebuild.rows": "\(orders.count + claims.count)", "rebuild.write_seconds": "\(Self.seconds(inserted - started))",
            "rebuild.indexes": "\(recreate.count)", "rebuild.index_seconds": "\(Self.seconds(ContinuousClock.now - inserted))"])
    }

    /// Streams the rows to PostgreSQL in binary `COPY`, a buffer of about a megabyte at a time, so
    /// PostgreSQL stores one while the next is encoded.
    private func insert(orders: [Order], claims: [TransactionRow], schema: String, on connection: PostgresConnection) async throws {
        let logger = database.logger
        try await connection.copyBinary(schema: schema, table: "orders", columns: [
            "order_id", "user_id", "product_id", "quantity", "price", "currency", "app_account_token", "state", "version",
            "transaction_id", "created_at", "updated_at", "queued_at", "state_before_refund", "failure_reason",
        ], logger: logger) { send in
            var rows = BinaryCopyRows()
            for order in orders {
                rows.row(columns: 15)
                rows.text(order.orderId.rawValue)
                rows.text(order.userId.rawValue)
                rows.text(order.productId.rawValue)
                rows.int32(Int32(order.quantity))
                rows.numeric(order.price)
                rows.text(order.currency)
                rows.uuid(order.appAccountToken)
                rows.text(order.state.rawValue)
                rows.int64(order.version)
                rows.text(order.transactionId?.rawValue)
                rows.timestamp(order.createdAt)
                rows.timestamp(order.updatedAt)
                rows.timestamp(order.queuedAt)
                rows.text(order.stateBeforeRefund?.rawValue)
                rows.text(order.failureReason)
                if rows.buffer.readableBytes >= 1 << 20 { try await rows.flush(send) }
            }
            rows.end()
            try await rows.flush(send)
        }
        try await connection.copyBinary(schema: schema, table: "apple_transactions", columns: [
            "transaction_id", "order_id", "user_id", "product_id", "purchase_date", "environment", "status", "received_at",
            "updated_at", "original_transaction_id", "app_transaction_id", "app_account_token", "matched_by", "verification",
        ], logger: logger) { send in
            var rows = BinaryCopyRows()
            for claim in claims {
                rows.row(columns: 14)
                rows.text(claim.transactionID)
                rows.text(claim.orderID)
                rows.text(claim.userID)
                rows.text(claim.productID)
                rows.timestamp(claim.purchaseDate)
                rows.text(claim.environment)
                rows.text(claim.status)
                rows.timestamp(claim.receivedAt)
                rows.timestamp(claim.updatedAt)
                rows.text(claim.originalTransactionID)
                rows.text(claim.appTransactionID)
                rows.uuid(claim.appAccountToken)
                rows.text(claim.matchedBy)
                rows.jsonb(claim.verification)
                if rows.buffer.readableBytes >= 1 << 20 { try await rows.flush(send) }
            }
            rows.end()
            try await rows.flush(send)
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

    /// Folds one event of a transaction's stream into its pool row.
    static func fold(transactionEvent type: String, data: String, at date: Date, into row: inout TransactionRow?) {
        switch TransactionEventType(rawValue: type) {
        case .unmatched:
            guard let body = try? StoredJSON.decode(TransactionUnmatched.self, from: data) else { return }
            row = TransactionRow(pooled: body, data: data, at: date)
        case .notificationReceived:
            guard let body = try? StoredJSON.decode(NotificationReceived.self, from: data),
                  let status = NotificationLedger.poolStatus(after: body.notificationType), row?.orderID == nil else { return }
            row?.status = status
            row?.updatedAt = date
        case .matched, nil:
            break
        }
    }
}
