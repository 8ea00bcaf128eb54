import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// The `orders` and `apple_transactions` projection rows, read and written on a connection (in
/// the caller's transaction, next to the events they come from).
struct OrderProjection: Sendable {
    let logger: Logger

    static let orderColumns = """
        order_id, user_id, product_id, quantity, price::text, currency, app_account_token, state, version,
        transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason
        """

    func order(_ id: OrderID, on connection: PostgresConnection, forUpdate: Bool = false) async throws -> Order? {
        let lock = forUpdate ? " FOR UPDATE" : ""
        let rows = try await connection.guardedQuery(
            "SELECT \(unescaped: Self.orderColumns) FROM orders WHERE order_id = \(id.rawValue)\(unescaped: lock)", logger: logger)
        return try await Self.decodeOrders(rows).first
    }

    /// The order's row, locked until the caller's transaction ends, and the transaction's time
    /// (`now()`, which the events it appends record), in one round trip when the order exists.
    func lockedOrder(_ id: OrderID, on connection: PostgresConnection) async throws -> (now: Date, order: Order?) {
        let rows = try await connection.guardedQuery(
            "SELECT now(), \(unescaped: Self.orderColumns), NULL::text FROM orders WHERE order_id = \(id.rawValue) FOR UPDATE",
            logger: logger)
        if let (now, order, _) = try await Self.decodeOrderAndHolder(rows) { return (now, order) }
        let now = try await connection.guardedQuery("SELECT now()", logger: logger)
        for try await time in now.decode(Date.self) { return (time, nil) }
        return (Date(), nil)
    }

    typealias OrderColumns = (String, String, String, Int, String?, String?, UUID, String, Int64, String?, Date, Date, Date?, String?, String?)

