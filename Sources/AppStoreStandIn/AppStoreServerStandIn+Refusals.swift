import Foundation
import NIOCore

/// Apple's refusals of the request bodies the stand-in checks, with Apple's `errorCode`s.
extension AppStoreServerStandIn {
    /// Apple's error codes for the refusals played here. Those marked "Apple's libraries" are in
    /// the `APIError` enum of Apple's App Store Server Library (Swift and Python); the others are
    /// error types Apple's documentation names without a code in any of Apple's libraries.
    public enum AppleErrorCode {
        /// Apple's libraries: no error code documented for a body that is not JSON at all; Apple
        /// answers 400 with GeneralBadRequest's code here too.
        public static let generalBadRequest = 4000000
        /// Apple's libraries.
        public static let startDateTooFarInPast = 4000012
        public static let startDateAfterEndDate = 4000013
        public static let invalidPaginationToken = 4000014
        public static let invalidStartDate = 4000015
        public static let invalidEndDate = 4000016
        public static let paginationTokenExpired = 4000017
        public static let invalidCustomerConsented = 4000035
        public static let invalidDeliveryStatus = 4000036
        public static let invalidSampleContentProvided = 4000041
        /// InvalidRefundPreferenceError: not in Apple's libraries; 4000044 is what third-party
        /// clients use.
        public static let invalidRefundPreference = 4000044
        /// ConsumptionPercentageOutOfRangeError and UndeliveredConsumptionPercentageNonZeroError:
        /// documented by Apple without a code; the stand-in answers GeneralBadRequest's code with
        /// Apple's error name in the message.
        public static let consumptionPercentageOutOfRange = 4000000
        public static let undeliveredConsumptionPercentageNonZero = 4000000
        /// ConsumptionPercentageAutoRenewableSubscriptionError: documented by Apple without a code,
        /// answered as the two above.
        public static let consumptionPercentageAutoRenewableSubscription = 4000000
    }

    static let deliveryStatuses: Set<String> = [
        "DELIVERED", "UNDELIVERED_QUALITY_ISSUE", "UNDELIVERED_WRONG_ITEM", "UNDELIVERED_SERVER_OUTAGE", "UNDELIVERED_OTHER",
    ]
    static let refundPreferences: Set<String> = ["DECLINE", "GRANT_FULL", "GRANT_PRORATED"]

    /// A 400 with Apple's `errorCode` and message.
    static func refusal(_ code: Int, _ message: String) -> (Int, String) {
        let body = (try? JSONSerialization.data(withJSONObject: ["errorCode": code, "errorMessage": message])) ?? Data()
        return (400, String(decoding: body, as: UTF8.self))
    }

