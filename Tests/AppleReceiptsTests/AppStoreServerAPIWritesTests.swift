import AppleReceipts
import AppStoreStandIn
import Foundation
import LedgerTestSupport
import Logging
import NIOCore
import Testing

/// The calls refund defence and catch-up make (Send Consumption Information v2, Get Notification
/// History, Get Refund History v2, Finish Transaction, Set App Account Token), each with the
/// faults Apple's servers have, against the stand-in.
@Suite("The App Store Server API's writes and backfill reads against a stand-in")
struct AppStoreServerAPIWritesTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    func client(_ baseURL: String, timeout: TimeAmount = .seconds(30)) async throws -> AppStoreServerAPI {
        try await AppStoreServerAPI(settings: standIn.settings(baseURL: baseURL, timeout: timeout), logger: AppStoreServerAPITests.logger)
    }

    @Test("consumption information: through a 429 and a 500, sent once Apple takes it, every field as Apple names it")
    func consumption() async throws {
        try await standIn.run { base in
            let api = try await client(base)
            await standIn.queue([.tooManyRequests(after: .milliseconds(300)), .serverError])
            let started = ContinuousClock.now
            try await api.sendConsumptionInformation("8100001", .init(
                customerConsented: true, deliveryStatus: "DELIVERED", sampleContentProvided: false, refundPreference: "DECLINE", consumptionPercentage: 25_000))
            #expect(ContinuousClock.now - started >= .milliseconds(300), "Retry-After honoured")
            let writes = await standIn.writes
            #expect(writes.count == 1)
            #expect(writes.first?.method == "PUT" && writes.first?.path == "/inApps/v2/transactions/consumption/8100001")
            let body = try #require(try JSONSerialization.jsonObject(with: Data((writes.first?.body ?? "").utf8)) as? [String: Any])
            #expect(body["customerConsented"] as? Bool == true)
            #expect(body["deliveryStatus"] as? String == "DELIVERED")
            #expect(body["sampleContentProvided"] as? Bool == false)
            #expect(body["refundPreference"] as? String == "DECLINE")
            #expect(body["consumptionPercentage"] as? Int == 25_000)
            #expect(body.count == 5)
            // Without a preference or a percentage, neither is sent.
            try await api.sendConsumptionInformation("8100002", .init(customerConsented: true, deliveryStatus: "DELIVERED", sampleContentProvided: false))
            let second = try #require(try JSONSerialization.jsonObject(with: Data((await standIn.writes.last?.body ?? "").utf8)) as? [String: Any])
            #expect(Set(second.keys) == ["customerConsented", "deliveryStatus", "sampleContentProvided"])
        }
    }

    @Test("consumption information: the stand-in refuses what Apple refuses, with Apple's errorCode, and takes what Apple takes")
    func consumptionRefusals() async throws {
        try await standIn.run { base in
            let api = try await client(base)
            typealias Body = AppStoreServerAPI.ConsumptionInformation
            let refused: [(Body, Int)] = [
                (.init(customerConsented: false, deliveryStatus: "DELIVERED", sampleContentProvided: true), 4000035),
                (.init(customerConsented: true, deliveryStatus: "SHIPPED", sampleContentProvided: true), 4000036),
                (.init(customerConsented: true, deliveryStatus: "DELIVERED", sampleContentProvided: true, refundPreference: "MAYBE"), 4000044),
                (.init(customerConsented: true, deliveryStatus: "DELIVERED", sampleContentProvided: true, consumptionPercentage: 100_001), 4000000),
                (.init(customerConsented: true, deliveryStatus: "DELIVERED", sampleContentProvided: true, consumptionPercentage: -1), 4000000),
                // A percentage other than 0 when not delivered.
                (.init(customerConsented: true, deliveryStatus: "UNDELIVERED_OTHER", sampleContentProvided: true, consumptionPercentage: 5_000), 4000000),
                // None when not delivered: Apple asks for 0 ("otherwise, the request fails").
                (.init(customerConsented: true, deliveryStatus: "UNDELIVERED_OTHER", sampleContentProvided: true), 4000000),
                // GRANT_PRORATED without a share above 0 and below 100%.
                (.init(customerConsented: true, deliveryStatus: "DELIVERED", sampleContentProvided: true, refundPreference: "GRANT_PRORATED"), 4000000),
                (.init(customerConsented: true, deliveryStatus: "DELIVERED", sampleContentProvided: true, refundPreference: "GRANT_PRORATED", consumptionPercentage: 0), 4000000),
                (.init(customerConsented: true, deliveryStatus: "UNDELIVERED_OTHER", sampleContentProvided: true, refundPreference: "GRANT_PRORATED", consumptionPercentage: 0), 4000000),
            ]
            for (body, code) in refused {
                do {
                    try await api.sendConsumptionInformation("8100010", body)
                    Issue.record("taken: \(body)")
                } catch let error as AppStoreServerAPIError {
                    #expect(error.status == 400 && error.appleErrorCode == code && error.code == "apple-api-refused", "\(body): \(error)")
                }
            }
            #expect(await standIn.writes.isEmpty, "a refused answer is not taken")
            let taken: [Body] = [
                .init(customerConsented: true, deliveryStatus: "UNDELIVERED_SERVER_OUTAGE", sampleContentProvided: false, refundPreference: "GRANT_FULL", consumptionPercentage: 0),
                .init(customerConsented: true, deliveryStatus: "DELIVERED", sampleContentProvided: true, refundPreference: "GRANT_PRORATED", consumptionPercentage: 99_999),
                .init(customerConsented: true, deliveryStatus: "DELIVERED", sampleContentProvided: false, refundPreference: "DECLINE", consumptionPercentage: 100_000),
            ]
            for body in taken { try await api.sendConsumptionInformation("8100011", body) }
            #expect(await standIn.writes.count == taken.count)
        }
    }

    @Test("notification history: the stand-in refuses a start too far back for its environment, after the end, and an expired token, with Apple's errorCode")
    func notificationHistoryRefusals() async throws {
        await standIn.setNotifications([
            .init(revision: "h1", hasMore: true, signedTransactions: []),
            .init(revision: "h2", hasMore: false, signedTransactions: []),
        ])
        let production = AppStoreServerStandIn(bundleID: TestApple.bundleId, environment: "Production")
        try await standIn.run { base in
            let api = try await client(base)
            let now = Date()
            func refusal(_ start: Date, _ end: Date, _ token: String? = nil) async -> Int? {
                do {
                    _ = try await api.notificationHistory(startDate: start, endDate: end, paginationToken: token)
                    return nil
                } catch let error as AppStoreServerAPIError {
                    return error.status == 400 ? error.appleErrorCode : -1
                } catch {
                    return -2
                }
            }
            #expect(await refusal(now.addingTimeInterval(-31 * 86_400), now) == 4000012, "the sandbox keeps 30 days")
            #expect(await refusal(now.addingTimeInterval(-29 * 86_400), now) == nil)
            #expect(await refusal(now, now.addingTimeInterval(-60)) == 4000013)
            #expect(await refusal(now, now) == 4000013, "Apple refuses equal dates too")
            #expect(await refusal(now.addingTimeInterval(-60), now, "unknown") == 4000014)
            let first = try await api.notificationHistory(startDate: now.addingTimeInterval(-60), endDate: now)
            await standIn.expireNotificationTokens()
            #expect(await refusal(now.addingTimeInterval(-60), now, first.paginationToken) == 4000017)
            // Handed out again: good again.
            let again = try await api.notificationHistory(startDate: now.addingTimeInterval(-60), endDate: now)
            #expect(await refusal(now.addingTimeInterval(-60), now, again.paginationToken) == nil)
        }
        try await production.run { base in
            let api = try await AppStoreServerAPI(settings: production.settings(baseURL: base), logger: AppStoreServerAPITests.logger)
            let now = Date()
            _ = try await api.notificationHistory(startDate: now.addingTimeInterval(-179 * 86_400), endDate: now)
            await #expect(throws: AppStoreServerAPIError.self, "production keeps 180 days") {
                _ = try await api.notificationHistory(startDate: now.addingTimeInterval(-181 * 86_400), endDate: now)
            }
        }
    }

    @Test("finish transaction: an answer slower than the time-out is retried, and a 500 storm ends in a clear error")
    func finish() async throws {
        try await standIn.run { base in
            // The first try is held past the client's time-out; the client tries again. (10 s: the
            // second try's answer comes well within it even on a loaded machine.)
            await standIn.queue([.held])
            try await client(base, timeout: .seconds(10)).finishTransaction("8100003")
            #expect(await standIn.holding == 1, "the first try still waits at Apple")
            let finished = await standIn.writes.filter { $0.path == "/inApps/v1/transactions/8100003/finish" && $0.method == "POST" }
            #expect(finished.count == 1, "\(finished)")
            // The held try may still land once let go: Apple finishes a transaction once either way.
            await standIn.release()
            let api = try await client(base)
            await standIn.queue(Array(repeating: .serverError, count: 4))
            let before = await standIn.requests
            do {
                try await api.finishTransaction("8100004")
                Issue.record("four 500s in a row answered")
            } catch {
                #expect((error as? AppStoreServerAPIError)?.code == "apple-api-unavailable")
            }
            #expect(await standIn.requests == before + 4, "four tries (the settings' attempts), then the error")
        }
    }

    @Test("set app account token: the token as sent; Apple's refusal of a family-shared transaction keeps its errorCode")
    func accountToken() async throws {
        try await standIn.run { base in
            let api = try await client(base)
            let token = UUID()
            await standIn.queue([.serverError])
            try await api.setAppAccountToken("8100005", token)
            let write = try #require(await standIn.writes.last)
            #expect(write.method == "PUT" && write.path == "/inApps/v1/transactions/8100005/appAccountToken")
            #expect(write.body == #"{"appAccountToken":"\#(token.uuidString.lowercased())"}"#)
            await standIn.refuseAccountToken("8100006", errorCode: 4_000_185)
            do {
                try await api.setAppAccountToken("8100006", token)
                Issue.record("a refused token was taken")
            } catch {
                let refusal = error as? AppStoreServerAPIError
                #expect(refusal?.code == "apple-api-refused" && refusal?.status == 400 && refusal?.appleErrorCode == 4_000_185)
            }
        }
    }

    @Test("notification history: pages followed by their pagination token; a malformed page says so")
    func notificationHistory() async throws {
        let first = try await apple.notification("CONSUMPTION_REQUEST", transaction: TestApple.transaction("8100007"))
        let second = try await apple.notification("REFUND", transaction: TestApple.transaction("8100008"))
        await standIn.setNotifications([
            .init(revision: "p1", hasMore: true, signedTransactions: [first]),
            .init(revision: "p2", hasMore: false, signedTransactions: [second]),
        ])
        try await standIn.run { base in
            let api = try await client(base)
            let end = Date()
            let start = end.addingTimeInterval(-86_400)
            await standIn.queue([.tooManyRequests(after: .milliseconds(200))])
            let one = try await api.notificationHistory(startDate: start, endDate: end)
            #expect(one.hasMore && one.paginationToken == "p1" && one.notificationHistory.map(\.signedPayload) == [first])
            let two = try await api.notificationHistory(startDate: start, endDate: end, paginationToken: one.paginationToken)
            #expect(!two.hasMore && two.notificationHistory.map(\.signedPayload) == [second])
            // Fields left out, as Apple's models allow: the last page, and an item with nothing to apply.
            await standIn.queue([.answer("{}"), .answer(#"{"notificationHistory": [{}]}"#)])
            let empty = try await api.notificationHistory(startDate: start, endDate: end)
            #expect(!empty.hasMore && empty.paginationToken == nil && empty.notificationHistory.isEmpty)
            let bare = try await api.notificationHistory(startDate: start, endDate: end)
            #expect(bare.notificationHistory.count == 1 && bare.notificationHistory.first?.signedPayload == nil)
            await standIn.queue([.malformed])
            do {
                _ = try await api.notificationHistory(startDate: start, endDate: end)
                Issue.record("a malformed page was read")
            } catch {
                #expect((error as? AppStoreServerAPIError)?.code == "apple-api-answer-malformed")
            }
        }
    }

    @Test("refund history: pages from a revision; an unknown account is apple-api-not-found")
    func refundHistory() async throws {
        await standIn.setRefunds("app-r", [
            .init(revision: "f1", hasMore: true, signedTransactions: [try await apple.sign(TestApple.transaction("8100009"))]),
            .init(revision: "f2", hasMore: false, signedTransactions: []),
        ])
        try await standIn.run { base in
            let api = try await client(base)
            await standIn.queue([.serverError])
            let one = try await api.refundHistory("app-r")
            #expect(one.revision == "f1" && one.hasMore && one.signedTransactions.count == 1)
            let two = try await api.refundHistory("app-r", revision: one.revision)
            #expect(two.revision == "f2" && !two.hasMore && two.signedTransactions.isEmpty)
            let later = try await api.refundHistory("app-r", revision: two.revision)
            #expect(later.signedTransactions.isEmpty && later.revision == "f2", "nothing new since")
            do {
                _ = try await api.refundHistory("app-unknown")
                Issue.record("an unknown account answered")
            } catch {
                let refusal = error as? AppStoreServerAPIError
                #expect(refusal?.code == "apple-api-not-found" && refusal?.status == 404)
            }
        }
    }
}
