import AppleReceipts
import AppStoreStandIn
import Foundation
import LedgerTestSupport
import Logging
import NIOCore
import Testing

/// Apple's answers as Apple means them: its retryable codes and 429s retried within the
/// client's tries (then "Apple away"), every other 4xx final with Apple's `errorCode`, each
/// endpoint paced to a budget of its own, Apple's current hosts.
@Suite("The App Store Server API client: retryable codes, 429 backoff, per-endpoint budgets")
struct AppStoreServerAPIRetryTests {
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)

    /// A client of the stand-in with tiny backoff waits (20 ms doubling to 80 ms), so that tests
    /// of many retries stay fast.
    func client(_ base: String, attempts: Int = 4, budgets: AppStoreServerAPI.RequestBudgets? = nil) async throws -> AppStoreServerAPI {
        try await AppStoreServerAPI(
            settings: standIn.settings(baseURL: base, budgets: budgets, attempts: attempts, backoff: .milliseconds(20), longestBackoff: .milliseconds(80)),
            logger: AppStoreServerAPITests.logger)
    }

    @Test("Apple's retryable codes, answered with Apple's status, are tried again: the call succeeds", arguments: [4_040_002, 4_040_004, 4_040_006, 5_000_001])
    func retryableThenSuccess(_ code: Int) async throws {
        await standIn.setHistory("retry-\(code)", [.init(revision: "r1", hasMore: false, signedTransactions: [])])
        await standIn.queue([.appleError(code)])
        try await standIn.run { base in
            let page = try await client(base).transactionHistory("retry-\(code)")
            #expect(page.revision == "r1")
            #expect(await standIn.requests == 2, "the retryable answer, then the page")
        }
    }

    @Test("a retryable code past the client's tries ends as Apple away, with Apple's errorCode")
    func retryableExhausted() async throws {
        await standIn.setHistory("retry-out", [.init(revision: "r1", hasMore: false, signedTransactions: [])])
        await standIn.queue(Array(repeating: .appleError(4_040_002), count: 4))
        try await standIn.run { base in
            do {
                _ = try await client(base).transactionHistory("retry-out")
                Issue.record("four retryable answers in a row answered")
            } catch {
                #expect(error.api?.code == "apple-api-not-found-retryable" && error.api?.status == 404 && error.api?.appleErrorCode == 4_040_002)
                #expect(error.api?.isAppleAway == true, "work that asks Apple tries it again later")
            }
            #expect(await standIn.requests == 4, "the settings' four tries, then the error")
        }
    }

    @Test("every other 4xx is final at once and names Apple's errorCode and message", arguments: [(400, 4_000_006), (404, 4_040_001), (403, 4_030_004)])
    func finalRefusals(_ status: Int, _ code: Int) async throws {
        await standIn.queue([.refused(status: status, errorCode: code)])
        try await standIn.run { base in
            do {
                _ = try await client(base).transactionHistory("anyone")
                Issue.record("a refusal answered")
            } catch {
                let api = try #require(error.api)
                #expect(api.code == (status == 404 ? "apple-api-not-found" : "apple-api-refused") && api.status == status && api.appleErrorCode == code)
                #expect(api.message.contains("Apple error \(code)") && api.message.contains("Refused."), "\(api.message)")
                #expect(!api.isAppleAway)
            }
            #expect(await standIn.requests == 1, "not tried again")
        }
    }

    @Test("a 429 without Retry-After is retried with growing waits to the cap, within the client's tries")
    func rateLimitedWithoutRetryAfter() async throws {
        await standIn.setHistory("limited", [.init(revision: "r1", hasMore: false, signedTransactions: [])])
        try await standIn.run { base in
            let api = try await client(base, attempts: 6)
            // Three 429s, then the page: waits of 20, 40 and 80 ms at the least.
            await standIn.queue(Array(repeating: .tooManyRequestsWithoutRetryAfter, count: 3))
            let started = ContinuousClock.now
            #expect(try await api.transactionHistory("limited").revision == "r1")
            #expect(ContinuousClock.now - started >= .milliseconds(140))
            #expect(await standIn.requests == 4)
            // More 429s than the client tries: it stops (Apple away, no Retry-After to wait for).
            await standIn.queue(Array(repeating: .tooManyRequestsWithoutRetryAfter, count: 6))
            do {
                _ = try await api.transactionHistory("limited")
                Issue.record("429s without end answered")
            } catch {
                #expect(error.api?.code == "apple-api-rate-limited" && error.api?.status == 429 && error.api?.retryAt == nil)
                #expect(error.api?.isAppleAway == true)
            }
            #expect(await standIn.requests == 4 + 6, "six tries, then the error")
        }
    }

    @Test("a Retry-After in seconds (a proxy's) is waited out; one already past is no answer: the backoff")
    func rateLimitedByAProxy() async throws {
        await standIn.setHistory("proxied", [.init(revision: "r1", hasMore: false, signedTransactions: [])])
        try await standIn.run { base in
            let api = try await client(base, attempts: 6)
            await standIn.queue([.tooManyRequestsRetryAfter("1")])
            let started = ContinuousClock.now
            #expect(try await api.transactionHistory("proxied").revision == "r1")
            #expect(ContinuousClock.now - started >= .seconds(1), "one second, not the Unix epoch's first millisecond")
            #expect(await standIn.requests == 2)
            // Apple's form, already past: retried after the client's own waits, within its tries.
            let past = String(Int64(Date(timeIntervalSinceNow: -60).timeIntervalSince1970 * 1000))
            await standIn.queue(Array(repeating: .tooManyRequestsRetryAfter(past), count: 6))
            do {
                _ = try await api.transactionHistory("proxied")
                Issue.record("429s without end answered")
            } catch {
                #expect(error.api?.code == "apple-api-rate-limited" && error.api?.retryAt == nil && error.api?.message.contains("1970") == false, "\(error)")
            }
            #expect(await standIn.requests == 2 + 6)
        }
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(AppStoreServerAPI.retryAt("1800000005000", now: now) == now.addingTimeInterval(5), "Apple's: Unix milliseconds")
        #expect(AppStoreServerAPI.retryAt(" 5 ", now: now) == now.addingTimeInterval(5), "HTTP's delay in seconds")
        #expect([nil, "", "soon", "-5", "0", "1799999999000", "Wed, 21 Oct 2015 07:28:00 GMT"].map { AppStoreServerAPI.retryAt($0, now: now) } == Array(repeating: nil, count: 7))
    }

    @Test("the backoff doubles from its first wait to its cap")
    func backoffSchedule() {
        let settings = standIn.settings(baseURL: "http://127.0.0.1:9", backoff: .milliseconds(20), longestBackoff: .milliseconds(80))
        #expect((1...6).map { AppStoreServerAPI.backoff(after: $0, settings) } == [20, 40, 80, 80, 80, 80].map { Duration.milliseconds($0) })
        let defaults = AppStoreServerAPI.Settings(keyID: "K", issuerID: "I", privateKeyPEM: "", bundleID: "b", baseURL: AppStoreServerAPI.productionURL)
        #expect((1...6).map { AppStoreServerAPI.backoff(after: $0, defaults) } == [500, 1000, 2000, 4000, 8000, 8000].map { Duration.milliseconds($0) })
    }

    @Test("Apple's classification: retryable codes whatever the status, 429, 5xx, 401, the rest final")
    func verdicts() {
        for code in [4_040_002, 4_040_004, 4_040_006] { #expect(AppStoreServerAPI.verdict(status: 404, appleErrorCode: code) == .retryable) }
        // A 404 naming no Apple error is no answer of Apple's (a proxy's, a mistyped base URL).
        #expect(AppStoreServerAPI.verdict(status: 404, appleErrorCode: nil) == .retryable)
        #expect(AppStoreServerAPI.verdict(status: 404, appleErrorCode: 4_040_010) == .final)
        #expect(AppStoreServerAPI.verdict(status: 500, appleErrorCode: 5_000_001) == .retryable)
        #expect(AppStoreServerAPI.verdict(status: 503, appleErrorCode: nil) == .retryable)
        #expect(AppStoreServerAPI.verdict(status: 429, appleErrorCode: 4_290_000) == .rateLimited)
        #expect(AppStoreServerAPI.verdict(status: 401, appleErrorCode: nil) == .unauthorized)
        for (status, code) in [(404, 4_040_001), (404, 4_040_005), (404, 4_040_010), (400, 4_000_012), (400, nil)] as [(Int, Int?)] {
            #expect(AppStoreServerAPI.verdict(status: status, appleErrorCode: code) == .final)
        }
    }

    @Test("Apple's current hosts; the sandbox's limits a tenth of production's; the environment from the host")
    func hostsAndBudgets() {
        #expect(AppStoreServerAPI.productionURL == "https://api.storekit.apple.com")
        #expect(AppStoreServerAPI.sandboxURL == "https://api.storekit-sandbox.apple.com")
        let production = AppStoreServerAPI.RequestBudgets.apple(.production)
        #expect(production.rate(.transactionHistory) == 50 && production.rate(.consumption) == 50 && production.rate(.notificationHistory) == 50)
        #expect(production.rate(.finishTransaction) == 50 && production.rate(.setAppAccountToken) == 20)
        #expect(production.rate(.lookUpOrder) == 10 && production.rate(.refundHistory) == 10)
        let sandbox = AppStoreServerAPI.RequestBudgets.apple(.sandbox)
        for endpoint in AppStoreServerAPI.Endpoint.allCases {
            #expect(abs(sandbox.rate(endpoint) - production.rate(endpoint) / 10) < 1e-9, "\(endpoint)")
        }
        #expect(AppStoreServerAPI.RequestBudgets.apple(.production, atMost: 10).rate(.transactionHistory) == 10)
        func settings(_ url: String) -> AppStoreServerAPI.Settings {
            .init(keyID: "K", issuerID: "I", privateKeyPEM: "", bundleID: "b", baseURL: url)
        }
        #expect(settings(AppStoreServerAPI.sandboxURL).rateLimitEnvironment == .sandbox)
        #expect(settings(AppStoreServerAPI.sandboxURL + "/").effectiveBudgets == .apple(.sandbox, atMost: 10))
        #expect(settings(AppStoreServerAPI.productionURL).rateLimitEnvironment == .production)
        var explicit = settings("http://127.0.0.1:9")
        explicit.environment = .sandbox
        #expect(explicit.effectiveBudgets == .apple(.sandbox, atMost: 10))
        #expect(AppStoreServerAPI.Endpoint(path: "/inApps/v2/refund/lookup/1") == .refundHistory)
        #expect(AppStoreServerAPI.Endpoint(path: "/inApps/v1/transactions/1/appAccountToken") == .setAppAccountToken)
        #expect(AppStoreServerAPI.Endpoint(path: "/inApps/v1/transactions/1/finish") == .finishTransaction)
        #expect(AppStoreServerAPI.Endpoint(path: "/inApps/v2/transactions/consumption/1") == .consumption)
    }

    @Test("one endpoint's spent budget leaves another's untouched")
    func budgetsApart() async {
        // One request per 1,000 s: however slow the machine, the next slot is far off.
        let pace = RequestPace(.init(perSecond: [.refundHistory: 0.001, .transactionHistory: 0.001]))
        let refunds = [await pace.reserve(.refundHistory), await pace.reserve(.refundHistory), await pace.reserve(.refundHistory)]
        #expect(refunds[0] == .zero && refunds[1] > .seconds(500) && refunds[2] > .seconds(1500), "\(refunds)")
        #expect(await pace.reserve(.transactionHistory) == .zero, "history does not queue behind refunds")
    }

    @Test("a call to one endpoint goes ahead while another endpoint's call waits for its budget", .timeLimit(.minutes(1)))
    func endpointsPacedApart() async throws {
        await standIn.setHistory("apart", [.init(revision: "r1", hasMore: false, signedTransactions: [])])
        await standIn.setRefunds("apart", [.init(revision: "f1", hasMore: false, signedTransactions: [])])
        var spent = AppStoreServerAPI.RequestBudgets.uniform(100)
        spent.perSecond[.refundHistory] = 0.001  // one refund history request per 1000 s
        let budgets = spent
        try await standIn.run { base in
            let api = try await client(base, budgets: budgets)
            #expect(try await api.refundHistory("apart").revision == "f1")
            let waiting = Task { try await api.refundHistory("apart") }
            // One refund history request's budget is spent for 1000 s; history is not behind it.
            #expect(try await api.transactionHistory("apart").revision == "r1")
            #expect(await standIn.requests == 2, "the waiting refund request has not gone out")
            waiting.cancel()
            _ = await waiting.result
        }
    }
}
