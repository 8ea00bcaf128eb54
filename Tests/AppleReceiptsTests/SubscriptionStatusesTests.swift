import AppStoreStandIn
import AppleReceipts
import Foundation
import LedgerCore
import LedgerTestSupport
import Logging
import Testing

/// Get All Subscription Statuses: the call, Apple's models, the stand-in's refusals, and the
/// verification of the signed transactions and renewal info in its answer.
@Suite("Get All Subscription Statuses: the call, the stand-in as Apple, the answer verified")
struct SubscriptionStatusesTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    static let start = Date(timeIntervalSince1970: 1_790_000_000)
    static let month: TimeInterval = 30 * 86_400

    func client(_ base: String) async throws -> AppStoreServerAPI {
        try await AppStoreServerAPI(
            settings: standIn.settings(baseURL: base, backoff: .milliseconds(20), longestBackoff: .milliseconds(80)),
            logger: AppStoreServerAPITests.logger)
    }

    /// An entry of the answer for subscription `original`, its latest period `id`, signed by `signer`.
    func item(
        _ original: String, latest id: String, status: Int, signer: TestApple? = nil, renewal: SignedRenewalInfoPayload? = nil,
        transaction: SignedTransactionPayload? = nil
    ) async throws -> AppStoreServerAPI.LastTransactionsItem {
        let signer = signer ?? apple
        let period = transaction ?? TestApple.subscriptionPeriod(
            id, of: original, purchaseDate: Self.start, expires: Self.start.addingTimeInterval(Self.month))
        return AppStoreServerAPI.LastTransactionsItem(
            status: status, originalTransactionId: original, signedTransactionInfo: try await signer.sign(period),
            signedRenewalInfo: try await signer.sign(renewal ?? TestApple.renewalInfo(original)))
    }

    func group(_ items: [AppStoreServerAPI.LastTransactionsItem]) -> AppStoreServerAPI.SubscriptionGroupIdentifierItem {
        .init(subscriptionGroupIdentifier: TestApple.subscriptionGroup, lastTransactions: items)
    }

    @Test("the answer decodes as Apple's library models it (getAllSubscriptionStatusesResponse.json)")
    func applesJSON() throws {
        let json = #"""
        {"environment": "LocalTesting", "bundleId": "com.example", "appAppleId": 5454545,
         "data": [{"subscriptionGroupIdentifier": "sub_group_one", "lastTransactions": [
                    {"status": 1, "originalTransactionId": "3749183", "signedTransactionInfo": "signed_transaction_one", "signedRenewalInfo": "signed_renewal_one"},
                    {"status": 5, "originalTransactionId": "5314314134", "signedTransactionInfo": "signed_transaction_two", "signedRenewalInfo": "signed_renewal_two"}]},
                  {"subscriptionGroupIdentifier": "sub_group_two", "lastTransactions": [
                    {"status": 2, "originalTransactionId": "3413453", "signedTransactionInfo": "signed_transaction_three", "signedRenewalInfo": "signed_renewal_three"}]}]}
        """#
        let answer = try JSONDecoder().decode(AppStoreServerAPI.StatusResponse.self, from: Data(json.utf8))
        #expect(answer.environment == "LocalTesting" && answer.bundleId == "com.example" && answer.appAppleId == 5_454_545)
        #expect(answer.data?.map(\.subscriptionGroupIdentifier) == ["sub_group_one", "sub_group_two"])
        #expect(answer.data?[0].lastTransactions?.map(\.status) == [1, 5])
        #expect(answer.data?[1].lastTransactions?[0].signedRenewalInfo == "signed_renewal_three")
    }

    @Test("any of the customer's transaction ids answers their subscriptions; status query items filter them")
    func call() async throws {
        let active = try await item("7100001", latest: "7100002", status: 1)
        let expired = try await item("7100010", latest: "7100010", status: 2)
        await standIn.setSubscriptionStatuses(for: ["7100001", "7100002", "7100010"], [group([active, expired])])
        try await standIn.run { base in
            let api = try await client(base)
            let all = try await api.subscriptionStatuses("7100002")
            #expect(all.bundleId == TestApple.bundleId && all.environment == "Sandbox")
            #expect(all.data == [group([active, expired])])
            let onlyExpired = try await api.subscriptionStatuses("7100001", statuses: [2, 5])
            #expect(onlyExpired.data?.flatMap { $0.lastTransactions ?? [] }.map(\.originalTransactionId) == ["7100010"])
            #expect(try await api.subscriptionStatuses("7100001", statuses: [3]).data == [], "a group with none left is left out")
            let requests = await standIn.subscriptionStatusRequests
            #expect(requests.map(\.transactionID) == ["7100002", "7100001", "7100001"])
            #expect(requests[1].statuses == ["2", "5"])
        }
    }

    @Test("the stand-in refuses as Apple does: an unknown id 404 4040010, an id that is no number 400 4000006, a bad status 400 4000031; none retried")
    func refusals() async throws {
        await standIn.setSubscriptionStatuses(for: ["7100020"], [])
        try await standIn.run { base in
            let api = try await client(base)
            for (id, statuses, status, code) in [
                ("7100099", [Int](), 404, 4_040_010), ("not-a-number", [], 400, 4_000_006), ("7100020", [9], 400, 4_000_031),
                ("7100020", [0], 400, 4_000_031),
            ] as [(String, [Int], Int, Int)] {
                do {
                    _ = try await api.subscriptionStatuses(id, statuses: statuses)
                    Issue.record("\(id) \(statuses) answered")
                } catch let error as AppStoreServerAPIError {
                    #expect(error.status == status && error.appleErrorCode == code, "\(error)")
                    #expect(error.code == (status == 404 ? "apple-api-not-found" : "apple-api-refused") && !error.isAppleAway)
                }
            }
            #expect(await standIn.requests == 4, "each refusal is final")
            #expect(try await api.subscriptionStatuses("7100020").data == [])
        }
    }

    @Test("its own budget (Apple's 50 per second, a tenth in the sandbox), and Apple's retries: a 429 and a 500 waited out")
    func budgetAndRetries() async throws {
        #expect(AppStoreServerAPI.Endpoint(path: "/inApps/v1/subscriptions/7100001") == .subscriptionStatuses)
        #expect(AppStoreServerAPI.Endpoint(path: "/inApps/v1/subscriptions/extend/7100001") != .subscriptionStatuses)
        #expect(AppStoreServerAPI.RequestBudgets.apple(.production).rate(.subscriptionStatuses) == 50)
        #expect(abs(AppStoreServerAPI.RequestBudgets.apple(.sandbox).rate(.subscriptionStatuses) - 5) < 1e-9)
        await standIn.setSubscriptionStatuses(for: ["7100030"], [])
        await standIn.queue([.tooManyRequests(after: .milliseconds(50)), .serverError, .appleError(4_040_006)])
        try await standIn.run { base in
            let answer = try await client(base).subscriptionStatuses("7100030")
            #expect(answer.data == [])
            #expect(await standIn.requests == 4)
        }
    }

    @Test("a verified answer: each subscription's status, transaction and renewal info")
    func verified() async throws {
        var renewal = TestApple.renewalInfo("7100001", autoRenew: false)
        renewal.expirationIntent = 1
        let answer = AppStoreServerAPI.StatusResponse(
            environment: "Sandbox", bundleId: TestApple.bundleId, appAppleId: TestApple.appAppleId,
            data: [group([try await item("7100001", latest: "7100002", status: 4, renewal: renewal)])])
        let statuses = try await verifier(trusting: apple).subscriptionStatuses(answer)
        let status = try #require(statuses.first)
        #expect(statuses.count == 1)
        #expect(status.status == 4 && status.originalTransactionId == "7100001" && status.subscriptionGroupIdentifier == TestApple.subscriptionGroup)
        #expect(status.transaction?.transactionId.rawValue == "7100002")
        #expect(status.transaction?.expiresDate == Self.start.addingTimeInterval(Self.month))
        #expect(status.renewalInfo?.info.autoRenew == false && status.renewalInfo?.info.expirationIntent == 1)
    }

    @Test("an answer for another bundle, environment or app id is refused", arguments: [
        ("com.example.other", "Sandbox", TestApple.appAppleId, "wrong-bundle-id"),
        (TestApple.bundleId, "Production", TestApple.appAppleId, "wrong-environment"),
    ] as [(String, String, Int64, String)])
    func wrongApp(_ bundleId: String, _ environment: String, _ appAppleId: Int64, _ code: String) async throws {
        let answer = AppStoreServerAPI.StatusResponse(
            environment: environment, bundleId: bundleId, appAppleId: appAppleId,
            data: [group([try await item("7100001", latest: "7100001", status: 1)])])
        #expect(await refusal(answer) == code)
        // In production, also the app's Apple id.
        let production = AppleProofVerifier(
            app: .init(bundleId: TestApple.bundleId, appAppleId: TestApple.appAppleId, environments: [.production, .sandbox]),
            signedData: try verifier(trusting: apple).signedData, verifyReceipt: nil)
        let otherApp = AppStoreServerAPI.StatusResponse(environment: "Production", bundleId: TestApple.bundleId, appAppleId: 42, data: [])
        #expect(await refusal(otherApp, production) == "wrong-app-id")
    }

    @Test("a forged or mismatched signed part refuses the whole answer")
    func badParts() async throws {
        let stranger = try TestApple()
        func answer(_ item: AppStoreServerAPI.LastTransactionsItem) -> AppStoreServerAPI.StatusResponse {
            .init(environment: "Sandbox", bundleId: TestApple.bundleId, data: [group([item])])
        }
        // Renewal info signed by a chain to another root; a transaction signed so.
        var forgedRenewal = try await item("7100001", latest: "7100001", status: 1)
        forgedRenewal.signedRenewalInfo = try await stranger.sign(TestApple.renewalInfo("7100001"))
        #expect(await refusal(answer(forgedRenewal)) == "invalid-certificate-chain")
        #expect(await refusal(answer(try await item("7100001", latest: "7100001", status: 1, signer: stranger))) == "invalid-certificate-chain")
        // Renewal info or a transaction of another subscription than the entry names.
        let otherRenewal = try await item("7100001", latest: "7100001", status: 1, renewal: TestApple.renewalInfo("7100050"))
        #expect(await refusal(answer(otherRenewal)) == "renewal-info-mismatch")
        let otherTransaction = try await item(
            "7100001", latest: "7100051", status: 1,
            transaction: TestApple.subscriptionPeriod("7100051", of: "7100050", purchaseDate: Self.start, expires: Self.start.addingTimeInterval(Self.month)))
        #expect(await refusal(answer(otherTransaction)) == "subscription-status-mismatch")
        // A transaction of another bundle.
        var otherBundle = TestApple.subscriptionPeriod("7100001", of: "7100001", purchaseDate: Self.start, expires: Self.start.addingTimeInterval(Self.month))
        otherBundle.bundleId = "com.example.other"
        #expect(await refusal(answer(try await item("7100001", latest: "7100001", status: 1, transaction: otherBundle))) == "wrong-bundle-id")
        // An entry naming no subscription.
        var unnamed = try await item("7100001", latest: "7100001", status: 1)
        unnamed.originalTransactionId = nil
        #expect(await refusal(answer(unnamed)) == "malformed-token")
    }

    /// The refusal code of verifying `answer` (with `checker`, else a verifier of the test app in
    /// the sandbox), or nil.
    func refusal(_ answer: AppStoreServerAPI.StatusResponse, _ checker: AppleProofVerifier? = nil) async -> String? {
        do {
            let checker = try checker ?? verifier(trusting: apple)
            _ = try await checker.subscriptionStatuses(answer)
            return nil
        } catch let error as AppleVerificationError {
            return error.code
        } catch {
            return "\(error)"
        }
    }
}
