import Foundation
import LedgerCore
import LedgerJSON
import Logging
import PostgresNIO

/// Orders over the event log: creating one, appending a client's event to it, reading them.
/// Every append goes through `LedgerWriter`, which decides it with the state machine.
public struct OrderLedger: Sendable {
    public let writer: LedgerWriter
    public let store: EventStore
    /// The app a new order belongs to.
    public let apps: OrderApps
    public var database: Database { writer.database }
    /// How much earlier than an order's creation a purchase Apple signed may be and still pay it
    /// through a client's `receipt-received` (issue 41, the reconciler's clock skew); nil: no limit.
    public let purchaseAllowance: TimeInterval?

    public init(writer: LedgerWriter, purchaseAllowance: TimeInterval? = nil) {
        self.writer = writer
        self.purchaseAllowance = purchaseAllowance
        self.store = EventStore(database: writer.database)
        self.apps = OrderApps(catalog: AppCatalog(database: writer.database))
    }

    /// What an append did to an order.
    public struct Outcome: Sendable {
        public let order: Order
        /// False when this was a retry of an event already stored: nothing was appended.
        public let appended: Bool
        /// The order's whole history when the append knows it without reading it (a creation).
        public var events: [RecordedEvent]? = nil
    }

    /// Creates the order, or answers the existing one when the same order is created again. Its
    /// app is the one `body` names, or the ledger's only one (`OrderApps`), recorded in the event.
    /// In an app of per-user tokens (`appAccountTokens: user`) the token is the user's: the one
    /// given, else the one the user's orders carry, else one named by the app and the user.
    public func create(_ id: OrderID, _ body: OrderCreated, tokenGiven: Bool, metadata: Data) async throws -> Outcome {
        var body = body
        do {
            let app = try await apps.app(of: body.bundleId)
            body.bundleId = app?.bundleId
            if app?.appAccountTokens == .user {
                body.appAccountTokenScope = .user
                // The user's first token is named by the app and the user, so two servers creating
                // the user's first orders at once give both the same, and by the database's secret,
                // so that no one can name another user's (sql/migrations/046_user_token_secret.sql).
                if !tokenGiven {
                    let (token, secret) = try await userToken(body.userId, in: app?.bundleId)
                    body.appAccountToken = token
                        ?? EventID.named("user-token", secret.uuidString, app?.bundleId.rawValue ?? "", body.userId.rawValue).uuid
                }
            }
        } catch {
            // A retry of a create that succeeded answers its order, even after its app was
            // retired or a second app made `bundleId` required.
            guard let existing = try await order(id) else { throw error }
            return try sameOrder(existing, body, tokenGiven: tokenGiven)
        }
        let event = try EventCoding.newEvent(.created(body), id: EventID(), metadata: metadata)
        do {
            let appended = try await writer.append([event], to: id.streamID)
            guard let order = appended.order else {
                // A replay of this request's own event (its id is new): stored by an earlier try
                // of this very write, so created here all the same.
                return Outcome(order: try await orderAsOf(id, version: appended.result.streamVersion), appended: true)
            }
            return Outcome(order: order, appended: true, events: appended.events)
        } catch OrderDecisionError.orderExists {
            // Created before (a retry), or by a concurrent request: the same order, or a conflict.
            guard let existing = try await order(id) else { throw OrderDecisionError.noSuchOrder }
            return try sameOrder(existing, body, tokenGiven: tokenGiven)
        }
    }