    /// Apple's refusal of a Send Consumption Information (v2) body, or nil when Apple takes it:
    /// the three required fields, the enumerations, the percentage's range, and the combinations
    /// Apple's field rules forbid (a percentage other than 0, or none, when not delivered; `GRANT_PRORATED`
    /// without a percentage above 0 and below 100,000, any percentage for an auto-renewable
    /// subscription's transaction, whose share Apple computes itself).
    @Sendable static func refusal(ofConsumption body: ByteBuffer, autoRenewable: Bool = false) -> (Int, String)? {
        guard let fields = try? JSONDecoder().decode([String: JSONField].self, from: body) else {
            return refusal(AppleErrorCode.generalBadRequest, "Malformed request.")
        }
        guard case .bool(true)? = fields["customerConsented"] else {
            return refusal(AppleErrorCode.invalidCustomerConsented, "Invalid request. The customer consented field must be true.")
        }
        guard case .string(let delivery)? = fields["deliveryStatus"], deliveryStatuses.contains(delivery) else {
            return refusal(AppleErrorCode.invalidDeliveryStatus, "Invalid request. The delivery status field is invalid.")
        }
        guard case .bool? = fields["sampleContentProvided"] else {
            return refusal(AppleErrorCode.invalidSampleContentProvided, "Invalid request. The sample content provided field is invalid.")
        }
        var preference: String?
        switch fields["refundPreference"] {
        case nil, .null?: break
        case .string(let text)? where refundPreferences.contains(text): preference = text
        default: return refusal(AppleErrorCode.invalidRefundPreference, "Invalid request. The refund preference field is invalid.")
        }
        var percentage: Double?
        switch fields["consumptionPercentage"] {
        case nil, .null?: break
        case .number(let value)? where value == value.rounded() && (0...100_000).contains(value): percentage = value
        default:
            return refusal(AppleErrorCode.consumptionPercentageOutOfRange, "ConsumptionPercentageOutOfRangeError: the consumption percentage is outside the valid range.")
        }
        if autoRenewable, percentage != nil {
            return refusal(
                AppleErrorCode.consumptionPercentageAutoRenewableSubscription,
                "ConsumptionPercentageAutoRenewableSubscriptionError: the consumption percentage field is unsupported for auto-renewable subscription transactions.")
        }
        // Apple's deliveryStatus page: "If the delivery status isn't DELIVERED, set the
        // consumptionPercentage to 0; otherwise, the request fails with an error" (not for an
        // auto-renewable subscription's transaction, which takes no percentage at all).
        if delivery != "DELIVERED", !autoRenewable, percentage != 0 {
            return refusal(
                AppleErrorCode.undeliveredConsumptionPercentageNonZero,
                "UndeliveredConsumptionPercentageNonZeroError: the consumption percentage must be zero for the provided delivery status.")
        }
        if preference == "GRANT_PRORATED", !autoRenewable, !(percentage.map { $0 > 0 && $0 < 100_000 } ?? false) {
            return refusal(
                AppleErrorCode.consumptionPercentageOutOfRange,
                "ConsumptionPercentageOutOfRangeError: GRANT_PRORATED needs a consumption percentage greater than 0 and less than 100000.")
        }
        return nil
    }

    /// Apple's refusal of a Get Notification History request, or nil when Apple takes it: dates
    /// as numbers, the start before the end and within the history the environment keeps, and a
    /// pagination token that has not expired (an unknown one is refused by the route). Each
    /// request checked is recorded.
    func refusal(ofNotificationHistory body: ByteBuffer, token: String?) async -> (Int, String)? {
        let fields = (try? JSONDecoder().decode([String: JSONField].self, from: body)) ?? [:]
        func date(_ name: String) -> Date? {
            guard case .number(let milliseconds)? = fields[name] else { return nil }
            return Date(timeIntervalSince1970: milliseconds / 1000)
        }
        let (start, end) = (date("startDate"), date("endDate"))
        await state.askedForNotifications(NotificationRequest(startDate: start, endDate: end, paginationToken: token))
        guard let start else { return Self.refusal(AppleErrorCode.invalidStartDate, "Invalid start date.") }
        guard let end else { return Self.refusal(AppleErrorCode.invalidEndDate, "Invalid end date.") }
        // StartDateAfterEndDateError: "the end date precedes the start date, or the two dates are equal".
        guard start < end else { return Self.refusal(AppleErrorCode.startDateAfterEndDate, "Invalid request. The start date is after the end date.") }
        guard start >= Date().addingTimeInterval(-Double(notificationHistoryDays) * 86_400) else {
            return Self.refusal(AppleErrorCode.startDateTooFarInPast, "Invalid request. The start date is too far in the past.")
        }
        if let token, await state.expiredNotificationTokens.contains(token) {
            return Self.refusal(AppleErrorCode.paginationTokenExpired, "Invalid request. The pagination token is expired.")
        }
        return nil
    }
}

/// A JSON value as the checks above see it: Apple's fields are typed, so `1` is no boolean.
enum JSONField: Decodable, Sendable {
    case bool(Bool)
    case number(Double)
    case string(String)
    case null
    case other

    init(from decoder: any Decoder) throws {
        let value = try decoder.singleValueContainer()
        if value.decodeNil() {
            self = .null
        } else if let bool = try? value.decode(Bool.self) {
            self = .bool(bool)
        } else if let number = try? value.decode(Double.self) {
            self = .number(number)
        } else if let text = try? value.decode(String.self) {
            self = .string(text)
        } else {
            self = .other
        }
    }
}
