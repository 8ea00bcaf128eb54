import Foundation

/// `consumption-answer`: what the ledger did about Apple's `CONSUMPTION_REQUEST` for a
/// transaction (a customer asked for a refund): the answer it sent with Send Consumption
/// Information, or why none was sent. Recorded where the request was, on the order's stream (or
/// the pooled transaction's); it changes no state.
public struct ConsumptionAnswer: Codable, Sendable, Equatable {
    /// How the request ended.
    public enum Outcome: String, Codable, Sendable, CaseIterable {
        /// Apple took the answer.
        case sent
        /// Apple refused it: not sent again.
        case refused
        /// Not sent within the 12 hours Apple waits for an answer.
        case tooLate = "too-late"
    }

    /// The `CONSUMPTION_REQUEST` notification answered.
    public var notificationUUID: UUID
    public var transactionId: TransactionID
    public var outcome: Outcome
    /// The fields sent (or that would have been), as Apple names them. (`sampleContentProvided`
    /// is absent only from answers recorded before the ledger always sent it.)
    public var deliveryStatus: DeliveryStatus
    public var customerConsented: Bool
    public var sampleContentProvided: Bool?
    public var refundPreference: String?
    public var consumptionPercentage: Int?
    /// Why the catalog's `GRANT_PRORATED` was not sent as it is (`ConsumptionFields.Adjustment`);
    /// absent when the catalog's preference was sent unchanged.
    public var preferenceAdjusted: String?
    /// True when the catalog had no `sampleContentProvided` for the product and the default
    /// (`false`) was sent; absent otherwise.
    public var sampleContentDefaulted: Bool?
    /// Calls made to Apple for it.
    public var attempts: Int
    /// Why it was not sent: the App Store Server API's error code, and Apple's own.
    public var error: String?
    public var appleErrorCode: Int?

    public init(
        notificationUUID: UUID, transactionId: TransactionID, outcome: Outcome, deliveryStatus: DeliveryStatus,
        customerConsented: Bool, sampleContentProvided: Bool? = nil, refundPreference: String? = nil,
        consumptionPercentage: Int? = nil, preferenceAdjusted: String? = nil, sampleContentDefaulted: Bool? = nil, attempts: Int,
        error: String? = nil, appleErrorCode: Int? = nil
    ) {
        self.notificationUUID = notificationUUID
        self.transactionId = transactionId
        self.outcome = outcome
        self.deliveryStatus = deliveryStatus
        self.customerConsented = customerConsented
        self.sampleContentProvided = sampleContentProvided
        self.refundPreference = refundPreference
        self.consumptionPercentage = consumptionPercentage
        self.preferenceAdjusted = preferenceAdjusted
        self.sampleContentDefaulted = sampleContentDefaulted
        self.attempts = attempts
        self.error = error
        self.appleErrorCode = appleErrorCode
    }
}

/// Whether the customer got what they paid for, in Apple's words (Send Consumption Information
/// v2's `deliveryStatus`), from the ledger's facts about the transaction's order.
public enum DeliveryStatus: String, Codable, Sendable, CaseIterable {
    case delivered = "DELIVERED"
    case qualityIssue = "UNDELIVERED_QUALITY_ISSUE"
    case wrongItem = "UNDELIVERED_WRONG_ITEM"
    case serverOutage = "UNDELIVERED_SERVER_OUTAGE"
    case other = "UNDELIVERED_OTHER"

    /// The status of an order in `state` (nil: the transaction has no order), `failureReason` its
    /// `failed` event's reason; `delivered`: whether its stream has a `delivered` event (a refunded
    /// order may have been delivered first). The table is docs/apple.md's.
    public static func of(state: OrderState?, delivered: Bool, failureReason: String?) -> DeliveryStatus {
        if delivered || state == .delivered || state == .finished { return .delivered }
        guard state == .failed, let failureReason else { return .other }
        return byFailureReason[failureReason] ?? .other
    }

    /// The failure reasons that say more than "undelivered": the ledger's own `product-mismatch`,
    /// and the reasons a backend may give when it fails an order it could not deliver.
    public static let byFailureReason: [String: DeliveryStatus] = [
        "product-mismatch": .wrongItem,
        "wrong-item": .wrongItem,
        "quality-issue": .qualityIssue,
        "server-outage": .serverOutage,
        "delivery-failed": .serverOutage,
    ]
}

/// What a consumption answer sends, made from the ledger's facts so that Apple takes it
/// (docs/apple.md, "Consumption answers"): every field Apple requires, and only the combinations
/// Apple's field rules allow. Apple asks for a `consumptionPercentage` of 0 with a
/// `deliveryStatus` other than `DELIVERED`, and refuses `GRANT_PRORATED` without a percentage above 0
/// and below 100,000; the ledger then sends the preference a prorated refund comes to, or none.
public struct ConsumptionFields: Sendable, Equatable {
    public var deliveryStatus: DeliveryStatus
    public var sampleContentProvided: Bool
    public var refundPreference: RefundPreference?
    public var consumptionPercentage: Int?
    /// Why the catalog's preference was changed; nil when it was sent as it is.
    public var preferenceAdjusted: Adjustment?
    /// The catalog had no `sampleContentProvided`: `defaultSampleContentProvided` was sent.
    public var sampleContentDefaulted: Bool

