import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// Rebuilds the projections from the event log with the rules the writer uses (`Projection`),
/// and verifies that the live projections equal a fresh rebuild, row for row.
public struct ProjectionRebuilder: Sendable {
    public let database: Database
    /// Called with (events read, events in the log) as the rebuild goes.
    public var progress: (@Sendable (Int, Int) -> Void)?

    /// Rows read, decoded and folded together (tests make it small to fold many batches).
    public var batchSize: Int

    public init(database: Database, batchSize: Int = 8192, progress: (@Sendable (Int, Int) -> Void)? = nil) {
        self.database = database
        self.batchSize = max(1, batchSize)
        self.progress = progress
    }

    /// The projection tables, in the order they are compared.
    static let tables = ["orders", "apple_transactions", "subscriptions", "subscription_periods"]
    /// Those whose keys and indexes are dropped while they are filled and built once at the end
    /// (the subscriptions' are kept: a foreign key needs theirs, and they are far fewer rows).
    static let bulkTables = ["orders", "apple_transactions"]
    static let scratchSchema = "ledger_projection_verify"

    /// Empties the projections and fills them again from the log, in one transaction.
    @discardableResult
    public func rebuild() async throws -> Int {
        try await inRebuildTransaction(locking: "ACCESS EXCLUSIVE") { connection, reader in
            // The TRUNCATE holds appends to orders until COMMIT.
            try await connection.guardedQuery("TRUNCATE orders, apple_transactions, subscriptions, subscription_periods", logger: database.logger)
            let read = try await fill(schema: "public", on: connection, reader: reader)
            try await connection.guardedQuery(Self.missingTokens, logger: database.logger)
            return read
        }
    }

    /// The owners of the tokens the log's orders carry that `app_account_tokens` lacks (a log
    /// restored without it), per app: tokens never change, so the rows there stay as they are.
    static let missingTokens: PostgresQuery = """
        INSERT INTO app_account_tokens (app_account_token, user_id, bundle_id, order_id)
        SELECT DISTINCT ON (o.app_account_token, coalesce(o.bundle_id, '')) o.app_account_token, o.user_id, o.bundle_id,
               CASE WHEN e.data->>'appAccountTokenScope' = 'user' THEN NULL ELSE o.order_id END
          FROM orders o JOIN events e ON e.stream_id = 'order-' || o.order_id AND e.stream_version = 0
         WHERE NOT EXISTS (SELECT 1 FROM app_account_tokens k
                            WHERE k.app_account_token = o.app_account_token AND coalesce(k.bundle_id, '') = coalesce(o.bundle_id, ''))
         ORDER BY o.app_account_token, coalesce(o.bundle_id, ''), o.created_at
        ON CONFLICT (app_account_token, (coalesce(bundle_id, ''))) DO NOTHING
        """

    /// `body` in one REPEATABLE READ transaction (one snapshot for the whole replay) with no
    /// `statement_timeout`, with the transaction of the connection that will read the log on its
    /// snapshot. The reader's transaction begins first: waiting for a second connection must not
    /// happen while the projections are locked.
    ///
    /// No `statement_timeout` a role or database may set ends the rebuild's one long COPY: an
    /// error while a COPY buffer waits for the socket can leave postgres-nio (1.33) waiting on
    /// that write forever, with the projections locked.
    ///
    /// The projections are locked in `mode` first: `LOCK` takes no snapshot, so the snapshot is
    /// taken once the lock is held. A rebuild (`ACCESS EXCLUSIVE`) so sees every append that held
    /// the projections while it waited, where its `TRUNCATE` alone took its snapshot before
    /// waiting and left those appends' events out. A verify (`ACCESS SHARE`, which holds no
    /// append) waits for a rebuild under way, whose `TRUNCATE` an older snapshot sees as empty tables.
    private func inRebuildTransaction<Result: Sendable>(
        locking mode: String, _ body: (_ connection: PostgresConnection, _ reader: PostgresConnection) async throws -> Result
    ) async throws -> Result {
        try await database.transaction { reader in
            try await database.transaction { transaction in
                let connection = transaction.connection
                try await connection.guardedQuery("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ", logger: database.logger)
                try await connection.guardedQuery("SET LOCAL statement_timeout = 0", logger: database.logger)
                try await connection.guardedQuery(
                    "LOCK TABLE \(unescaped: Self.tables.joined(separator: ", ")) IN \(unescaped: mode) MODE", logger: database.logger)
                return try await body(connection, reader.connection)
            }
        }
    }

