import AppleReceipts
import Foundation
import Hummingbird

/// Get All Subscription Statuses as Apple answers it: the statuses a test scripted for any of the
/// customer's transaction ids, filtered by the `status` query items; Apple's refusals of a
/// transaction id that is no number (400 `4000006`), of a status outside 1...5 (400 `4000031`)
/// and of an id it does not know (404 `4040010`).
extension AppStoreServerStandIn {
    /// Apple's error codes of Get All Subscription Statuses, as Apple's libraries name them.
    public enum SubscriptionErrorCode {
        /// InvalidTransactionIdError.
        public static let invalidTransactionId = 4000006
        /// InvalidStatusError.
        public static let invalidStatus = 4000031
        /// TransactionIdNotFoundError.
        public static let transactionIdNotFound = 4040010
    }

    /// What Get All Subscription Statuses answers for each of `transactionIDs` (the customer's
    /// transaction ids, original or not): `groups`, which hold signed parts the test made. The
    /// answer names this stand-in's bundle id and environment, and `appAppleId`.
    public func setSubscriptionStatuses(
        for transactionIDs: [String], _ groups: [AppStoreServerAPI.SubscriptionGroupIdentifierItem], appAppleId: Int64? = nil
    ) async {
        await subscriptionBook.set(transactionIDs, groups, appAppleId: appAppleId)
    }

    /// Each Get All Subscription Statuses request that passed the token check: the id, and the
    /// `status` query items as sent.
    public var subscriptionStatusRequests: [(transactionID: String, statuses: [String])] {
        get async { await subscriptionBook.requests }
    }

    static func addSubscriptionRoutes(to router: Router<BasicRequestContext>, serving: @escaping @Sendable (Request) -> AppStoreServerStandIn) {
        router.get("/inApps/v1/subscriptions/:id") { request, context -> Response in
            let standIn = serving(request)
            return try await standIn.answer(request) {
                let id = context.parameters.get("id") ?? ""
                let statuses = request.uri.queryParameters.getAll("status")
                await standIn.subscriptionBook.asked(id, statuses)
                guard !id.isEmpty, id.allSatisfy(\.isASCII), id.allSatisfy(\.isNumber) else {
                    return Self.refusal(SubscriptionErrorCode.invalidTransactionId, "Invalid transaction id.")
                }
                let wanted = statuses.compactMap(Int.init)
                guard wanted.count == statuses.count, wanted.allSatisfy({ (1...5).contains($0) }) else {
                    return Self.refusal(SubscriptionErrorCode.invalidStatus, "Invalid request. The status parameter is invalid.")
                }
                guard let scripted = await standIn.subscriptionBook.statuses(of: id) else {
                    return (404, #"{"errorCode": 4040010, "errorMessage": "Transaction id not found."}"#)
                }
                let filtered = scripted.groups.compactMap { group -> AppStoreServerAPI.SubscriptionGroupIdentifierItem? in
                    guard !wanted.isEmpty else { return group }
                    var group = group
                    group.lastTransactions = group.lastTransactions?.filter { item in item.status.map { wanted.contains($0) } ?? false }
                    return group.lastTransactions?.isEmpty ?? true ? nil : group
                }
                let answer = AppStoreServerAPI.StatusResponse(
                    environment: standIn.environment, bundleId: standIn.bundleID, appAppleId: scripted.appAppleId, data: filtered)
                return (200, String(decoding: try JSONEncoder().encode(answer), as: UTF8.self))
            }
        }
    }
}

/// The subscription statuses a test scripted, by transaction id, and the requests for them.
actor SubscriptionStatusBook {
    var scripted: [String: (groups: [AppStoreServerAPI.SubscriptionGroupIdentifierItem], appAppleId: Int64?)] = [:]
    var requests: [(transactionID: String, statuses: [String])] = []

    func set(_ ids: [String], _ groups: [AppStoreServerAPI.SubscriptionGroupIdentifierItem], appAppleId: Int64?) {
        for id in ids { scripted[id] = (groups, appAppleId) }
    }

    func asked(_ id: String, _ wanted: [String]) { requests.append((id, wanted)) }

    func statuses(of id: String) -> (groups: [AppStoreServerAPI.SubscriptionGroupIdentifierItem], appAppleId: Int64?)? {
        scripted[id]
    }
}