    private func sameOrder(_ existing: Order, _ body: OrderCreated, tokenGiven: Bool) throws -> Outcome {
        let same = existing.userId == body.userId && existing.productId == body.productId && existing.quantity == body.quantity
            && Self.sameDecimal(existing.price, body.price) && existing.currency == body.currency
            && (!tokenGiven || existing.appAccountToken == body.appAccountToken)
            && (body.bundleId == nil || existing.bundleId == body.bundleId)
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

    /// Appends a client's event (`data`: its body as sent, from which `event` was read; nil: as
    /// the ledger writes it). A retry of an event id already stored with the same body answers
    /// the order as that event left it, whatever its state now (promise 3).
    public func append(
        _ id: OrderID, event: OrderEvent, eventID: EventID, expected: ExpectedVersion?, data: Data? = nil, metadata: Data
    ) async throws -> Outcome {
        if case .receiptReceived(let receipt) = event, let original = receipt.originalTransactionId, original != receipt.transactionId.rawValue {
            // By the client's own word a later transaction of a purchase (a renewal, a restore, an
            // upgrade, a family member's share): never an order's (issue 40).
            throw OrderLedgerError.laterTransaction(receipt.transactionId, original: original)
        }
        var (event, data) = (event, data)
        if case .verified(var verified) = event, verified.transactionId == nil, verified.environment != nil,
           let own = try await order(id)?.transactionId {
            // The environment is its transaction's, placed on it only with the transaction named:
            // the order's own is named for the client (one that has moved on since is refused by the
            // writer, `transaction-mismatch`), so that what the answer says is what is stored and
            // what the reports count. Its retry names the same: a `verified` stands on a backend's
            // own claim, which support cannot undo, and nothing else takes it back.
            verified.transactionId = own
            event = .verified(verified)
            data = try data.map { try Self.naming(own, in: $0) }
        }
        try await checkEnvironment(of: event, eventID: eventID, on: id)
        let newEvent = try data.map { NewEvent(id: eventID, body: .order(event), data: $0, metadata: metadata) }
            ?? EventCoding.newEvent(event, id: eventID, metadata: metadata)
        let write = LedgerWriter.Write(LedgerWriter.Append([newEvent], to: id.streamID, expected: expected ?? .any), purchaseAllowance: purchaseAllowance)
        let appended = try await writer.append(write).appends[0]
        guard let order = appended.order else {
            return Outcome(order: try await orderAsOf(id, version: appended.result.streamVersion), appended: false)
        }
        return Outcome(order: order, appended: true)
    }

    /// An event's `data` object with `transactionId` set to `id`, its other members as given: the
    /// member added last, which PostgreSQL keeps over an earlier one of the name (a `null` sent),
    /// and the text left as it is, so that no number is read and written again.
    static func naming(_ id: TransactionID, in data: Data) throws -> Data {
        var text = String(decoding: data, as: UTF8.self)
        guard let end = text.lastIndex(of: "}") else { return data }
        let member = String(decoding: try JSONEncoder().encode(id.rawValue), as: UTF8.self)
        let empty = text[text.index(after: text.firstIndex(of: "{") ?? text.startIndex)..<end].allSatisfy(\.isWhitespace)
        text.insert(contentsOf: (empty ? "" : ",") + #""transactionId":"# + member, at: end)
        return Data(text.utf8)
    }

    /// Refuses a backend's own purchase in an environment its order's app does not take (an app
    /// set to `Production` alone takes no `Sandbox` purchase, and the other way round), as its
    /// proofs of that environment are refused. Asked of the apps' copy first, so that a ledger
    /// whose apps take both environments reads nothing more; a retry of an event stored before the
    /// app's environments changed, and an order that does not exist, are left to the writer.
    func checkEnvironment(of event: OrderEvent, eventID: EventID, on id: OrderID) async throws {
        guard let named = Self.environment(of: event).flatMap(App.Environment.init(name:)), try await apps.anyRefuses(named),
              let order = try await order(id), let app = try await apps.app(ofOrder: order.bundleId), !app.environments.contains(named)
        else { return }
        let stored = try await database.transaction { tx in try await store.event(eventID, in: tx) }
        guard stored == nil else { return }
        throw OrderLedgerError.environmentRefused(app.bundleId, environment: named.rawValue)
    }

    /// The environment a backend's own purchase names (`receipt-received`, `verified`), if any.
    static func environment(of event: OrderEvent) -> String? {
        switch event {
        case .receiptReceived(let receipt): receipt.environment
        case .verified(let verified): verified.environment
        default: nil
        }
    }

    /// The order as it stood right after its event `version`: what the first answer to an append
    /// said, given again to its retries.
    public func orderAsOf(_ id: OrderID, version: Int64) async throws -> Order {
        var order: Order?
        for event in try await store.readStream(id.streamID) where event.streamVersion <= version {
            guard case .order(let body)? = try? EventCoding.body(stream: event.streamID, type: event.type, data: event.data) else { continue }
            order = Order.evolve(order, body, orderID: id, version: event.streamVersion, at: event.recordedAt)
        }
        guard let order else { throw OrderDecisionError.noSuchOrder }
        return order
    }

    /// The order as its projection row has it, or nil.
    public func order(_ id: OrderID) async throws -> Order? {
        let rows = try await database.query("SELECT \(unescaped: ProjectionRows.orderAnswerColumns) FROM \(unescaped: ProjectionRows.ordersWithEnvironment) WHERE o.order_id = \(id.rawValue)")
        return try ProjectionRows.orders(rows.rows).first
    }

    /// The order whose `appAccountToken` is `token`, if one is: tokens are per app, so app
    /// `bundleId`'s (Apple's spelling, any case) first, else another app's (which the caller then
    /// refuses as `app-mismatch`).
    public func orderID(appAccountToken token: UUID, bundleId: String) async throws -> OrderID? {
        try await Self.orderID(from: database.query(Self.orderWithToken(token, bundleId)))
    }

    /// `orderID(appAccountToken:bundleId:)` in the caller's transaction.
    public func orderID(appAccountToken token: UUID, bundleId: String, in transaction: DatabaseTransaction) async throws -> OrderID? {
        try await Self.orderID(from: transaction.connection.guardedQuery(Self.orderWithToken(token, bundleId), logger: database.logger))
    }

    /// A per-user token names no order (024_account_tokens.sql). The app Apple signed for is
    /// asked first: its own per-user token (no order) is the answer, even when another app's
    /// order carries the same token (tokens are per app, 030_tokens_per_app.sql).
    private static func orderWithToken(_ token: UUID, _ bundleId: String) -> PostgresQuery {
        """
        SELECT order_id FROM app_account_tokens
         WHERE app_account_token = \(token) AND (order_id IS NOT NULL OR lower(bundle_id) = lower(\(bundleId)))
         ORDER BY lower(bundle_id) IS NOT DISTINCT FROM lower(\(bundleId)) DESC LIMIT 1
        """
    }

    /// The user whose per-user token `token` is in app `bundleId` (any case; a token of no app,
    /// in a ledger without apps, too), in the caller's transaction, as the reconciler's pool
    /// resolves it: nil for an order's token, or one the ledger does not hold.
    public func user(ofAccountToken token: UUID, bundleId: String, in transaction: DatabaseTransaction) async throws -> UserID? {
        let rows = try await transaction.connection.guardedQuery(
            """
            SELECT user_id FROM app_account_tokens
             WHERE app_account_token = \(token) AND order_id IS NULL AND (bundle_id IS NULL OR lower(bundle_id) = lower(\(bundleId)))
             ORDER BY bundle_id IS NULL LIMIT 1
            """,
            logger: database.logger)
        for try await user in rows.decode(String.self) { return UserID(unchecked: user) }
        return nil
    }

    /// The per-user token the user's orders in app `bundleID` carry, if they carry one, and the
    /// database's secret a first one is named with.
    func userToken(_ user: UserID, in bundleID: BundleID?) async throws -> (token: UUID?, secret: UUID) {
        let rows = try await database.query(
            """
            SELECT (SELECT app_account_token FROM app_account_tokens
                     WHERE bundle_id = \(bundleID?.rawValue ?? "") AND user_id = \(user.rawValue) AND order_id IS NULL
                     LIMIT 1),
                   (SELECT value FROM ledger_secrets WHERE name = 'user-token')
            """)
        for try await (token, secret) in rows.decode((UUID?, UUID).self) { return (token, secret) }
        // A SELECT of no table answers one row: never here.
        throw OrderDecisionError.noSuchOrder
    }

    private static func orderID(from rows: some AsyncSequence<PostgresRow, any Error>) async throws -> OrderID? {
        for try await id in rows.decode(String?.self) { return id.map(OrderID.init(unchecked:)) }
        return nil
    }

    /// Orders filtered by user, product and state, after the order id `after` (for paging), in
    /// order id order.
    /// `bundleID`: only that app's (user and product ids are per app); `apps` (an API key's): those of these apps alone.
    public func orders(
        userID: UserID?, productID: ProductID?, states: [OrderState]?, after: OrderID?, limit: Int, bundleID: BundleID? = nil,
        apps: [BundleID]? = nil
    ) async throws -> [Order] {
        let states = states?.map(\.rawValue)
        let apps = apps?.map(\.rawValue)
        let rows = try await database.query(
            """
            SELECT \(unescaped: ProjectionRows.orderAnswerColumns) FROM \(unescaped: ProjectionRows.ordersWithEnvironment)
            WHERE (\(bundleID?.rawValue)::text IS NULL OR lower(o.bundle_id) = lower(\(bundleID?.rawValue)))
              AND (\(userID?.rawValue)::text IS NULL OR o.user_id = \(userID?.rawValue))
              AND (\(productID?.rawValue)::text IS NULL OR o.product_id = \(productID?.rawValue))
              AND (\(states)::text[] IS NULL OR o.state = ANY(\(states)::text[]))
              AND (\(after?.rawValue)::text IS NULL OR o.order_id > \(after?.rawValue))
              AND (\(apps)::text[] IS NULL OR o.bundle_id = ANY(\(apps)::text[]))
            ORDER BY o.order_id LIMIT \(min(max(limit, 1), 1000))
            """)
        return try ProjectionRows.orders(rows.rows)
    }
}

/// Refusals of the ledger beyond the state machine, with stable codes.
public enum OrderLedgerError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The Apple transaction already belongs to another order.
    case duplicateTransaction(TransactionID)
    /// Apple refunded (or revoked) the transaction while it waited in the pool: no order ever
    /// takes it.
    case refundedInPool(TransactionID)
    /// Another order already uses this appAccountToken.
    case appAccountTokenTaken(UUID)
    /// An order that names no app, in a ledger that holds several.
    case bundleIDRequired
    /// An order of an app the ledger does not hold.
    case unknownApp(BundleID)
    /// An order of an app that is retired.
    case appRetired(BundleID)
    /// The Apple transaction belongs to another app than the order (issue 39).
    case appMismatch(TransactionID)
    /// The Apple transaction is of an Apple account (or token) the ledger knows for another user
    /// than the order's, or waits for support to decide between them (issue 41).
    case accountConflict(TransactionID)
    /// An imported grant of an Apple transaction that waits in the pool for another user or
    /// product than the history's line says (issue 41: a conflicting line is refused, never
    /// written over what Apple signed or a client claimed).
    case pooledOtherwise(TransactionID, user: UserID?, product: ProductID)
    /// An imported grant of an Apple transaction waiting in the pool whose purchase date or
    /// environment, as Apple signed it, is not the line's (`field`): the reports would date or
    /// place the sale by the line.
    case pooledSignedOtherwise(TransactionID, field: String, apple: String, line: String)
    /// A `receipt-received` naming an order of another user than the one a transaction waits in
    /// the pool for (a client claimed it for that user first): across users, support's hand alone
    /// pairs it, with `force` and a reason (docs/reconciliation.md).
    case pooledForAnotherUser(TransactionID, user: UserID)
    /// A client's `receipt-received` of a transaction Apple signed as purchased before the order
    /// was created, beyond the clock-skew allowance (issue 41): it never pays that order but by
    /// support's hand, with an explicit override.
    case purchasedBeforeOrder(TransactionID)
    /// A `receipt-received` of a transaction waiting in the pool for another product, or another
    /// quantity, than the order's, as Apple signed it (promise 7).
    case productMismatch(TransactionID, apple: ProductID, order: ProductID)
    case quantityMismatch(TransactionID, apple: Int, order: Int)
    /// A backend's own purchase (`receipt-received`, `verified`, an imported line) in an
    /// environment its app refuses: an app set to `Production` alone takes no sandbox purchase by
    /// any way, as it takes no sandbox proof.
    case environmentRefused(BundleID, environment: String)
    /// A client's `receipt-received` of a transaction whose `originalTransactionId` is another's (by
    /// the client's word, or as the ledger holds it signed): a later transaction of a purchase, or
    /// a family member's share (`original` its own id then), which never pays an order (issue 40).
    case laterTransaction(TransactionID, original: String)
    /// A `verified` naming another Apple transaction than the one its order's `receipt-received`
    /// named: the order is paid by that one, and the log would say otherwise.
    case verifiedOtherTransaction(TransactionID, order: TransactionID)

    public var code: String {
        switch self {
        case .duplicateTransaction: "duplicate-transaction"
        case .refundedInPool: "transaction-refunded"
        case .appAccountTokenTaken: "app-account-token-taken"
        case .bundleIDRequired: "bundle-id-required"
        case .unknownApp: "unknown-app"
        case .appRetired: "app-retired"
        case .appMismatch: "app-mismatch"
        case .accountConflict: "account-conflict"
        case .pooledOtherwise, .pooledSignedOtherwise: "transaction-pooled"
        case .pooledForAnotherUser: "user-mismatch"
        case .purchasedBeforeOrder: "purchased-before-order"
        case .productMismatch: "product-mismatch"
        case .quantityMismatch: "quantity-mismatch"
        case .laterTransaction: "later-transaction"
        case .environmentRefused: "wrong-environment"
        case .verifiedOtherTransaction: "transaction-mismatch"
        }
    }

    public var description: String {
        switch self {
        case .duplicateTransaction(let id): "Apple transaction \(id) already belongs to another order"
        case .refundedInPool(let id): "Apple refunded transaction \(id) while it waited in the pool, paid to no order: it is never granted"
        case .appAccountTokenTaken(let token): "appAccountToken \(token.uuidString.lowercased()) already belongs to another order"
        case .bundleIDRequired: "bundleId is required: the ledger holds several apps"
        case .unknownApp(let id): "the ledger holds no app \(id)"
        case .appRetired(let id): "app \(id) is retired: it takes no new orders"
        case .appMismatch(let id): "Apple transaction \(id) belongs to another app than the order"
        case .accountConflict(let id):
            "Apple transaction \(id) is of an Apple account the ledger knows for another user: support decides (POST /v1/transactions/\(id)/match with a reason)"
        case .pooledOtherwise(let id, let user, let product):
            "Apple transaction \(id) waits in the pool for \(user.map { "user \($0)" } ?? "no user yet"), product \(product): the line says otherwise"
        case .pooledSignedOtherwise(let id, let field, let apple, let line):
            "Apple transaction \(id) waits in the pool with the \(field) Apple signed, \(apple); the line says \(line)"
        case .pooledForAnotherUser(let id, let user):
            "Apple transaction \(id) waits in the pool for user \(user), not the order's: support pairs it across users (POST /v1/transactions/\(id)/match with force and a reason)"
        case .purchasedBeforeOrder(let id):
            "Apple transaction \(id) was purchased before the order was created: it did not pay for it (support may tie it with an explicit override)"
        case .productMismatch(let id, let apple, let order): "Apple transaction \(id) is for \(apple), the order for \(order)"
        case .quantityMismatch(let id, let apple, let order): "Apple transaction \(id) is for \(apple) units, the order for \(order)"
        case .environmentRefused(let app, let environment):
            "app \(app) does not take the \(environment) environment (its environments: ledger apps set --environments, docs/apps.md)"
        case .laterTransaction(let id, let original) where original == id.rawValue:
            "Apple transaction \(id) is a family member's shared access: it never pays an order"
        case .verifiedOtherTransaction(let named, let order):
            "data.transactionId is \(named), but the order's receipt-received named \(order): a verified names the order's transaction, or none"
        case .laterTransaction(let id, let original):
            "Apple transaction \(id) is a later transaction of \(original) (a renewal, restore, upgrade or family member's share): it never pays an order"
        }
    }
}