    static func decodeOrders(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [Order] {
        var orders: [Order] = []
        for try await row in rows.decode(OrderColumns.self) { orders.append(makeOrder(row)) }
        return orders
    }

    static func makeOrder(_ row: OrderColumns) -> Order {
        let (id, user, product, quantity, price, currency, token, state, version, transaction, created, updated, queued, beforeRefund, failure) = row
            return Order(
                orderId: OrderID(unchecked: id), userId: UserID(unchecked: user), productId: ProductID(unchecked: product),
                quantity: quantity, price: price, currency: currency, appAccountToken: token,
                state: OrderState(rawValue: state) ?? .created, version: version,
                transactionId: transaction.map(TransactionID.init(unchecked:)), createdAt: created, updatedAt: updated,
                queuedAt: queued, stateBeforeRefund: beforeRefund.flatMap(OrderState.init(rawValue:)), failureReason: failure)
    }

    /// `append_and_save_order`: `append_to_stream` and, only when it appended, the order's row as
    /// `evolve` left it and the status of the transaction it holds, in one round trip. The sixth
    /// column is always NULL, as `appendSaveAndClaimQuery`'s claim.
    static func appendAndSaveQuery(
        _ events: [NewEvent], stream: StreamID, expected: ExpectedVersion, _ order: Order, at date: Date
    ) -> PostgresQuery {
        let columns = EventStore.Columns(events)
        return """
        SELECT r_status, r_detail, r_event_id, r_stream_version, r_global_position, NULL::boolean
        FROM append_and_save_order(
            \(stream.rawValue), \(expected.databaseValue), \(columns.ids), \(columns.types), \(columns.data)::jsonb[], \(columns.metadata)::jsonb[],
            \(order.orderId.rawValue), \(order.userId.rawValue), \(order.productId.rawValue), \(order.quantity)::integer,
            \(order.price)::numeric, \(order.currency), \(order.appAccountToken), \(order.state.rawValue), \(order.version),
            \(order.transactionId?.rawValue), \(order.createdAt), \(order.updatedAt), \(order.queuedAt),
            \(order.stateBeforeRefund?.rawValue), \(order.failureReason), \(date))
        """
    }

    /// `append_to_stream` and, only when it appended, `save_order_and_claim`, in one statement.
    static func appendSaveAndClaimQuery(
        _ events: [NewEvent], stream: StreamID, expected: ExpectedVersion, _ order: Order, _ receipt: ReceiptReceived,
        status: String, at date: Date
    ) -> PostgresQuery {
        let columns = EventStore.Columns(events)
        return """
        WITH appended AS MATERIALIZED (
            SELECT * FROM append_to_stream(\(stream.rawValue), \(expected.databaseValue), \(columns.ids), \(columns.types), \(columns.data)::jsonb[], \(columns.metadata)::jsonb[])
        ), claimed AS MATERIALIZED (
            SELECT save_order_and_claim(
                \(order.orderId.rawValue), \(order.userId.rawValue), \(order.productId.rawValue), \(order.quantity)::integer,
                \(order.price)::numeric, \(order.currency), \(order.appAccountToken), \(order.state.rawValue), \(order.version),
                \(order.transactionId?.rawValue), \(order.createdAt), \(order.updatedAt), \(order.queuedAt),
                \(order.stateBeforeRefund?.rawValue), \(order.failureReason),
                \(receipt.productId.rawValue), \(receipt.purchaseDate), \(receipt.environment), \(status), \(date),
                \(receipt.originalTransactionId), \(receipt.appTransactionId), \(receipt.appAccountToken), \(receipt.matchedBy.rawValue)) AS ok
            WHERE NOT EXISTS (SELECT 1 FROM appended WHERE r_status <> 'appended')
        )
        SELECT r_status, r_detail, r_event_id, r_stream_version, r_global_position, (SELECT ok FROM claimed)
        FROM appended
        """
    }

    /// The pool's record of a transaction still waiting there, or nil.
    func pooledTransaction(_ id: TransactionID, on connection: PostgresConnection) async throws -> TransactionUnmatched? {
        let rows = try await connection.guardedQuery(
            """
            SELECT verification::text FROM apple_transactions
            WHERE transaction_id = \(id.rawValue) AND order_id IS NULL AND status = 'unmatched'
            """,
            logger: logger)
        var verification: String?
        for try await text in rows.decode(String?.self) { verification = text }
        return verification.flatMap { try? LedgerJSON.decoder.decode(TransactionUnmatched.self, from: Data($0.utf8)) }
    }

    /// Puts a transaction in the pool: its row with no order, and everything known of it.
    func enterPool(_ body: TransactionUnmatched, verification: Data, at date: Date, on connection: PostgresConnection) async throws {
        let transaction = body.transaction
        try await connection.guardedQuery(
            """
            INSERT INTO apple_transactions (transaction_id, order_id, user_id, product_id, purchase_date, environment, status,
                received_at, updated_at, original_transaction_id, app_transaction_id, app_account_token, matched_by, verification)
            VALUES (\(transaction.transactionId.rawValue), NULL, \(body.userId?.rawValue), \(transaction.productId.rawValue),
                    \(transaction.purchaseDate), \(transaction.environment), 'unmatched', \(date), \(date),
                    \(transaction.originalTransactionId), \(transaction.appTransactionId), \(transaction.appAccountToken), NULL,
                    \(String(decoding: verification, as: UTF8.self))::jsonb)
            """,
            logger: logger)
    }

    /// Records what a notification did to a transaction waiting in the pool (`refunded`, or back
    /// to `unmatched` when the refund is reversed).
    func setPoolStatus(_ id: TransactionID, _ status: String, at date: Date, on connection: PostgresConnection) async throws {
        try await connection.guardedQuery(
            "UPDATE apple_transactions SET status = \(status), updated_at = \(date) WHERE transaction_id = \(id.rawValue) AND order_id IS NULL",
            logger: logger)
    }

    /// The transaction's advisory lock, then the order's row lock, the order and the
    /// transaction's holder read after the lock (`lock_order_for_receipt`), in one round trip;
    /// nil when there is no such order (the lock is held either way).
    func lockAndOrder(_ id: OrderID, transaction: TransactionID, on connection: PostgresConnection) async throws -> (Date, Order, (OrderID?, String)?)? {
        let rows = try await connection.guardedQuery(
            "SELECT * FROM lock_order_for_receipt(\(id.rawValue), \(transaction.rawValue))", logger: logger)
        return try await Self.decodeOrderAndHolder(rows)
    }

    static func decodeOrderAndHolder(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> (Date, Order, (OrderID?, String)?)? {
        var found: (Date, Order, String?)?
        for try await (now, id, user, product, quantity, price, currency, token, state, version, transactionID, created, updated, queued, beforeRefund, failure, holder)
            in rows.decode((Date, String, String, String, Int, String?, String?, UUID, String, Int64, String?, Date, Date, Date?, String?, String?, String?).self) {
            found = (now, Self.makeOrder((id, user, product, quantity, price, currency, token, state, version, transactionID, created, updated, queued, beforeRefund, failure)), holder)
        }
        guard let (now, order, holderJSON) = found else { return nil }
        guard let text = holderJSON,
              let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
              let status = object["status"] as? String else { return (now, order, nil) }
        return (now, order, ((object["order_id"] as? String).map(OrderID.init(unchecked:)), status))
    }

    func order(appAccountToken token: UUID, on connection: PostgresConnection, forUpdate: Bool) async throws -> Order? {
        let lock = forUpdate ? " FOR UPDATE" : ""
        let rows = try await connection.guardedQuery(
            "SELECT \(unescaped: Self.orderColumns) FROM orders WHERE app_account_token = \(token)\(unescaped: lock)", logger: logger)
        return try await Self.decodeOrders(rows).first
    }
}
