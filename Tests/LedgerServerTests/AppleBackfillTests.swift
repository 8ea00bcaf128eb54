import AppleReceipts
import AppStoreStandIn
import Foundation
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Synchronization
import Testing

@Suite("Backfills from Apple's history: notifications missed, refunds never heard of")
struct AppleBackfillTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    func withBackfillApplication(
        atStart: Bool = false, production: Bool = false, _ test: @Sendable @escaping (LedgerHTTP, TestDatabase, String) async throws -> Void
    ) async throws {
        try await withAppleAPIApplication(apple, standIn, configure: { configuration in
            if production { bothEnvironments(&configuration) }
            configuration.appleCallsInterval = 0
            configuration.backfillNotificationsAtStart = atStart
            configuration.refundCatchUpInterval = 0
        }, test)
    }

    func refundCatchUp(_ base: String, _ db: TestDatabase) throws -> RefundCatchUp {
        let configuration = trusting(apple)
        return configuration.refundCatchUp(
            secondServer(db), api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base), logger: TestServer.logger),
            verifier: try configuration.apple.verifier(logger: TestServer.logger))
    }

    func backfill(_ base: String, _ db: TestDatabase) throws -> NotificationBackfill {
        secondServer(db).notificationBackfill(
            api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base), logger: TestServer.logger),
            verifier: try trusting(apple).apple.verifier(logger: TestServer.logger))
    }

    func order(_ http: LedgerHTTP, _ id: String, _ transaction: SignedTransactionPayload) async throws {
        try await http.send(.post, "/v1/orders", json: newOrder(id))
        let (_, answer) = try await http.send(.post, "/v1/receipts", json: ["orderId": id, "signedTransaction": try await apple.sign(transaction)])
        #expect(answer["state"] as? String == "verified")
        try await http.send(.post, "/v1/orders/\(id)/events", json: ["type": "delivered", "data": [:]])
    }

    /// Order `id`, paid by `transaction` of Apple account `account` and delivered: what it was paid with.
    @discardableResult
    func grantedOrder(_ http: LedgerHTTP, _ id: String, transaction: String, account: String) async throws -> SignedTransactionPayload {
        let granted = self.transaction(transaction, account: account)
        try await order(http, id, granted)
        return granted
    }

    /// Apple's transaction `id` of Apple account `account`.
    func transaction(_ id: String, account: String) -> SignedTransactionPayload {
        var transaction = TestApple.transaction(id)
        transaction.appTransactionId = account
        return transaction
    }

    /// Order `order` (of u-1) its backend claimed with its own `receipt-received` of `transaction`,
    /// of Apple account `account`, bought at `date`: held unverified.
    func claimed(_ http: LedgerHTTP, _ order: String, transaction: String, account: String, at date: Date = Date()) async throws {
        try await http.send(.post, "/v1/orders", json: newOrder(order))
        var own = receipt(transaction)
        own["purchaseDate"] = ISO8601DateFormatter().string(from: date)
        own["appTransactionId"] = account
        let (status, answer) = try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "receipt-received", "data": own])
        #expect(status == .created, "\(answer)")
    }

    func refunded(_ transaction: SignedTransactionPayload) -> SignedTransactionPayload {
        var refunded = transaction
        refunded.revocationDate = Date().millisecondsSince1970
        refunded.revocationReason = 1
        return refunded
    }

    @Test("a notification backfill applies what was missed once, resumes where a failure stopped it, and a second one applies nothing")
    func notificationBackfill() async throws {
        let forged = try ThrowawaySigningChain(name: "Not Apple")
        try await withBackfillApplication { http, db, base in
            let sold = TestApple.transaction("8500001")
            try await order(http, "n-1", sold)
            // Received live before the outage: in the history too.
            let live = try await apple.notification("CONSUMPTION_REQUEST", transaction: sold)
            let (status, _) = try await http.notifyApple(live)
            #expect(status == .ok)
            let missedRefund = try await apple.notification("REFUND", transaction: refunded(sold))
            let missedPurchase = try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("8500002"))
            let forgedOne = try forged.sign(SignedNotificationPayload(
                notificationType: "REFUND", notificationUUID: UUID().uuidString, signedDate: Date().millisecondsSince1970, data: nil))
            await standIn.setNotifications([
                .init(revision: "page-2", hasMore: true, signedTransactions: [live, missedRefund]),
                .init(revision: "page-3", hasMore: false, signedTransactions: [forgedOne, missedPurchase]),
            ])
            // A backfill stopped after its first page keeps the next page's token.
            var backfill = try backfill(base, db)
            backfill.maximumPages = 1
            let stopped = try await backfill.run()
            #expect(!stopped.finished && stopped.applied == 1 && stopped.repeated == 1, "\(stopped)")
            #expect(try await scalar(db, "SELECT pagination_token FROM apple_notification_backfill WHERE NOT EXISTS (SELECT FROM leases WHERE name LIKE 'notification-backfill/%')", as: String.self) == "page-2")
            let (_, afterFirst) = try await http.send(.get, "/v1/orders/n-1")
            #expect(afterFirst["state"] as? String == "refunded", "the first page was applied")
            // Then Apple rate-limits (honoured), and fails the page more often than the client retries: the token stays.
            backfill.maximumPages = 100
            await standIn.queue([.tooManyRequests(after: .seconds(1))] + Array(repeating: .serverError, count: 4))
            let started = ContinuousClock.now
            await #expect(throws: AppStoreServerAPIError.self) { try await backfill.run() }
            #expect(ContinuousClock.now - started >= .seconds(1), "Retry-After honoured")
            #expect(try await scalar(db, "SELECT pagination_token FROM apple_notification_backfill WHERE NOT EXISTS (SELECT FROM leases WHERE name LIKE 'notification-backfill/%')", as: String.self) == "page-2")

            let resumed = try await backfill.run()
            #expect(resumed.resumed && resumed.pages == 1 && resumed.notifications == 2 && resumed.applied == 1 && resumed.refused == 1, "\(resumed)")
            #expect(resumed.finished)
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '8500002'", as: Int.self) == 1)

            // Again from the start date: all known, nothing appended.
            let events = try await eventCount(db)
            let again = try await backfill.run(since: Date(timeIntervalSinceNow: -3600))
            #expect(!again.resumed && again.notifications == 4 && again.applied == 0 && again.repeated == 3 && again.refused == 1, "\(again)")
            #expect(try await eventCount(db) == events, "nothing applied twice")
            let refunds = try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'order-n-1' AND type = 'refunded'", as: Int.self)
            #expect(refunds == 1)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    /// Two pages of history, and a backfill stopped after the first: its next page's token is stored.
    func stoppedAfterFirstPage(_ base: String, _ db: TestDatabase, first: String) async throws -> NotificationBackfill {
        await standIn.setNotifications([
            .init(revision: "\(first)-2", hasMore: true, signedTransactions: [
                try await apple.notification("CONSUMPTION_REQUEST", transaction: TestApple.transaction("\(first)1"))]),
            .init(revision: "\(first)-3", hasMore: false, signedTransactions: [
                try await apple.notification("CONSUMPTION_REQUEST", transaction: TestApple.transaction("\(first)2"))]),
        ])
        var backfill = try backfill(base, db)
        backfill.maximumPages = 1
        let stopped = try await backfill.run()
        #expect(!stopped.finished && stopped.notifications == 1, "\(stopped)")
        backfill.maximumPages = 100
        return backfill
    }

    func storedToken(_ db: TestDatabase) async throws -> String? {
        try await scalar(db, "SELECT pagination_token FROM apple_notification_backfill", as: String?.self) ?? nil
    }

    @Test("the backfill knows the environment of the API client: Apple's hosts by name, any other host by the configured environment")
    func backfillEnvironment() {
        #expect(NotificationBackfill.environment(baseURL: "https://api.storekit-sandbox.apple.com", configured: .production) == .sandbox)
        #expect(NotificationBackfill.environment(baseURL: "https://api.storekit-sandbox.itunes.apple.com/", configured: nil) == .sandbox)
        #expect(NotificationBackfill.environment(baseURL: "https://api.storekit.apple.com", configured: .sandbox) == .production)
        #expect(NotificationBackfill.environment(baseURL: "https://api.storekit.itunes.apple.com", configured: nil) == .production)
        #expect(NotificationBackfill.environment(baseURL: "http://127.0.0.1:8080", configured: .production) == .production)
        #expect(NotificationBackfill.environment(baseURL: "http://127.0.0.1:8080", configured: nil) == .sandbox)
        #expect(NotificationBackfill.keeps(.sandbox) == 30 * 86_400 && NotificationBackfill.keeps(.production) == 180 * 86_400)
    }

    @Test("a sandbox backfill never asks Apple for more than 30 days back: not from --since, not from a stored position older than that")
    func sandboxBackfillWindow() async throws {
        try await withBackfillApplication { _, db, base in
            await standIn.setNotifications([.init(revision: "w-1", hasMore: false, signedTransactions: [
                try await apple.notification("CONSUMPTION_REQUEST", transaction: TestApple.transaction("8510001"))])])
            let backfill = try backfill(base, db)
            let limit = Date(timeIntervalSinceNow: -30 * 86_400)
            let fromSince = try await backfill.run(since: Date(timeIntervalSinceNow: -90 * 86_400))
            #expect(fromSince.finished && fromSince.notifications == 1 && fromSince.restarted == nil && fromSince.refusal == nil, "\(fromSince)")
            #expect((fromSince.startDate ?? .distantPast) > limit, "\(fromSince)")
            // A position stored while Apple kept more (or by a production client) is not resumed past the sandbox's 30 days.
            try await db.client.query("""
                UPDATE apple_notification_backfill SET start_date = now() - interval '40 days', end_date = now() - interval '39 days',
                       pagination_token = 'w-1', finished_at = NULL
                """, logger: TestServer.logger)
            let stale = try await backfill.run()
            #expect(stale.finished && !stale.resumed && stale.refusal == nil, "\(stale)")
            let asked = await standIn.notificationRequests
            #expect(asked.count == 2 && asked.allSatisfy { ($0.startDate ?? .distantPast) > limit && $0.paginationToken == nil }, "\(asked)")
        }
    }

    @Test("a backfill stopped with its start at Apple's limit is resumed later; one whose start Apple no longer keeps reads again from the limit, not from the last notification")
    func backfillStartedAtTheLimit() async throws {
        try await withBackfillApplication { http, db, base in
            await standIn.setNotifications([
                .init(revision: "l-2", hasMore: true, signedTransactions: [
                    try await apple.notification("CONSUMPTION_REQUEST", transaction: TestApple.transaction("8515001"))]),
                .init(revision: "l-3", hasMore: false, signedTransactions: [
                    try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("8515002"))]),
            ])
            // Asked from further back than the sandbox keeps: its start is the limit; it stops after a page.
            var backfill = try backfill(base, db)
            backfill.maximumPages = 1
            let stopped = try await backfill.run(since: Date(timeIntervalSinceNow: -40 * 86_400))
            #expect(!stopped.finished && stopped.notifications == 1, "\(stopped)")
            backfill.maximumPages = 100
            // A live notification arrives before the next run.
            let (status, _) = try await http.notifyApple(try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("8515003")))
            #expect(status == .ok)
            let resumed = try await backfill.run()
            #expect(resumed.resumed && resumed.finished && abs((resumed.startDate ?? .distantPast).timeIntervalSince(stopped.startDate ?? .distantFuture)) < 0.001 && resumed.applied == 1, "\(resumed)")

            // Stopped again, its start now further back than Apple keeps: from the limit again, not from an hour before the live one.
            await standIn.setNotifications([
                .init(revision: "m-2", hasMore: true, signedTransactions: [
                    try await apple.notification("CONSUMPTION_REQUEST", transaction: TestApple.transaction("8515004"))]),
                .init(revision: "m-3", hasMore: false, signedTransactions: [
                    try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("8515005"))]),
            ])
            try await db.client.query("""
                UPDATE apple_notification_backfill SET start_date = now() - interval '31 days', end_date = now() - interval '1 day',
                       pagination_token = 'm-2', finished_at = NULL
                """, logger: TestServer.logger)
            let stale = try await backfill.run()
            #expect(!stale.resumed && stale.finished && stale.notifications == 2, "\(stale)")
            let start = stale.startDate ?? .distantFuture
            #expect(start > Date(timeIntervalSinceNow: -30 * 86_400) && start < Date(timeIntervalSinceNow: -29 * 86_400), "\(stale)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '8515005'", as: Int.self) == 1)
        }
    }

    @Test("a notification about no transaction (Apple's TEST) of another environment moves no backfill's start: each starts from its own environment's last notification")
    func testNotificationMovesNoOtherBackfill() async throws {
        try await withBackfillApplication(production: true) { http, db, base in
            // The last Sandbox notification (the backfill's environment), three days ago.
            let old = Date(timeIntervalSinceNow: -3 * 86_400)
            let (status, _) = try await http.notifyApple(
                try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("8516001", purchaseDate: old), signedDate: old))
            #expect(status == .ok)
            // Apple's TEST of the production environment, now: it names its app and environment, and no transaction.
            let (tested, answer) = try await http.notifyApple(try await apple.notification("TEST", transaction: nil, environment: "Production"))
            #expect(tested == .ok, "\(answer)")
            let stored = try await scalar(
                db, "SELECT data->>'bundleId' || ' ' || (data->>'environment') FROM events WHERE type = 'notification-received' AND data->>'notificationType' = 'TEST'",
                as: String.self)
            #expect(stored == "\(TestApple.bundleId) Production", "\(String(describing: stored))")
            let summary = try await backfill(base, db).run()
            let start = summary.startDate ?? .distantFuture
            #expect(abs(start.timeIntervalSince(old.addingTimeInterval(-3600))) < 1, "from the Sandbox notification less an hour: \(summary)")
        }
    }

    @Test("a stored position whose token expired: the run starts again once from the start Apple allows, finishes, and says why")
    func backfillRestartsOnExpiredToken() async throws {
        try await withBackfillApplication { _, db, base in
            var backfill = try await stoppedAfterFirstPage(base, db, first: "852000")
            #expect(try await storedToken(db) == "852000-2")
            await standIn.expireNotificationTokens()
            let reasons = Reasons()
            backfill.restarted = { reason in reasons.add(reason) }
            let summary = try await backfill.run()
            #expect(summary.restarted == "PaginationTokenExpired" && summary.finished && summary.refusal == nil, "\(summary)")
            #expect(summary.notifications == 2 && summary.repeated == 1 && summary.applied == 1, "read from the first page again: \(summary)")
            #expect(reasons.all == ["PaginationTokenExpired"])
            let asked = await standIn.notificationRequests.suffix(3).map(\.paginationToken)
            #expect(asked == ["852000-2", nil, "852000-2"], "the expired token once, then from the start: \(asked)")
            let starts = await standIn.notificationRequests.suffix(3).compactMap(\.startDate)
            #expect(starts.count == 3 && starts[1] < starts[0] && starts[1] > Date(timeIntervalSinceNow: -30 * 86_400),
                    "the restart asks from the earliest date the sandbox allows, not the refused request's: \(starts)")
            #expect(try await scalar(db, "SELECT finished_at IS NOT NULL FROM apple_notification_backfill", as: Bool.self) == true)
        }
    }

    @Test("Apple's refusal stops a backfill run and says so; the next run does not repeat the refused request; a restart refused again stops too")
    func backfillRefusalIsNotRepeated() async throws {
        try await withBackfillApplication { _, db, base in
            let backfill = try await stoppedAfterFirstPage(base, db, first: "853000")
            // Apple refuses the stored request for a reason a restart would not mend.
            await standIn.queue([.refused(status: 400, errorCode: 4000002)])
            let refused = try await backfill.run()
            #expect(refused.appleErrorCode == 4000002 && refused.refusal != nil && !refused.finished && refused.restarted == nil, "\(refused)")
            #expect(try await storedToken(db) == nil)
            #expect(try await scalar(db, "SELECT abandoned_because FROM apple_notification_backfill", as: String.self)?.contains("4000002") == true)
            let before = await standIn.notificationRequests.count
            let next = try await backfill.run()
            #expect(next.finished && !next.resumed && next.refusal == nil, "\(next)")
            let asked = await standIn.notificationRequests.dropFirst(before).map(\.paginationToken)
            #expect(asked == [nil, "853000-2"], "the next run asks afresh from the first page, not with the refused token: \(asked)")

            // Stopped again with a token; Apple refuses it as expired, then refuses the restart too: one restart, then the run stops.
            var again = try await stoppedAfterFirstPage(base, db, first: "854000")
            again.maximumPages = 100
            await standIn.queue([.refused(status: 400, errorCode: 4000017), .refused(status: 400, errorCode: 4000012)])
            let twice = try await again.run()
            #expect(twice.restarted == "PaginationTokenExpired" && twice.appleErrorCode == 4000012 && !twice.finished, "\(twice)")
            let last = try await again.run()
            #expect(last.finished && last.refusal == nil && !last.resumed, "\(last)")
        }
    }

    @Test("ledger serve backfills notifications at start, from the last one it recorded")
    func backfillAtStart() async throws {
        // Apple's history holds a notification the ledger never received; the server starts.
        await standIn.setNotifications([
            .init(revision: "only", hasMore: false, signedTransactions: [
                try await apple.notification("ONE_TIME_CHARGE", transaction: TestApple.transaction("8600001"))]),
        ])
        try await withBackfillApplication(atStart: true) { _, db, _ in
            var finished = false
            for _ in 0..<1200 where !finished {
                try await Task.sleep(for: .milliseconds(100))
                finished = try await scalar(db, "SELECT finished_at IS NOT NULL FROM apple_notification_backfill", as: Bool.self) ?? false
            }
            #expect(finished, "the pass at start read Apple's history to its end within 2 minutes")
            let applied = try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '8600001'", as: Int.self)
            #expect(applied == 1, "the pass at start applied the missed notification")
        }
    }

    @Test("a stored refund-history revision Apple no longer takes: the account's refunds are read again from the start, the new one applied")
    func refundRevisionRefused() async throws {
        try await withBackfillApplication { http, db, base in
            let catchUp = try refundCatchUp(base, db)
            let bought = try await grantedOrder(http, "rv-1", transaction: "8705001", account: "acct-rv")
            await standIn.setRefunds("8705001", [.init(revision: "rr-1", hasMore: false, signedTransactions: [])])
            let first = try await catchUp.run(all: true)
            #expect(first.accounts == 1 && first.failed == 0, "\(first)")
            // Apple's refund history now has revisions the ledger never saw, and the refund.
            await standIn.setRefunds("8705001", [.init(revision: "nr-1", hasMore: false, signedTransactions: [try await apple.sign(refunded(bought))])])
            let second = try await catchUp.run(all: true)
            #expect(second.failed == 0 && second.applied == 1, "\(second)")
            let (_, order) = try await http.send(.get, "/v1/orders/rv-1")
            #expect(order["state"] as? String == "refunded", "\(order)")
            #expect(try await scalar(db, "SELECT revision FROM apple_refund_cursors WHERE account_id = 'acct-rv'", as: String.self) == "nr-1")
        }
    }

    @Test("the refund catch-up applies a refund the ledger never heard of, once, counted in the report; Apple's faults fail the account and keep its cursor")
    func refundCatchUp() async throws {
        let forged = try ThrowawaySigningChain(name: "Not Apple")
        try await withBackfillApplication { http, db, base in
            let catchUp = try refundCatchUp(base, db)

            // Account a: a refund the ledger never heard of. Account b: a refund that came by
            // notification, and another purchase still granted (so the account is due).
            var missed = TestApple.transaction("8700001")
            missed.appTransactionId = "acct-a"
            try await order(http, "r-1", missed)
            var known = TestApple.transaction("8700002", purchaseDate: Date(timeIntervalSinceNow: -120))
            known.appTransactionId = "acct-b"
            try await order(http, "r-2", known)
            var kept = TestApple.transaction("8700003", purchaseDate: Date(timeIntervalSinceNow: -30))
            kept.appTransactionId = "acct-b"
            try await order(http, "r-3", kept)
            _ = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded(known)))
            missed = refunded(missed)
            missed.revocationType = "REFUND_PRORATED"
            missed.revocationPercentage = 40_000
            await standIn.setRefunds("8700001", [.init(revision: "r1-a", hasMore: false, signedTransactions: [try await apple.sign(missed)])])
            await standIn.setRefunds("8700003", [.init(revision: "r2-a", hasMore: false, signedTransactions: [
                try await apple.sign(refunded(known)), try forged.sign(refunded(TestApple.transaction("8700004"))),
            ])])

            // A malformed answer for the first account: it fails, its cursor does not move; the other is read.
            await standIn.queue([.malformed])
            let first = try await catchUp.run()
            #expect(first.failed == 1 && first.failures == ["apple-api-answer-malformed": 1] && first.accounts == 1, "\(first)")
            #expect(first.known == 1 && first.refused == 1 && first.applied == 0, "\(first)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_refund_cursors WHERE revision IS NOT NULL", as: Int.self) == 0,
                    "a failed account and a page with a forged entry keep their cursors")

            let second = try await catchUp.run()
            #expect(second.applied == 1 && second.failed == 0, "\(second)")
            let (_, order) = try await http.send(.get, "/v1/orders/r-1")
            #expect(order["state"] as? String == "refunded")
            let refund = (order["events"] as? [[String: Any]])?.last ?? [:]
            // Read from Apple's refund history, with Apple's type and percentage: no notification said it.
            let data = refund["data"] as? [String: Any] ?? [:]
            #expect(data["notificationType"] == nil && data["revocationType"] as? String == "REFUND_PRORATED" && data["revocationPercentage"] as? Int == 40_000, "\(data)")
            #expect((refund["metadata"] as? [String: Any])?["refundCatchUp"] as? Bool == true)
            #expect(try await scalar(db, "SELECT revision FROM apple_refund_cursors WHERE account_id = 'acct-a'", as: String.self) == "r1-a")

            // Read within the day: not due. Read anyway: nothing new.
            let third = try await catchUp.run()
            #expect(third.accounts == 0, "\(third)")
            let events = try await eventCount(db)
            await standIn.setRefunds("8700001", [.init(revision: "r1-a", hasMore: false, signedTransactions: [try await apple.sign(missed)])])
            try await db.client.query("UPDATE apple_refund_cursors SET revision = NULL", logger: TestServer.logger)
            let everything = try await catchUp.run(all: true)
            #expect(everything.applied == 0, "\(everything)")
            #expect(try await eventCount(db) == events, "nothing applied twice")

            let (_, report) = try await http.send(.get, "/v1/reports/reconciliation")
            let totals = report["sandboxTotals"] as? [String: Any] ?? [:]
            #expect(totals["refundsCaughtUp"] as? Int == 1 && totals["refunded"] as? Int == 2, "\(totals)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    @Test("an entry of Apple's refund history that never verifies keeps the cursor before its page, and hides no later page's refund")
    func refundAfterAnUnverifiablePage() async throws {
        let forged = try ThrowawaySigningChain(name: "Not Apple")
        try await withBackfillApplication { http, db, base in
            let catchUp = try refundCatchUp(base, db)
            var first = TestApple.transaction("8750001", purchaseDate: Date(timeIntervalSinceNow: -60))
            first.appTransactionId = "acct-h"
            try await order(http, "h-1", first)
            var later = TestApple.transaction("8750002")
            later.appTransactionId = "acct-h"
            try await order(http, "h-2", later)
            // Page one holds an entry no Apple chain signed; page two, a refund the ledger never heard of.
            let pages: [AppStoreServerStandIn.Page] = [
                .init(revision: "h-p1", hasMore: true, signedTransactions: [try forged.sign(refunded(TestApple.transaction("8750009")))]),
                .init(revision: "h-p2", hasMore: false, signedTransactions: [try await apple.sign(refunded(later))]),
            ]
            // Asked by either of the account's purchases (the granted one it is due for).
            for id in ["8750001", "8750002"] { await standIn.setRefunds(id, pages) }

            let summary = try await catchUp.run()
            #expect(summary.pages == 2 && summary.refused == 1 && summary.applied == 1 && summary.failed == 0, "\(summary)")
            let (_, order) = try await http.send(.get, "/v1/orders/h-2")
            #expect(order["state"] as? String == "refunded", "the refund after the unverifiable page was applied")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_refund_cursors WHERE account_id = 'acct-h' AND revision IS NULL", as: Int.self) == 1,
                    "the cursor stays before the page that held an entry back")

            // Read again from there: the refund is known, nothing is applied twice.
            let events = try await eventCount(db)
            let again = try await catchUp.run(all: true)
            #expect(again.pages == 2 && again.applied == 0 && again.known == 1 && again.refused == 1, "\(again)")
            #expect(try await eventCount(db) == events, "nothing applied twice")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    @Test("a refund Apple reversed before the refund catch-up read it is known, not applied: the order stays granted")
    func reversedRefundIsKnown() async throws {
        try await withBackfillApplication { http, db, base in
            let catchUp = try refundCatchUp(base, db)
            let bought = try await grantedOrder(http, "u-r", transaction: "8800021", account: "acct-r")
            let refund = refunded(bought)
            try await http.notifyAppleTaken(try await apple.notification("REFUND", transaction: refund, signedDate: Date(timeIntervalSinceNow: -2)))
            try await http.notifyAppleTaken(try await apple.notification("REFUND_REVERSED", transaction: bought))
            await standIn.setRefunds("8800021", [.init(revision: "r1", hasMore: false, signedTransactions: [try await apple.sign(refund)])])
            let summary = try await catchUp.run()
            #expect(summary.applied == 0 && summary.known == 1, "\(summary)")
            #expect(try await http.send(.get, "/v1/orders/u-r").1["state"] as? String != "refunded")
        }
    }

    @Test("the refund catch-up keeps a refunded purchase the ledger never saw from being granted later (promise 8)")
    func refundOfUnknownTransaction() async throws {
        try await withBackfillApplication { http, db, base in
            let catchUp = try refundCatchUp(base, db)
            // The account is due for its granted purchase; its refund history holds another one no client sent.
            try await grantedOrder(http, "u-1", transaction: "8800001", account: "acct-u")
            let unseen = transaction("8800002", account: "acct-u")
            await standIn.setRefunds("8800001", [.init(revision: "u1", hasMore: false, signedTransactions: [try await apple.sign(refunded(unseen))])])

            let summary = try await catchUp.run()
            #expect(summary.applied == 1 && summary.failed == 0, "\(summary)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'transaction-8800002' AND type = 'notification-received'", as: Int.self) == 1)
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions WHERE transaction_id = '8800002'", as: Int.self) == 0,
                    "a refunded purchase is not offered to the reconciler")
            // A client that sends it later gets it refused, and its order is not granted.
            try await http.send(.post, "/v1/orders", json: newOrder("u-late"))
            let (_, receipt) = try await http.send(.post, "/v1/receipts", json: ["orderId": "u-late", "signedTransaction": try await apple.sign(unseen)])
            #expect(receipt["outcome"] as? String == "rejected" && receipt["reason"] as? String == "transaction-refunded", "\(receipt)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    @Test("the refund catch-up reads the account of a backend's own claim, unverified: Apple's refund fails the order, which is then never verified")
    func refundOfUnverifiedClaim() async throws {
        try await withBackfillApplication { http, db, base in
            let catchUp = try refundCatchUp(base, db)
            try await claimed(http, "u-claim", transaction: "8800010", account: "acct-c")
            let bought = transaction("8800010", account: "acct-c")
            await standIn.setRefunds("8800010", [.init(revision: "c1", hasMore: false, signedTransactions: [try await apple.sign(refunded(bought))])])

            let summary = try await catchUp.run()
            #expect(summary.accounts == 1 && summary.applied == 1 && summary.failed == 0, "\(summary)")
            #expect(try await scalar(db, "SELECT state || ' ' || failure_reason FROM orders WHERE order_id = 'u-claim'", as: String.self) == "failed transaction-refunded")
            let (refused, _) = try await http.send(.post, "/v1/orders/u-claim/events", json: ["type": "verified", "data": [:]])
            #expect(refused == .conflict, "a refunded purchase is never verified")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    @Test("the refund catch-up asks Apple by an account's granted transaction, not by a backend's newer, unchecked claim")
    func claimDoesNotStandForItsAccount() async throws {
        try await withBackfillApplication { http, db, base in
            let catchUp = try refundCatchUp(base, db)
            let granted = try await grantedOrder(http, "u-g", transaction: "8800020", account: "acct-g")
            // The account's latest: a claim of a transaction Apple does not know.
            try await claimed(http, "u-bogus", transaction: "8800029", account: "acct-g", at: Date(timeIntervalSinceNow: 120))
            await standIn.setRefunds("8800020", [.init(revision: "g1", hasMore: false, signedTransactions: [try await apple.sign(refunded(granted))])])
            let summary = try await catchUp.run()
            #expect(summary.accounts == 1 && summary.applied == 1 && summary.failed == 0, "\(summary)")
        }
    }

    @Test("a refund history whose positions go round (A, B, A) ends at the first one named again: the account failed, not read to the page limit")
    func positionsGoingRound() async throws {
        try await withBackfillApplication { http, db, base in
            let catchUp = try refundCatchUp(base, db)
            _ = try await grantedOrder(http, "u-round", transaction: "8800051", account: "acct-round")
            await standIn.setRefunds("8800051", [
                .init(revision: "A", hasMore: true, signedTransactions: []), .init(revision: "B", hasMore: true, signedTransactions: []),
                .init(revision: "A", hasMore: true, signedTransactions: []), .init(revision: "B", hasMore: true, signedTransactions: []),
            ])
            let summary = try await catchUp.run()
            #expect(summary.failed == 1 && summary.failures == ["apple-api-position-unmoved": 1] && summary.pages == 3, "\(summary)")
        }
    }

    @Test("an account asked by a backend's claim of a transaction Apple does not know is no failed read: counted, and asked again a day later")
    func claimAppleDoesNotKnow() async throws {
        try await withBackfillApplication { http, db, base in
            let catchUp = try refundCatchUp(base, db)
            try await claimed(http, "u-unknown", transaction: "8800039", account: "acct-u")
            let summary = try await catchUp.run()
            #expect(summary.accounts == 1 && summary.unknownClaims == 1 && summary.failed == 0, "\(summary)")
            let again = try await catchUp.run()
            #expect(again.accounts == 0 && again.unknownClaims == 0 && again.failed == 0, "read today: due tomorrow, \(again)")
            #expect(try await scalar(db, "SELECT state FROM orders WHERE order_id = 'u-unknown'", as: String.self) == "receipt-received",
                    "the claim stays for its backend to verify or fail")
        }
    }

    @Test("a renewal's refund that came by notification is known to the refund catch-up; the report counts it once, even from a log holding it twice")
    func renewalRefundCaughtUpOnce() async throws {
        try await withAppleAPIApplication(apple, standIn, configure: { configuration in
            configuration.appleCallsInterval = 0
            configuration.refundCatchUpInterval = 0
            olderPurchases(&configuration)
        }) { http, db, base in
            let catchUp = try refundCatchUp(base, db)
            let otid = "7700001", day: TimeInterval = 86_400
            let now = Date()
            // A subscription bought through an order (so its account is due), then renewed.
            let start = SubscriptionNotificationTests.period(otid, 0, purchased: now.addingTimeInterval(-31 * day), expires: now.addingTimeInterval(-day))
            try await http.send(.post, "/v1/orders", json: newOrder("s-1", product: "pro.monthly"))
            let (_, bought) = try await http.send(.post, "/v1/receipts", json: ["orderId": "s-1", "signedTransaction": try await apple.sign(start)])
            #expect(bought["state"] as? String == "verified", "\(bought)")
            try await http.send(.post, "/v1/orders/s-1/events", json: ["type": "delivered", "data": [:]])
            let renewal = SubscriptionNotificationTests.period(otid, 1, purchased: now.addingTimeInterval(-day), expires: now.addingTimeInterval(29 * day))
            #expect(try await http.notifyApple(try await apple.notification("DID_RENEW", transaction: renewal, renewalInfo: TestApple.renewalInfo(otid))).0 == .ok)

            // Apple refunds the renewal: the notification records it; Apple's refund history lists it.
            let (_, refund) = try await http.notifyApple(try await apple.notification("REFUND", transaction: refunded(renewal)))
            #expect(refund["type"] as? String == "subscription-period-refunded", "\(refund)")
            await standIn.setRefunds(otid, [.init(revision: "s1", hasMore: false, signedTransactions: [try await apple.sign(refunded(renewal))])])
            let summary = try await catchUp.run()
            #expect(summary.accounts == 1 && summary.applied == 0 && summary.known == 1, "\(summary)")
            let refunds: PostgresQuery = """
                SELECT count(*)::int FROM events WHERE stream_id = \("subscription-\(otid)") AND type = 'subscription-period-refunded'
                """
            #expect(try await scalar(db, refunds, as: Int.self) == 1, "one refund of the period")

            func refundTotals() async throws -> (Int?, Decimal?) {
                let (_, report) = try await http.send(.get, "/v1/reports/reconciliation?from=2000-01-01")
                let renewals = (report["rows"] as? [[String: Any]] ?? []).filter { $0["kind"] as? String == "subscription-renewal" }
                let totals = report["sandboxTotals"] as? [String: Any] ?? [:]
                #expect(renewals.reduce(0) { $0 + ($1["refunded"] as? Int ?? 0) } == totals["refunded"] as? Int, "\(report)")
                return (totals["refunded"] as? Int, Decimal(string: totals["refundedAmount"] as? String ?? ""))
            }
            var (count, amount) = try await refundTotals()
            #expect(count == 1 && amount == Decimal(string: "4.99"), "the period's price, taken back once")

            // A log an earlier version left with the refund twice: still one refund of the period.
            try await SubscriptionFixture.refund(secondServer(db), renewal)
            #expect(try await scalar(db, refunds, as: Int.self) == 2)
            (count, amount) = try await refundTotals()
            #expect(count == 1 && amount == Decimal(string: "4.99"), "one refund per billed period")
            try await db.client.query("UPDATE apple_refund_cursors SET revision = NULL", logger: TestServer.logger)
            let again = try await catchUp.run(all: true)
            #expect(again.applied == 0 && again.known == 1, "\(again)")
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    @Test("the refund catch-up stops where the history sweep does: Apple's rate limit beyond the client's wait is not asked again per account")
    func refundCatchUpStopsOnRateLimit() async throws {
        try await withBackfillApplication { http, db, base in
            let catchUp = try refundCatchUp(base, db)
            for (order, id) in [("l-1", "8900001"), ("l-2", "8900002"), ("l-3", "8900003")] {
                var purchase = TestApple.transaction(id)
                purchase.appTransactionId = "acct-\(order)"
                try await self.order(http, order, purchase)
                await standIn.setRefunds(id, [.init(revision: "r-\(id)", hasMore: false, signedTransactions: [])])
            }
            await standIn.queue([.tooManyRequests(after: .seconds(600))])
            let before = await standIn.requests
            let limited = try await catchUp.run()
            #expect(limited.failures == ["apple-api-rate-limited": 1] && limited.accounts == 0, "\(limited)")
            #expect(await standIn.requests == before + 1, "one request, not one per account")
            let after = try await catchUp.run()
            #expect(after.accounts == 3 && after.failed == 0, "the next pass reads them all: \(after)")
        }
    }
}

/// The reasons a backfill restarted, as its callback tells them.
final class Reasons: Sendable {
    private let reasons = Mutex<[String]>([])
    func add(_ reason: String) { reasons.withLock { $0.append(reason) } }
    var all: [String] { reasons.withLock { $0 } }
}
