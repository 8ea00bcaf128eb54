import Foundation
import LedgerCore
import PostgresNIO

/// The `orders` and `apple_transactions` rows as SQL reads them and as `append_events` takes them.
enum ProjectionRows {
    static let orderColumns = """
        order_id, user_id, product_id, quantity, price::text, currency, app_account_token, state, version,
        transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason, bundle_id
        """
    static let orderColumnCount = 16

    /// The `orders` columns as the API reads them, each with its Apple transaction's environment
    /// after them (`Order.environment`); from `ordersWithEnvironment`.
    static let orderAnswerColumns = """
        o.order_id, o.user_id, o.product_id, o.quantity, o.price::text, o.currency, o.app_account_token, o.state, o.version,
        o.transaction_id, o.created_at, o.updated_at, o.queued_at, o.state_before_refund, o.failure_reason, o.bundle_id,
        t.environment
        """
    static let ordersWithEnvironment = "orders o LEFT JOIN apple_transactions t ON t.transaction_id = o.transaction_id"

    static let transactionColumns = """
        transaction_id, order_id, user_id, product_id, purchase_date, environment, status, received_at, updated_at,
        original_transaction_id, app_transaction_id, app_account_token, matched_by, verification::text, bundle_id, storefront
        """
    static let transactionColumnCount = 16

    /// The order in `orderColumns` from column `offset` on; nil when its id is NULL.
    static func order(_ row: PostgresRandomAccessRow, at offset: Int) throws -> Order? {
        guard let id = try row[offset].decode(String?.self) else { return nil }
        func cell<T: PostgresDecodable>(_ index: Int, _ type: T.Type) throws -> T { try row[offset + index].decode(T.self) }
        return Order(
            orderId: OrderID(unchecked: id), userId: UserID(unchecked: try cell(1, String.self)),
            productId: ProductID(unchecked: try cell(2, String.self)), quantity: try cell(3, Int.self),
            price: try cell(4, String?.self), currency: try cell(5, String?.self), appAccountToken: try cell(6, UUID.self),
            state: OrderState(rawValue: try cell(7, String.self)) ?? .created, version: try cell(8, Int64.self),
            transactionId: try cell(9, String?.self).map(TransactionID.init(unchecked:)), createdAt: try cell(10, Date.self),
            updatedAt: try cell(11, Date.self), queuedAt: try cell(12, Date?.self),
            stateBeforeRefund: try cell(13, String?.self).flatMap(OrderState.init(rawValue:)), failureReason: try cell(14, String?.self),
            bundleId: try cell(15, String?.self).map(BundleID.init(unchecked:)))
    }

    /// Every order of `rows` (whose columns are `orderAnswerColumns`).
    static func orders(_ rows: some Sequence<PostgresRow>) throws -> [Order] {
        try rows.compactMap { try answerOrder($0.makeRandomAccess()) }
    }

    /// `orders` for rows a query streams.
    static func orders(_ rows: PostgresRowSequence) async throws -> [Order] {
        var orders: [Order] = []
        for try await row in rows { if let order = try answerOrder(row.makeRandomAccess()) { orders.append(order) } }
        return orders
    }

    /// The order of a row in `orderAnswerColumns`.
    private static func answerOrder(_ cells: PostgresRandomAccessRow) throws -> Order? {
        var order = try order(cells, at: 0)
        order?.environment = try cells[orderColumnCount].decode(String?.self)
        return order
    }

    /// The transaction in `transactionColumns` from column `offset` on; nil when its id is NULL.
    static func transaction(_ row: PostgresRandomAccessRow, at offset: Int) throws -> AppleTransactionRecord? {
        guard let id = try row[offset].decode(String?.self) else { return nil }
        func cell<T: PostgresDecodable>(_ index: Int, _ type: T.Type) throws -> T { try row[offset + index].decode(T.self) }
        return AppleTransactionRecord(
            transactionId: TransactionID(unchecked: id), orderId: try cell(1, String?.self).map(OrderID.init(unchecked:)),
            userId: try cell(2, String?.self).map(UserID.init(unchecked:)), productId: ProductID(unchecked: try cell(3, String.self)),
            purchaseDate: try cell(4, Date.self), environment: try cell(5, String?.self),
            status: AppleTransactionRecord.Status(rawValue: try cell(6, String.self)) ?? .unmatched,
            receivedAt: try cell(7, Date.self), updatedAt: try cell(8, Date.self), originalTransactionId: try cell(9, String?.self),
            appTransactionId: try cell(10, String?.self), appAccountToken: try cell(11, UUID?.self),
            matchedBy: try cell(12, String?.self).flatMap(MatchedBy.init(rawValue:)),
            verification: try cell(13, String?.self).map { Data($0.utf8) },
            bundleId: try cell(14, String?.self).map(BundleID.init(unchecked:)), storefront: try cell(15, String?.self))
    }

