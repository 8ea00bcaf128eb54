/// Where an order stands: the type of its last state-changing event.
public enum OrderState: String, Codable, Sendable, CaseIterable {
    case created
    case paymentAdded = "payment-added"
    case receiptReceived = "receipt-received"
    case verified, delivered, finished, failed, refunded

    /// True once the client may finish the StoreKit transaction: the goods were delivered, or the
    /// order was definitively rejected (promise 11, docs/architecture.md).
    public var clientMayFinish: Bool {
        switch self {
        case .delivered, .finished, .failed, .refunded: true
        case .created, .paymentAdded, .receiptReceived, .verified: false
        }
    }
}

/// The type of an order event, exactly as it is named on the wire.
public enum OrderEventType: String, Codable, Sendable, CaseIterable {
    case created
    case paymentAdded = "payment-added"
    case receiptReceived = "receipt-received"
    case verified, delivered, finished, refunded
    case refundReversed = "refund-reversed"
    case failed
    /// An App Store Server Notification recorded on the order; it changes no state, and only the
    /// ledger writes it (from `POST /v1/notifications/apple`).
    case notificationReceived = "notification-received"
    /// Support undid the order's pairing before delivery (`POST /v1/transactions/{id}/unmatch`):
    /// only the ledger writes it.
    case pairingUndone = "pairing-undone"
    /// The ledger's answer to Apple's `CONSUMPTION_REQUEST` about the order's transaction (sent,
    /// refused, or too late); it changes no state, and only the ledger writes it.
    case consumptionAnswer = "consumption-answer"

    /// Whether clients may append this type through the API.
    public var isWrittenByClients: Bool { ![.notificationReceived, .pairingUndone, .consumptionAnswer].contains(self) }

    /// A record on the order's stream, not a transition: any existing order takes it.
    public var isRecord: Bool { self == .notificationReceived || self == .consumptionAnswer }
}

/// The order state machine's transition table: the only place that knows it.
public enum OrderTransitions {
    /// The event types an order accepts in `state` (nil: no order yet).
    public static func allowed(from state: OrderState?) -> [OrderEventType] {
        switch state {
        case nil: [.created]
        case .created: [.paymentAdded, .receiptReceived, .failed]
        case .paymentAdded: [.receiptReceived, .failed]
        case .receiptReceived: [.verified, .failed, .pairingUndone]
        case .verified: [.delivered, .refunded, .failed, .pairingUndone]
        case .delivered: [.finished, .refunded, .failed]
        case .finished: [.refunded]
        case .refunded: [.refundReversed]
        case .failed: []
        }
    }

    public static func isAllowed(_ type: OrderEventType, from state: OrderState?) -> Bool {
        if type.isRecord { return state != nil }
        return allowed(from: state).contains(type)
    }
}