    /// Rebuilds into a scratch schema and compares with the live projections; answers the
    /// differing rows (empty when they are identical). The scratch schema is dropped afterwards.
    public func verify() async throws -> [String] {
        // One snapshot: the replay and the comparison see the same log and the same rows, so
        // appends committed meanwhile are not reported as differences.
        try await inRebuildTransaction(locking: "ACCESS SHARE") { connection, reader in
            let scratch = Self.scratchSchema
            try await connection.guardedQuery("DROP SCHEMA IF EXISTS \(unescaped: scratch) CASCADE", logger: database.logger)
            try await connection.guardedQuery("CREATE SCHEMA \(unescaped: scratch)", logger: database.logger)
            for table in Self.tables {
                try await connection.guardedQuery(
                    "CREATE TABLE \(unescaped: scratch).\(unescaped: table) (LIKE public.\(unescaped: table) INCLUDING ALL)",
                    logger: database.logger)
            }
            try await fill(schema: scratch, on: connection, reader: reader)
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

    /// Folds every order, transaction and subscription stream, each in version order, into `schema`'s tables.
    ///
    /// The tables' keys and indexes are dropped first and built once at the end: one sort per
    /// index instead of a million random inserts into each (a duplicate that a unique index
    /// refuses fails the rebuild as an insert would have). A second connection reads the log
    /// stream by stream on this transaction's snapshot, and each order is written by binary
    /// `COPY` on this connection as soon as its stream ends, so PostgreSQL reads, Swift folds and
    /// PostgreSQL stores at the same time, and no stream waits in memory.
    @discardableResult
    private func fill(schema: String, on connection: PostgresConnection, reader: PostgresConnection) async throws -> Int {
        let logger = database.logger
        // Counting the log costs a scan of it: only for someone watching.
        let total = progress == nil ? 0 : try await count(on: connection)
        let snapshot = try await exportSnapshot(of: connection)
        let firstApp = try await firstApp(on: connection)
        let recreate = try await dropKeysAndIndexes(schema: schema, on: connection)
        let started = ContinuousClock.now
        var read = 0
        let state = try await connection.copyBinary(schema: schema, table: "orders", columns: Self.orderColumns, logger: logger) { writer in
            let state = FoldState(writer: writer, firstApp: firstApp)
            // Each batch's task decodes its bodies while the batch before it is folded, then
            // folds its own once that task is done; this task meanwhile reads the next batch.
            var folding: Task<Void, any Error> = Task {}
            var inFlight: [Task<Void, any Error>] = []
            func hand(_ batch: [Row]) async throws {
                let previous = folding
                folding = Task {
                    let bodies = batch.map(\.body)
                    try await previous.value
                    try await state.fold(batch, bodies)
                }
                // At most three batches read ahead of the fold.
                inFlight.append(folding)
                if inFlight.count > 3 { try await inFlight.removeFirst().value }
            }
            do {
                // The reader's transaction, begun with this one, takes the snapshot this one exported.
                try await reader.guardedQuery("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY", logger: logger)
                try await reader.guardedQuery(PostgresQuery(unsafeSQL: "SET TRANSACTION SNAPSHOT '\(snapshot)'"), logger: logger)
                let rows = try await reader.guardedQuery(
                    """
                    SELECT stream_id, stream_version, type, data::text, recorded_at FROM events
                    WHERE stream_id LIKE 'order-%' OR stream_id LIKE 'transaction-%' OR stream_id LIKE 'subscription-%'
                    ORDER BY stream_id, stream_version
                    """,
                    logger: logger)
                var batch: [Row] = []
                batch.reserveCapacity(batchSize)
                for try await row in rows {
                    read += 1
                    batch.append(try Row(row))
                    guard batch.count == batchSize else { continue }
                    try await hand(batch)
                    batch = []
                    batch.reserveCapacity(batchSize)
                    progress?(read, total)
                }
                try await hand(batch)
                try await folding.value
            } catch {
                // No task may write to the COPY after it has failed.
                _ = try? await folding.value
                throw error
            }
            try await state.finish()
            return state
        }
        progress?(read, total)
        let folded = ContinuousClock.now
        let transactions = state.fold.transactions.values
        try await connection.copyBinary(schema: schema, table: "apple_transactions", columns: Self.transactionColumns, logger: logger) { writer in
            var copy = BinaryCopyRows()
            for transaction in transactions {
                copy.append(Projection.inFirstApp(transaction, firstApp))
                try await copy.flushIfFull(to: writer)
            }
            try await copy.finish(to: writer)
        }
        try await writeSubscriptions(state.fold.subscriptions.values, schema: schema, on: connection)
        let written = ContinuousClock.now
        // Bigger sorts for the index builds, for this transaction only.
        try await connection.guardedQuery("SET LOCAL maintenance_work_mem = '256MB'", logger: logger)
        for statement in recreate {
            try await connection.guardedQuery(PostgresQuery(unsafeSQL: statement), logger: logger)
        }
        logger.info("projections rebuilt", metadata: [
            "rebuild.events": "\(read)", "rebuild.orders": "\(state.orders)", "rebuild.transactions": "\(transactions.count)",
            "rebuild.subscriptions": "\(state.fold.subscriptions.count)",
            "rebuild.fold_seconds": "\(Self.seconds(folded - started))",
            "rebuild.transactions_seconds": "\(Self.seconds(written - folded))",
            "rebuild.indexes": "\(recreate.count)", "rebuild.index_seconds": "\(Self.seconds(ContinuousClock.now - written))"])
        return read
    }

    /// The ledger's first app (`Projection.inFirstApp`), nil while it holds none.
    private func firstApp(on connection: PostgresConnection) async throws -> BundleID? {
        let rows = try await connection.guardedQuery("SELECT bundle_id FROM ledger_first_app", logger: database.logger)
        for try await id in rows.decode(String.self) { return BundleID(unchecked: id) }
        return nil
    }

    static func seconds(_ duration: Duration) -> String { String(format: "%.2f", duration.inSeconds) }

    private func count(on connection: PostgresConnection) async throws -> Int {
        let rows = try await connection.guardedQuery("SELECT count(*) FROM events WHERE stream_id LIKE 'order-%' OR stream_id LIKE 'transaction-%' OR stream_id LIKE 'subscription-%'", logger: database.logger)
        for try await count in rows.decode(Int.self) { return count }
        return 0
    }

    /// This transaction's snapshot, for the connection that reads the log to share.
    private func exportSnapshot(of connection: PostgresConnection) async throws -> String {
        let rows = try await connection.guardedQuery("SELECT pg_export_snapshot()", logger: database.logger)
        for try await snapshot in rows.decode(String.self) {
            // An identifier such as 00000003-0000001B-1, written into SET TRANSACTION SNAPSHOT.
            guard !snapshot.isEmpty, snapshot.allSatisfy({ $0.isHexDigit || $0 == "-" }) else { break }
            return snapshot
        }
        throw ProjectionRebuildError(message: "PostgreSQL exported no usable snapshot")
    }

    /// Drops the keys and indexes of `schema`'s projection tables; answers the statements that
    /// build them again, from the catalog, so they stay the migrations' own.
    private func dropKeysAndIndexes(schema: String, on connection: PostgresConnection) async throws -> [String] {
        let definitions = try await connection.guardedQuery(
            """
            SELECT format('ALTER TABLE %I.%I DROP CONSTRAINT %I', n.nspname, t.relname, c.conname),
                   format('ALTER TABLE %I.%I ADD CONSTRAINT %I %s', n.nspname, t.relname, c.conname, pg_get_constraintdef(c.oid))
            FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid JOIN pg_namespace n ON n.oid = t.relnamespace
            WHERE n.nspname = \(schema) AND t.relname = ANY(\(Self.bulkTables)) AND c.contype IN ('p', 'u', 'x')
            UNION ALL
            SELECT format('DROP INDEX %I.%I', n.nspname, i.relname), pg_get_indexdef(x.indexrelid)
            FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
                 JOIN pg_namespace n ON n.oid = t.relnamespace
            WHERE n.nspname = \(schema) AND t.relname = ANY(\(Self.bulkTables))
              AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = x.indexrelid AND c.conrelid = x.indrelid)
            """,
            logger: database.logger)
        var drops: [String] = []
        var recreate: [String] = []
        for try await (drop, create) in definitions.decode((String, String).self) {
            drops.append(drop)
            recreate.append(create)
        }
        for statement in drops {
            try await connection.guardedQuery(PostgresQuery(unsafeSQL: statement), logger: database.logger)
        }
        return recreate
    }

    static let orderColumns = [
        "order_id", "user_id", "product_id", "quantity", "price", "currency", "app_account_token", "state", "version",
        "transaction_id", "created_at", "updated_at", "queued_at", "state_before_refund", "failure_reason", "bundle_id",
    ]
    static let transactionColumns = [
        "transaction_id", "order_id", "user_id", "product_id", "purchase_date", "environment", "status", "received_at",
        "updated_at", "original_transaction_id", "app_transaction_id", "app_account_token", "matched_by", "verification",
        "bundle_id", "storefront",
    ]
}

/// A rebuild that could not run.
struct ProjectionRebuildError: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
}