    /// The `orders` rows of a call, one array per column as `append_events` takes them: '' for
    /// absent text, `absentTime` for an absent time.
    struct OrderColumns {
        var writes: [Int32] = [], isNew: [Bool] = [], ids: [String] = [], users: [String] = [], products: [String] = []
        var quantities: [Int32] = [], prices: [String] = [], currencies: [String] = [], tokens: [UUID] = []
        var states: [String] = [], versions: [Int64] = [], transactions: [String] = [], created: [Int64] = []
        var updated: [Int64] = [], queued: [Int64] = [], beforeRefund: [String] = [], failures: [String] = []
        var bundles: [String] = []

        mutating func append(_ order: Order, write: Int, isNew new: Bool) {
            writes.append(Int32(write))
            isNew.append(new)
            ids.append(order.orderId.rawValue)
            users.append(order.userId.rawValue)
            products.append(order.productId.rawValue)
            quantities.append(Int32(order.quantity))
            prices.append(order.price ?? "")
            currencies.append(order.currency ?? "")
            tokens.append(order.appAccountToken)
            states.append(order.state.rawValue)
            versions.append(order.version)
            transactions.append(order.transactionId?.rawValue ?? "")
            created.append(PostgresTime.microseconds(order.createdAt))
            updated.append(PostgresTime.microseconds(order.updatedAt))
            queued.append(order.queuedAt.map(PostgresTime.microseconds) ?? PostgresTime.absent)
            beforeRefund.append(order.stateBeforeRefund?.rawValue ?? "")
            failures.append(order.failureReason ?? "")
            bundles.append(order.bundleId?.rawValue ?? "")
        }
    }

    /// The `apple_transactions` rows of a call, as `OrderColumns` (the nil UUID for an absent token).
    struct TransactionColumns {
        var writes: [Int32] = [], isNew: [Bool] = [], ids: [String] = [], orders: [String] = [], users: [String] = []
        var products: [String] = [], purchased: [Int64] = [], environments: [String] = [], statuses: [String] = []
        var received: [Int64] = [], updated: [Int64] = [], originals: [String] = [], apps: [String] = []
        var tokens: [UUID] = [], matchedBy: [String] = [], verifications: [String] = [], bundles: [String] = []
        var storefronts: [String] = []

        mutating func append(_ row: AppleTransactionRecord, write: Int, isNew new: Bool) {
            writes.append(Int32(write))
            isNew.append(new)
            ids.append(row.transactionId.rawValue)
            orders.append(row.orderId?.rawValue ?? "")
            users.append(row.userId?.rawValue ?? "")
            products.append(row.productId.rawValue)
            purchased.append(PostgresTime.microseconds(row.purchaseDate))
            environments.append(row.environment ?? "")
            statuses.append(row.status.rawValue)
            received.append(PostgresTime.microseconds(row.receivedAt))
            updated.append(PostgresTime.microseconds(row.updatedAt))
            originals.append(row.originalTransactionId ?? "")
            apps.append(row.appTransactionId ?? "")
            tokens.append(row.appAccountToken ?? UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)))
            matchedBy.append(row.matchedBy?.rawValue ?? "")
            verifications.append(row.verification.map { String(decoding: $0, as: UTF8.self) } ?? "")
            bundles.append(row.bundleId?.rawValue ?? "")
            storefronts.append(row.storefront ?? "")
        }
    }
}

/// Times as PostgreSQL keeps them: whole microseconds since 2000-01-01 UTC.
enum PostgresTime {
    static let epoch = Date(timeIntervalSince1970: 946_684_800)
    /// What `append_events` takes for a time that is absent.
    static let absent = Int64.min

    /// `date` rounded to PostgreSQL's microseconds (postgres-nio truncates when it binds a
    /// `Date`, so a time read back and written again could lose one).
    static func microseconds(_ date: Date) -> Int64 {
        Int64((date.timeIntervalSince(epoch) * 1_000_000).rounded())
    }

    /// The time `microseconds` stands for, as postgres-nio reads it back from PostgreSQL.
    static func date(_ microseconds: Int64) -> Date {
        Date(timeInterval: Double(microseconds) / 1_000_000, since: epoch)
    }

    /// Now, to the microsecond PostgreSQL keeps: the time a write's events record and its rows carry.
    static func now() -> (date: Date, microseconds: Int64) {
        let microseconds = Int64((Date().timeIntervalSince(epoch) * 1_000_000).rounded(.down))
        return (date(microseconds), microseconds)
    }
}
