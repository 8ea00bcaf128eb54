import AppleReceipts
import AppStoreStandIn
import Foundation
import LedgerTestSupport
import Logging
import NIOCore
import Testing

@Suite("The App Store Server API client against a stand-in")
struct AppStoreServerAPITests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    static let logger: Logger = {
        var logger = Logger(label: "app-store-server-api-tests")
        logger.logLevel = .critical
        return logger
    }()

    func client(_ baseURL: String, timeout: TimeAmount = .seconds(30), requestsPerSecond: Double = 100) async throws -> AppStoreServerAPI {
        try await AppStoreServerAPI(settings: standIn.settings(baseURL: baseURL, requestsPerSecond: requestsPerSecond, timeout: timeout), logger: Self.logger)
    }

    func signed(_ id: String) async throws -> String { try await apple.sign(TestApple.transaction(id)) }

    @Test("a host refusing connections fails each try at once, not after the request's time-out: the client's tries and back-off decide")
    func refusedConnectionsFailFast() async throws {
        try await withRefusingPort { port in
            // The request's time-out at ten minutes: a pool that kept trying to connect until it
            // would hold this call for forty (four tries); it ends within the tries' back-off.
            let settings = standIn.settings(baseURL: "http://127.0.0.1:\(port)", timeout: .seconds(600), backoff: .milliseconds(10), longestBackoff: .milliseconds(40))
            let api = try await AppStoreServerAPI(settings: settings, logger: Self.logger)
            let outcome = try await withThrowingTaskGroup(of: String.self) { group in
                group.addTask {
                    do {
                        _ = try await api.transactionHistory("8000001", startDate: Date())
                        return "answered"
                    } catch let error as AppStoreServerAPIError {
                        return error.code
                    } catch {
                        return "\(error)"
                    }
                }
                group.addTask {
                    try await Task.sleep(for: .seconds(300))
                    return "still trying after 300 s"
                }
                defer { group.cancelAll() }
                return try await group.next() ?? "-"
            }
            #expect(outcome == "apple-api-unreachable", "\(outcome)")
        }
    }

    @Test("pages of history with Apple's JWT, one token reused, the query as sent")
    func historyPages() async throws {
        await standIn.setHistory("app-1", [
            .init(revision: "r1", hasMore: true, signedTransactions: [try await signed("8000001"), try await signed("8000002")]),
            .init(revision: "r2", hasMore: false, signedTransactions: [try await signed("8000003")]),
        ])
        try await standIn.run { base in
            let api = try await client(base)
            let start = Date(timeIntervalSince1970: 1_800_000_000.5)
            let first = try await api.transactionHistory("app-1", startDate: start, productIDs: ["gems.100"])
            #expect(first.revision == "r1" && first.hasMore && first.signedTransactions.count == 2)
            let second = try await api.transactionHistory("app-1", revision: first.revision, startDate: start)
            #expect(second.revision == "r2" && !second.hasMore && second.signedTransactions.count == 1)
            #expect(await standIn.tokens.count == 1, "the token is reused")
            #expect(await standIn.refusedTokens == 0)
            let queries = await standIn.historyQueries
            #expect(queries.count == 2)
            #expect(queries.first?["startDate"] == "1800000000500" && queries.first?["productId"] == "gems.100" && queries.first?["sort"] == "ASCENDING")
            #expect(queries.last?["revision"] == "r1")
        }
    }

    @Test("every signed transaction of a page goes through the proof verifier: a bad signature is refused, the rest pass")
    func verifiedLikeProofs() async throws {
        let forged = try ThrowawaySigningChain(name: "Not Apple")
        await standIn.setHistory("app-2", [.init(revision: "r1", hasMore: false, signedTransactions: [
            try await signed("8000011"), try forged.sign(TestApple.transaction("8000012")), try await signed("8000013"),
        ])])
        let verifier = AppleProofVerifier(
            app: .init(bundleId: TestApple.bundleId, appAppleId: nil, environment: .sandbox),
            signedData: SignedDataVerifier(rootCertificates: [apple.chain.root]), verifyReceipt: nil)
        try await standIn.run { base in
            let page = try await client(base).transactionHistory("app-2")
            var verified: [String] = []
            var refused: [String] = []
            for jws in page.signedTransactions {
                do {
                    verified.append(try await verifier.transaction(signed: jws).transactionId.rawValue)
                } catch {
                    refused.append((error as? AppleVerificationError)?.code ?? "\(error)")
                }
            }
            #expect(verified == ["8000011", "8000013"])
            #expect(refused.count == 1)
        }
    }

    @Test("429 is waited out until its Retry-After; nothing is lost")
    func rateLimited() async throws {
        await standIn.setHistory("app-3", [.init(revision: "r1", hasMore: false, signedTransactions: [try await signed("8000021")])])
        await standIn.queue([.tooManyRequests(after: .milliseconds(400)), .tooManyRequests(after: .milliseconds(300))])
        try await standIn.run { base in
            let started = ContinuousClock.now
            let page = try await client(base).transactionHistory("app-3")
            #expect(page.signedTransactions.count == 1)
            #expect(ContinuousClock.now - started >= .milliseconds(600))
            #expect(await standIn.requests == 3)
        }
    }

    @Test("5xx and slow answers are retried with backoff, a bounded number of times")
    func serverFaults() async throws {
        await standIn.setHistory("app-4", [.init(revision: "r1", hasMore: false, signedTransactions: [])])
        // The second try is held past the client's time-out (and let go when the stand-in stops).
        await standIn.queue([.serverError, .held, .serverError])
        try await standIn.run { base in
            // 10 s: long enough for the retries' answers on a loaded machine.
            let api = try await client(base, timeout: .seconds(10))
            let page = try await api.transactionHistory("app-4")
            #expect(page.revision == "r1")
            #expect(await standIn.requests == 4)
            // Nothing is held from here on: a client that waits as long as the machine needs, so
            // that each 500 is seen as one however slow the stand-in's answer.
            let patient = try await client(base, timeout: .seconds(300))
            await standIn.queue([.serverError, .serverError, .serverError, .serverError, .serverError])
            do {
                _ = try await patient.transactionHistory("app-4")
                Issue.record("four 500s in a row answered")
            } catch {
                #expect((error as? AppStoreServerAPIError)?.code == "apple-api-unavailable")
                #expect((error as? AppStoreServerAPIError)?.status == 500)
            }
            #expect(await standIn.requests == 4 + 4, "4 tries, then the error")
            // The fifth 500 goes to the next call, which then succeeds.
            #expect(try await patient.transactionHistory("app-4").revision == "r1")
            #expect(await standIn.requests == 4 + 4 + 2)
        }
    }

    @Test("Apple's refusals are errors with its errorCode; a malformed page and an unknown order say so")
    func refusals() async throws {
        await standIn.setOrder("MQ1234", [try await signed("8000031")])
        try await standIn.run { base in
            let api = try await client(base)
            do {
                _ = try await api.transactionHistory("nobody")
                Issue.record("an unknown account answered")
            } catch {
                #expect(error.api?.code == "apple-api-not-found" && error.api?.status == 404 && error.api?.appleErrorCode == 4040010)
            }
            await standIn.queue([.malformed])
            do {
                _ = try await api.transactionHistory("nobody")
                Issue.record("a malformed page answered")
            } catch {
                #expect(error.api?.code == "apple-api-answer-malformed")
            }
            // Read as Apple's own models read it, where every field is optional: no list is an
            // empty one, no hasMore is the last page; but a page without its revision cannot be
            // followed.
            await standIn.queue([.answer(#"{"revision": "r9"}"#), .answer(#"{"hasMore": false, "signedTransactions": []}"#)])
            let sparse = try await api.transactionHistory("nobody")
            #expect(sparse.revision == "r9" && !sparse.hasMore && sparse.signedTransactions.isEmpty)
            do {
                _ = try await api.transactionHistory("nobody")
                Issue.record("a page without its revision was read")
            } catch {
                #expect(error.api?.code == "apple-api-answer-malformed")
            }
            #expect(try await api.lookUpOrder("MQ1234").count == 1)
            do {
                _ = try await api.lookUpOrder("MQ0000")
                Issue.record("an unknown order answered")
            } catch {
                #expect(error.api?.code == "apple-order-not-found" && error.api?.status == 404)
            }
        }
    }

    @Test("a token the stand-in cannot verify is a 401, named as such; a key that is no key is refused at once")
    func badKeys() async throws {
        try await standIn.run { base in
            var settings = standIn.settings(baseURL: base)
            settings.privateKeyPEM = AppStoreServerStandIn(bundleID: TestApple.bundleId).privateKeyPEM  // another key than the one Apple holds
            let api = try await AppStoreServerAPI(settings: settings, logger: Self.logger)
            do {
                _ = try await api.transactionHistory("app-5")
                Issue.record("a token signed with another key was taken")
            } catch {
                #expect(error.api?.code == "apple-api-unauthorized" && error.api?.status == 401)
            }
            #expect(await standIn.refusedTokens == 1)
            settings.privateKeyPEM = "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n"
            do {
                _ = try await AppStoreServerAPI(settings: settings, logger: Self.logger)
                Issue.record("a key that is no key was taken")
            } catch {
                #expect(error.api?.code == "apple-api-key-invalid")
            }
        }
    }

    @Test("requests are paced to the rate, across callers")
    func paced() async throws {
        await standIn.setHistory("app-6", [.init(revision: "r1", hasMore: false, signedTransactions: [])])
        try await standIn.run { base in
            let api = try await client(base, requestsPerSecond: 10)
            let started = ContinuousClock.now
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<6 { group.addTask { _ = try await api.transactionHistory("app-6") } }
                try await group.waitForAll()
            }
            // Six starts 100 ms apart: the last at 500 ms at the earliest.
            #expect(ContinuousClock.now - started >= .milliseconds(500))
            #expect(await standIn.requests == 6)
        }
    }
}

extension Error {
    /// This error as the client's.
    var api: AppStoreServerAPIError? { self as? AppStoreServerAPIError }
}
