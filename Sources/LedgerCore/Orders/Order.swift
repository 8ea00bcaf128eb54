import Foundation

/// The current state of one order, folded from its events by `Order.evolve`.
public struct Order: Sendable, Equatable, Codable {
    public var orderId: OrderID
    public var userId: UserID
    public var productId: ProductID
    public var quantity: Int
    public var price: String?
    public var currency: String?
    public var appAccountToken: UUID
    public var state: OrderState
    /// The stream version of the order's last event.
    public var version: Int64
    public var transactionId: TransactionID?
    public var createdAt: Date
    public var updatedAt: Date
    /// When the client last put the payment into the StoreKit queue (the reconciler's tie-break).
    public var queuedAt: Date?
    /// The state a refund interrupted, restored by `refund-reversed`.
    public var stateBeforeRefund: OrderState?
    public var failureReason: String?
    /// The App Store environment of the order's Apple transaction (`Production`, `Sandbox`), nil
    /// while it has none. Not a column of the `orders` projection: reads take it from the
    /// transaction's row (`apple_transactions.environment`), which the log projects already.
    public var environment: String?
    /// The app the order belongs to (set when it is created, never changed); nil only in a
    /// ledger that holds no app.
    public var bundleId: BundleID?

    public init(
        orderId: OrderID, userId: UserID, productId: ProductID, quantity: Int, price: String?, currency: String?,
        appAccountToken: UUID, state: OrderState, version: Int64, transactionId: TransactionID?, createdAt: Date,
        updatedAt: Date, queuedAt: Date?, stateBeforeRefund: OrderState?, failureReason: String?, environment: String? = nil,
        bundleId: BundleID? = nil
    ) {
        self.orderId = orderId
        self.userId = userId
        self.productId = productId
        self.quantity = quantity
        self.price = price
        self.currency = currency
        self.appAccountToken = appAccountToken
        self.state = state
        self.version = version
        self.transactionId = transactionId
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.queuedAt = queuedAt
        self.stateBeforeRefund = stateBeforeRefund
        self.failureReason = failureReason
        self.environment = environment
        self.bundleId = bundleId
    }
}

extension Order {
    /// Open: no transaction yet, and not closed; the orders a transaction may still go to
    /// (the reconciler's candidates: created, payment-added).
    public var isOpen: Bool { (state == .created || state == .paymentAdded) && transactionId == nil }

    /// Applies one accepted event (the event at `version`, recorded at `date`). Pure: projections
    /// and replays both use it. An event the transition table refuses leaves the order unchanged.
    public static func evolve(_ order: Order?, _ event: OrderEvent, orderID: OrderID, version: Int64, at date: Date) -> Order? {
        guard OrderTransitions.isAllowed(event.type, from: order?.state) else { return order }
        if case .created(let body) = event {
            return Order(
                orderId: orderID, userId: body.userId, productId: body.productId, quantity: body.quantity,
                price: body.price, currency: body.currency, appAccountToken: body.appAccountToken,
                state: .created, version: version, transactionId: nil, createdAt: body.createdAt ?? date, updatedAt: date,
                queuedAt: nil, stateBeforeRefund: nil, failureReason: nil, bundleId: body.bundleId)
        }
        guard var next = order else { return nil }
        next.version = version
        next.updatedAt = date
        switch event {
        case .created:
            break
        case .paymentAdded(let body):
            next.state = .paymentAdded
            next.queuedAt = body.queuedAt
        case .receiptReceived(let body):
            next.state = .receiptReceived
            next.transactionId = body.transactionId
            next.environment = body.environment
        case .verified(let body):
            next.state = .verified
            // Only a transaction's environment: a client's own `verified` without one names none.
            if next.transactionId != nil, let environment = body.environment { next.environment = environment }
        case .delivered:
            next.state = .delivered
        case .finished:
            next.state = .finished
        case .refunded:
            next.stateBeforeRefund = next.state
            next.state = .refunded
        case .refundReversed:
            next.state = next.stateBeforeRefund ?? .verified
            next.stateBeforeRefund = nil
        case .failed(let body):
            next.state = .failed
            next.failureReason = body.reason
        case .notificationReceived, .consumptionAnswer:
            break
        case .pairingUndone:
            // Back to where it stood before the receipt.
            next.state = next.queuedAt == nil ? .created : .paymentAdded
            next.transactionId = nil
            next.environment = nil
        }
        return next
    }

    /// Decides whether `event` may be appended to `order` (nil: no order yet): the events to
    /// append, or why not.
    public static func decide(_ order: Order?, _ event: OrderEvent) -> Result<[OrderEvent], OrderDecisionError> {
        if case .created = event, let order {
            return .failure(.orderExists(order.orderId))
        }
        guard OrderTransitions.isAllowed(event.type, from: order?.state) else {
            guard let order else { return .failure(.noSuchOrder) }
            return .failure(.transitionNotAllowed(
                state: order.state, type: event.type, allowed: OrderTransitions.allowed(from: order.state)))
        }
        return .success([event])
    }
}

/// Why an order event was refused, with a stable code.
public enum OrderDecisionError: Error, Sendable, Equatable, CustomStringConvertible {
    case transitionNotAllowed(state: OrderState, type: OrderEventType, allowed: [OrderEventType])
    case orderExists(OrderID)
    case noSuchOrder

    public var code: String {
        switch self {
        case .transitionNotAllowed: "transition-not-allowed"
        case .orderExists: "order-exists"
        case .noSuchOrder: "order-not-found"
        }
    }

    public var description: String {
        return switch self {
        case .transitionNotAllowed(let state, let type, let allowed):
            Self.refusal(state: state, type: type, allowed: allowed)
        case .orderExists(let id): "order \(id) already exists"
        case .noSuchOrder: "the order does not exist"
        }
    }

    static func refusal(state: OrderState, type: OrderEventType, allowed: [OrderEventType]) -> String {
        let list = allowed.isEmpty ? "none: the order is closed" : allowed.map(\.rawValue).joined(separator: ", ")
        return "\(type.rawValue) is not allowed when the order is \(state.rawValue); allowed: \(list)"
    }
}

/// Why an order cannot be paid by a purchase as Apple signed it (promise 7): another product,
/// else another quantity (an order of more units than Apple sold would grant what was never
/// paid for, one of fewer would short the customer).
public enum PurchaseMismatch: String, Sendable, Equatable {
    case product = "product-mismatch"
    case quantity = "quantity-mismatch"
}

extension Order {
    /// The one statement of the product check: nil when a purchase of `product`, `quantity`
    /// units, may pay this order.
    public func mismatch(product: ProductID, quantity: Int) -> PurchaseMismatch? {
        if productId != product { return .product }
        if self.quantity != quantity { return .quantity }
        return nil
    }
}