    /// Why `GRANT_PRORATED` was not sent.
    public enum Adjustment: String, Codable, Sendable, CaseIterable {
        /// Not delivered: nothing was consumed, so a prorated refund is a full one (`GRANT_FULL`).
        case notDelivered = "not-delivered"
        /// Delivered and 0 consumed: a prorated refund is a full one (`GRANT_FULL`).
        case nothingConsumed = "nothing-consumed"
        /// Delivered and all of it consumed: a prorated refund is nothing (`DECLINE`).
        case fullyConsumed = "fully-consumed"
        /// Delivered, and the backend gave no `consumptionPercentage`: no share to prorate by, so
        /// no preference is sent and Apple decides on its own factors.
        case noConsumptionPercentage = "no-consumption-percentage"
    }

    /// What is sent when the catalog does not say whether a sample or trial was offered: the
    /// ledger does not claim one it does not know of.
    public static let defaultSampleContentProvided = false

    /// The fields for a transaction whose order is in `deliveryStatus`, `consumed` the last
    /// `delivered` event's `consumptionPercentage`, and the catalog's two values for its product.
    /// An auto-renewable subscription's transaction (`autoRenewable`) sends no percentage: Apple
    /// refuses one for them (ConsumptionPercentageAutoRenewableSubscriptionError) and computes the
    /// share of a prorated refund itself, so `GRANT_PRORATED` is sent as it is.
    public init(
        deliveryStatus: DeliveryStatus, consumed: Int?, sampleContentProvided: Bool?, refundPreference: RefundPreference?,
        autoRenewable: Bool = false
    ) {
        self.deliveryStatus = deliveryStatus
        self.sampleContentProvided = sampleContentProvided ?? Self.defaultSampleContentProvided
        sampleContentDefaulted = sampleContentProvided == nil
        // A share only of what was delivered: Apple asks for 0 with any other status (its
        // deliveryStatus page: "set the consumptionPercentage to 0; otherwise, the request fails").
        consumptionPercentage = autoRenewable ? nil : deliveryStatus == .delivered ? consumed : 0
        self.refundPreference = refundPreference
        preferenceAdjusted = nil
        guard refundPreference == .grantProrated, !autoRenewable else { return }
        switch (deliveryStatus, consumptionPercentage) {
        case (.delivered, nil): (self.refundPreference, preferenceAdjusted) = (nil, .noConsumptionPercentage)
        case (.delivered, let share?) where share <= 0: (self.refundPreference, preferenceAdjusted) = (.grantFull, .nothingConsumed)
        case (.delivered, let share?) where share >= 100_000: (self.refundPreference, preferenceAdjusted) = (.decline, .fullyConsumed)
        case (.delivered, _): break
        default: (self.refundPreference, preferenceAdjusted) = (.grantFull, .notDelivered)
        }
    }
}

/// The catalog's refund preference for a product (Send Consumption Information v2's
/// `refundPreference`).
public enum RefundPreference: String, Codable, Sendable, CaseIterable {
    case decline = "DECLINE"
    case grantFull = "GRANT_FULL"
    case grantProrated = "GRANT_PRORATED"
}

/// The fields a `delivered` event may carry.
public struct DeliveredFields: Codable, Sendable, Equatable {
    /// How much of the purchase the customer consumed, in thousandths of a percent (0 to 100,000),
    /// as Apple takes it in a consumption answer.
    public var consumptionPercentage: Int?
    public init(consumptionPercentage: Int? = nil) { self.consumptionPercentage = consumptionPercentage }

    enum CodingKeys: String, CodingKey { case consumptionPercentage }

    /// A share with a fraction (`0.5`) is named as what it is, not taken for JSON that does not
    /// parse (the decoder's own error for it names no field).
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        guard container.contains(.consumptionPercentage), try !container.decodeNil(forKey: .consumptionPercentage) else {
            consumptionPercentage = nil
            return
        }
        if let whole = try? container.decode(Int.self, forKey: .consumptionPercentage) {
            consumptionPercentage = whole
        } else if let number = try? container.decode(Double.self, forKey: .consumptionPercentage) {
            throw LedgerInputError(field: "consumptionPercentage", problem: "is \(number); it must be a whole number from 0 to 100000 (thousandths of a percent)")
        } else {
            consumptionPercentage = try container.decode(Int.self, forKey: .consumptionPercentage)
        }
    }
}
