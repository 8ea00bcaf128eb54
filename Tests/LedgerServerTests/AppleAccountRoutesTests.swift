import AppleReceipts
import AppStoreStandIn
import Foundation
import HTTPTypes
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore
import LedgerTestSupport
import Testing

/// The Apple account link and the history sweeps, against a stand-in App Store Server API.
@Suite("Apple accounts: POST /v1/users/{userId}/app-transaction and POST /v1/recover")
struct AppleAccountRoutesTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    /// The receipts application with the API pointed at the stand-in; orders are due a sweep at once.
    func withSweepApplication(
        interval: Int = 0, _ test: @Sendable @escaping (LedgerHTTP, TestDatabase, _ standInURL: String) async throws -> Void
    ) async throws {
        try await withAppleAPIApplication(apple, standIn, configure: { configuration in
            configuration.recoveryAfter = 0
            configuration.recoveryInterval = interval
        }, test)
    }

    @discardableResult
    func link(_ http: LedgerHTTP, _ user: String, _ signed: String) async throws -> (HTTPResponse.Status, [String: Any]) {
        try await http.send(.post, "/v1/users/\(user)/app-transaction", json: ["signedAppTransaction": signed])
    }

    /// An open order of `user`, the Apple account `account` the user linked, and Apple's history
    /// of it: one page (`revision`) holding purchase `transaction`, which no client sent. Answers it.
    @discardableResult
    func openOrderWithHistory(
        _ http: LedgerHTTP, order: String, user: String, account: String, transaction: String, revision: String
    ) async throws -> SignedTransactionPayload {
        try await http.send(.post, "/v1/orders", json: newOrder(order, user: user))
        try await link(http, user, try await apple.sign(TestApple.appTransaction(account)))
        var purchase = TestApple.transaction(transaction)
        purchase.appTransactionId = account
        await standIn.setHistory(account, [.init(revision: revision, hasMore: false, signedTransactions: [try await apple.sign(purchase)])])
        return purchase
    }

    @Test("the first user to present an account owns it; again is a no-op; another user is a conflict recorded once; forged or foreign ones are 422")
    func links() async throws {
        let forged = try ThrowawaySigningChain(name: "Not Apple")
        try await withReceiptsApplication(apple) { http, db in
            let signed = try await apple.sign(TestApple.appTransaction("acct-1"))
            let (status, first) = try await link(http, "u-a", signed)
            #expect(status == .ok && first["outcome"] as? String == "linked" && first["appTransactionId"] as? String == "acct-1")
            let events = try await eventCount(db)
            let (_, again) = try await link(http, "u-a", try await apple.sign(TestApple.appTransaction("acct-1")))
            #expect(again["outcome"] as? String == "already-linked")
            #expect(try await eventCount(db) == events, "a second login appends nothing")
            let (_, other) = try await link(http, "u-b", signed)
            #expect(other["outcome"] as? String == "conflict" && other["ownerUserId"] as? String == "u-a")
            let (_, otherAgain) = try await link(http, "u-b", signed)
            #expect(otherAgain["outcome"] as? String == "conflict")
            #expect(try await eventCount(db) == events + 1, "the conflict is recorded once")
            #expect(try await scalar(db, "SELECT user_id || ' ' || conflicts FROM dashboards.apple_accounts WHERE app_transaction_id = 'acct-1'", as: String.self) == "u-a 1")
            #expect(try await scalar(db, "SELECT claimed_by FROM dashboards.apple_account_conflicts", as: String.self) == "u-b")

            let (forgedStatus, forgedError) = try await link(http, "u-a", try forged.sign(TestApple.appTransaction("acct-2")))
            #expect(forgedStatus == .unprocessableContent && errorOf(forgedError)["code"] as? String == "invalid-certificate-chain")
            let (bundleStatus, bundleError) = try await link(http, "u-a", try await apple.sign(TestApple.appTransaction("acct-2", bundleId: "com.other")))
            // An app the ledger does not hold (issue #39: proofs pick their app by what Apple signed).
            #expect(bundleStatus == .unprocessableContent && errorOf(bundleError)["code"] as? String == "unknown-app")
            let (envStatus, envError) = try await link(http, "u-a", try await apple.sign(TestApple.appTransaction("acct-2", environment: "Production")))
            #expect(envStatus == .unprocessableContent && errorOf(envError)["code"] as? String == "wrong-environment")
            let (noIDStatus, _) = try await link(http, "u-a", try await apple.sign(TestApple.appTransaction(nil)))
            #expect(noIDStatus == .unprocessableContent)
            let (missing, missingError) = try await http.send(.post, "/v1/users/u-a/app-transaction", json: [:])
            #expect(missing == .badRequest, "\(missingError)")
            #expect(try await eventCount(db) == events + 1, "nothing refused is stored")
        }
    }

    @Test("an account the ledger knows for a user by a purchase tied to an order is not linked to another: a conflict, the account stays")
    func linkAfterTie() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-alice", user: "u-alice"))
            var first = TestApple.transaction("7300011")
            first.appTransactionId = "acct-tied"
            let (_, paid) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-alice", "signedTransaction": try await apple.sign(first)])
            #expect(paid["outcome"] as? String == "matched", "\(paid)")

            let signed = try await apple.sign(TestApple.appTransaction("acct-tied"))
            let (_, bob) = try await link(http, "u-bob", signed)
            #expect(bob["outcome"] as? String == "conflict" && bob["ownerUserId"] as? String == "u-alice", "\(bob)")
            #expect(try await scalar(db, "SELECT claimed_by FROM dashboards.apple_account_conflicts", as: String.self) == "u-bob")
            // Bob's purchase from that account is held for support, not his.
            try await http.send(.post, "/v1/orders", json: newOrder("o-bob", user: "u-bob"))
            var second = TestApple.transaction("7300012")
            second.appTransactionId = "acct-tied"
            let (_, held) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-bob", "signedTransaction": try await apple.sign(second)])
            #expect(held["outcome"] as? String == "unmatched" && held["reason"] as? String == "account-conflict", "\(held)")
            // The account is linked to the user the ledger knew: hers at her next login.
            let (_, alice) = try await link(http, "u-alice", signed)
            #expect(alice["outcome"] as? String == "already-linked", "\(alice)")
            #expect(try await scalar(db, "SELECT user_id || ' ' || conflicts FROM dashboards.apple_accounts WHERE app_transaction_id = 'acct-tied'", as: String.self) == "u-alice 1")
        }
    }

    @Test("a linked account resolves the user of an orphan that came without one")
    func linkResolvesOrphan() async throws {
        try await withReceiptsApplication(apple) { http, db in
            try await http.send(.post, "/v1/orders", json: newOrder("o-linked", user: "u-linked"))
            var purchase = TestApple.transaction("7300001")
            purchase.appTransactionId = "acct-linked"
            let notification = try await apple.notification("ONE_TIME_CHARGE", transaction: purchase)
            let (_, pooled) = try await http.notifyApple(notification)
            #expect(pooled["streamId"] as? String == "transaction-7300001")
            let (_, before) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(before["paired"] as? Int == 0 && before["unknownUser"] as? Int == 1)
            let (linked, _) = try await link(http, "u-linked", try await apple.sign(TestApple.appTransaction("acct-linked")))
            #expect(linked == .ok)
            let (_, after) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(after["paired"] as? Int == 1 && after["usersResolved"] as? Int == 1)
            let (_, order) = try await http.send(.get, "/v1/orders/o-linked")
            #expect(order["state"] as? String == "verified" && order["transactionId"] as? String == "7300001")
            #expect(try await scalar(db, "SELECT count(*)::int FROM unmatched_transactions", as: Int.self) == 0)
        }
    }

    @Test("a sweep finds purchases no client sent through a 429 storm and a 500, refuses a forged one, and a second sweep ingests nothing")
    func sweeps() async throws {
        let forged = try ThrowawaySigningChain(name: "Not Apple")
        try await withSweepApplication { http, db, _ in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-gems", user: "u-s"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            try await http.send(.post, "/v1/orders", json: newOrder("o-coins", user: "u-s", product: "coins.500"))
            // Still open after the sweep: the account stays due.
            try await http.send(.post, "/v1/orders", json: newOrder("o-open", user: "u-s", product: "gems.900"))
            try await link(http, "u-s", try await apple.sign(TestApple.appTransaction("acct-s")))
            var withToken = TestApple.transaction("7400001", appAccountToken: token)
            withToken.appTransactionId = "acct-s"
            var withoutToken = TestApple.transaction("7400002", product: "coins.500")
            withoutToken.appTransactionId = "acct-s"
            await standIn.setHistory("acct-s", [
                .init(revision: "r1", hasMore: true, signedTransactions: [try await apple.sign(withToken), try forged.sign(TestApple.transaction("7400003"))]),
                .init(revision: "r2", hasMore: false, signedTransactions: [try await apple.sign(withoutToken)]),
            ])
            await standIn.queue([.tooManyRequests(after: .milliseconds(300)), .tooManyRequests(after: .milliseconds(200)), .serverError])
            let (status, summary) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(status == .ok, "\(summary)")
            #expect(summary["accounts"] as? Int == 1 && summary["pages"] as? Int == 2 && summary["transactions"] as? Int == 3)
            #expect(summary["refused"] as? Int == 1 && summary["failed"] as? Int == 0)
            #expect(summary["ingested"] as? [String: Int] == ["matched": 1, "unmatched": 1])
            let (_, gems) = try await http.send(.get, "/v1/orders/o-gems")
            #expect(gems["state"] as? String == "verified" && gems["transactionId"] as? String == "7400001")
            let (_, pass) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(pass["paired"] as? Int == 1)
            let (_, coins) = try await http.send(.get, "/v1/orders/o-coins")
            #expect(coins["state"] as? String == "verified" && coins["transactionId"] as? String == "7400002")
            // The forged entry holds the stored cursor before its page: the next sweep reads it again.
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_history_cursors WHERE account_id = 'acct-s' AND revision IS NULL", as: Int.self) == 1)

            let events = try await eventCount(db)
            let (_, again) = try await http.send(.post, "/v1/recover", json: ["userId": "u-s"])
            #expect(again["accounts"] as? Int == 1 && again["pages"] as? Int == 2 && again["transactions"] as? Int == 3, "\(again)")
            #expect(again["known"] as? Int == 2 && again["refused"] as? Int == 1)
            #expect((again["ingested"] as? [String: Int] ?? [:]).isEmpty)
            #expect(try await eventCount(db) == events, "a second sweep appends nothing")
            let queries = await standIn.historyQueries
            #expect(queries.count == 4, "two pages, twice (requests the faults answered never reach the route)")
            #expect(queries.last?["revision"] == "r1")
            #expect(queries.first?["startDate"] != nil && Set(queries.map { $0["startDate"] }).count == 1,
                    "every request repeats the start date of the first, the oldest open order's")
            // With the forged entry gone from Apple's answer, the cursor moves to the end.
            await standIn.setHistory("acct-s", [
                .init(revision: "r1", hasMore: true, signedTransactions: [try await apple.sign(withToken)]),
                .init(revision: "r2", hasMore: false, signedTransactions: [try await apple.sign(withoutToken)]),
            ])
            let (_, third) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(third["known"] as? Int == 2 && third["refused"] as? Int == 0)
            #expect(try await scalar(db, "SELECT revision FROM apple_history_cursors WHERE account_id = 'acct-s'", as: String.self) == "r2")
            #expect(try await eventCount(db) == events)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
            #expect(await standIn.refusedTokens == 0)
        }
    }

    @Test("a malformed page fails its account and keeps its cursor; two sweeps at once ingest once; a lost cursor costs a sweep that ingests nothing")
    func faultsAndRaces() async throws {
        try await withSweepApplication { http, db, base in
            try await openOrderWithHistory(http, order: "o-f", user: "u-f", account: "acct-f", transaction: "7500001", revision: "f1")
            await standIn.queue([.malformed])
            let (_, failed) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(failed["failed"] as? Int == 1 && failed["failures"] as? [String: Int] == ["apple-api-answer-malformed": 1])
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_history_cursors WHERE revision IS NOT NULL", as: Int.self) == 0)

            // Two servers' sweeps at once: the first holds the account while Apple holds its answer; the second skips it.
            var configuration = trusting(apple)
            configuration.recoveryAfter = 0
            let verifier = try configuration.apple.verifier(logger: TestServer.logger)
            let sweeps = (0..<2).map { _ in
                configuration.historySweep(
                    secondServer(db), api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base, timeout: .seconds(60)), logger: TestServer.logger), verifier: verifier)
            }
            await standIn.queue([.held])
            async let first = sweeps[0].run()
            let holding = try await standIn.untilHolding()
            #expect(holding == 1, "the first sweep's request reached Apple within 2 minutes")
            // Promise 10: a sweep waiting on Apple holds no database transaction that would keep
            // the gap-safe feed from reaching what commits meanwhile (other tests' transactions
            // on the shared cluster may hold it back a while; the sweep waits as long as needed).
            try await http.send(.post, "/v1/orders", json: newOrder("o-feed", user: "u-feed"))
            let store = EventStore(database: Database(client: db.client, logger: TestServer.logger))
            var fed = false
            for _ in 0..<2400 where !fed {
                fed = try await store.readAll(after: 0, limit: 10_000).contains { $0.streamID.rawValue == "order-o-feed" }
                if !fed { try await Task.sleep(for: .milliseconds(50)) }
            }
            #expect(fed, "the feed reached the new order while the sweep still waited on Apple")
            let second = try await sweeps[1].run()
            await standIn.release()
            let firstSummary = try await first
            #expect(second.busy == 1 && second.transactions == 0, "\(second)")
            #expect(firstSummary.ingested == ["unmatched": 1], "\(firstSummary)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events WHERE stream_id = 'transaction-7500001'", as: Int.self) == 1)
            let (_, later) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(later["busy"] as? Int == 0 && later["transactions"] as? Int == 0)
            // A lost cursor costs one full sweep, which finds the pooled purchase known.
            try await db.client.query("UPDATE apple_history_cursors SET revision = NULL", logger: TestServer.logger)
            let events = try await eventCount(db)
            let (_, full) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(full["transactions"] as? Int == 1 && full["known"] as? Int == 1 && (full["ingested"] as? [String: Int] ?? [:]).isEmpty, "\(full)")
            #expect(try await eventCount(db) == events)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [], "promise 9")
        }
    }

    @Test("a stored revision Apple no longer takes (InvalidRequestRevision): the account is read again from its start date, not failed at every sweep")
    func revisionRefused() async throws {
        try await withSweepApplication { http, db, _ in
            let first = try await openOrderWithHistory(http, order: "o-rv", user: "u-rv", account: "acct-rv", transaction: "7500101", revision: "rv1")
            let (_, swept) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(swept["failed"] as? Int == 0 && swept["transactions"] as? Int == 1, "\(swept)")
            // Apple's history of the account now has revisions the ledger never saw, and a second purchase.
            var second = TestApple.transaction("7500102", product: "gems.500")
            second.appTransactionId = "acct-rv"
            await standIn.setHistory("acct-rv", [.init(revision: "new-1", hasMore: false, signedTransactions: [try await apple.sign(first), try await apple.sign(second)])])
            let (_, again) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(again["failed"] as? Int == 0 && again["transactions"] as? Int == 2 && again["known"] as? Int == 1, "\(again)")
            #expect(try await scalar(db, "SELECT revision FROM apple_history_cursors WHERE account_id = 'acct-rv'", as: String.self) == "new-1")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE transaction_id = '7500102'", as: Int.self) == 1)
            // Refused again, and the history read from the start holds an entry that does not verify:
            // the cursor stays before that page, at the start, not at the refused revision.
            try await db.client.query("UPDATE apple_history_cursors SET revision = 'gone' WHERE account_id = 'acct-rv'", logger: TestServer.logger)
            let forged = try ThrowawaySigningChain(name: "Not Apple").sign(TestApple.transaction("7500103"))
            await standIn.setHistory("acct-rv", [.init(revision: "new-2", hasMore: false, signedTransactions: [forged])])
            let (_, held) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(held["refused"] as? Int == 1 && held["failed"] as? Int == 0, "\(held)")
            #expect(try await scalar(db, "SELECT revision FROM apple_history_cursors WHERE account_id = 'acct-rv'", as: String?.self) == .some(nil))
        }
    }

    @Test("a sweep whose lease another server took over while Apple answered stops there: it cannot renew it, and moves no cursor")
    func lostLease() async throws {
        try await withSweepApplication { http, db, base in
            try await http.send(.post, "/v1/orders", json: newOrder("o-l", user: "u-l"))
            try await link(http, "u-l", try await apple.sign(TestApple.appTransaction("acct-l")))
            var purchase = TestApple.transaction("7600001")
            purchase.appTransactionId = "acct-l"
            await standIn.setHistory("acct-l", [.init(revision: "l1", hasMore: false, signedTransactions: [try await apple.sign(purchase)])])
            var configuration = trusting(apple)
            configuration.recoveryAfter = 0
            let sweep = configuration.historySweep(
                secondServer(db), api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base, timeout: .seconds(60)), logger: TestServer.logger),
                verifier: try configuration.apple.verifier(logger: TestServer.logger))
            await standIn.queue([.held])
            async let swept = sweep.run()
            let holding = try await standIn.untilHolding()
            #expect(holding == 1, "the sweep's request reached Apple within 120 s")
            // The lease runs out while Apple holds the answer, and another server takes it.
            try await db.client.query("UPDATE leases SET expires_at = now() WHERE name = 'history-sweep/acct-l'", logger: TestServer.logger)
            let leases = Leases(database: db.database)
            let taken = try #require(try await leases.claim("history-sweep/acct-l", for: 600))
            await standIn.release()
            let summary = try await swept
            #expect(summary.pages == 1 && summary.failed == 0, "\(summary)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_history_cursors WHERE account_id = 'acct-l' AND revision IS NULL", as: Int.self) == 1,
                    "the sweep that lost its lease moved no cursor")
            #expect(try await leases.renew(taken, for: 600), "the lease is still the new holder's")
            try await leases.release(taken)
            let (_, later) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(later["transactions"] as? Int == 1 && later["known"] as? Int == 1, "what the first sweep took in is known: \(later)")
            #expect(try await scalar(db, "SELECT revision FROM apple_history_cursors WHERE account_id = 'acct-l'", as: String.self) == "l1")
        }
    }

    @Test("in a sweep a purchase's token decides its order, even another user's; a revoked one is left out; without roots nothing moves")
    func tokensRevocationsAndRoots() async throws {
        try await withSweepApplication { http, db, base in
            try await http.send(.post, "/v1/orders", json: newOrder("o-x", user: "u-x"))
            let (_, other) = try await http.send(.post, "/v1/orders", json: newOrder("o-y", user: "u-y"))
            let token = try #require((other["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            try await link(http, "u-x", try await apple.sign(TestApple.appTransaction("acct-x")))
            var theirs = TestApple.transaction("7700001", appAccountToken: token)
            theirs.appTransactionId = "acct-x"
            var refunded = TestApple.transaction("7700002")
            refunded.appTransactionId = "acct-x"
            refunded.revocationDate = Date().millisecondsSince1970
            refunded.revocationReason = 0
            await standIn.setHistory("acct-x", [.init(revision: "x1", hasMore: false, signedTransactions: [
                try await apple.sign(theirs), try await apple.sign(refunded),
            ])])
            let (_, swept) = try await http.send(.post, "/v1/recover", json: ["userId": "u-x"])
            #expect(swept["ingested"] as? [String: Int] == ["matched": 1] && swept["revoked"] as? Int == 1, "\(swept)")
            let (_, theirOrder) = try await http.send(.get, "/v1/orders/o-y")
            #expect(theirOrder["state"] as? String == "verified" && theirOrder["transactionId"] as? String == "7700001")
            let (_, pass) = try await http.send(.post, "/v1/reconcile", raw: "")
            #expect(pass["paired"] as? Int == 0)
            let (_, mine) = try await http.send(.get, "/v1/orders/o-x")
            #expect(mine["state"] as? String == "created", "u-x's order takes neither u-y's purchase nor the refunded one")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE transaction_id = '7700002'", as: Int.self) == 0)

            // A server with the API key but no Apple roots: no account's cursor moves.
            try await http.send(.post, "/v1/orders", json: newOrder("o-z", user: "u-z"))
            try await link(http, "u-z", try await apple.sign(TestApple.appTransaction("acct-z")))
            await standIn.setHistory("acct-z", [.init(revision: "z1", hasMore: false, signedTransactions: [try await apple.sign(TestApple.transaction("7700003"))])])
            var configuration = LedgerConfiguration()
            configuration.apple.bundleID = TestApple.bundleId
            configuration.apple.environments = [.sandbox]
            configuration.recoveryAfter = 0
            let sweep = configuration.historySweep(
                secondServer(db), api: LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base), logger: TestServer.logger),
                verifier: try configuration.apple.verifier(logger: TestServer.logger))
            let blind = try await sweep.run(user: UserID("u-z"))
            #expect(blind.failed == 1 && blind.failures == ["verification-unavailable": 1] && blind.stoppedBy == "verification-unavailable", "\(blind)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_history_cursors WHERE account_id = 'acct-z' AND revision IS NULL AND NOT EXISTS (SELECT FROM leases WHERE name = 'history-sweep/acct-z')", as: Int.self) == 1)
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE transaction_id = '7700003'", as: Int.self) == 0)
        }
    }

    @Test("a sweep's signed transaction that a backend claimed, unverified, for an order of another product: the claim is taken back, the order its token names takes it")
    func sweepTakesBackAClaim() async throws {
        try await withSweepApplication { http, db, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-claimed", user: "u-c"))
            var own = receipt("7400050")
            own["purchaseDate"] = ISO8601DateFormatter().string(from: Date())
            let (claimed, _) = try await http.send(.post, "/v1/orders/o-claimed/events", json: ["type": "receipt-received", "data": own])
            #expect(claimed == .created)
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-500", user: "u-c", product: "gems.500"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            try await link(http, "u-c", try await apple.sign(TestApple.appTransaction("acct-c")))
            var purchase = TestApple.transaction("7400050", product: "gems.500", appAccountToken: token)
            purchase.appTransactionId = "acct-c"
            await standIn.setHistory("acct-c", [.init(revision: "c1", hasMore: false, signedTransactions: [try await apple.sign(purchase)])])
            let (_, summary) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(summary["known"] as? Int == 0 && summary["ingested"] as? [String: Int] == ["matched": 1], "\(summary)")
            #expect(try await scalar(db, "SELECT state || ' ' || coalesce(failure_reason, '') FROM orders WHERE order_id = 'o-claimed'", as: String.self)
                == "failed product-mismatch")
            let (_, paid) = try await http.send(.get, "/v1/orders/o-500")
            #expect(paid["state"] as? String == "verified" && paid["transactionId"] as? String == "7400050", "\(paid)")
            let events = try await eventCount(db)
            let (_, again) = try await http.send(.post, "/v1/recover", json: ["userId": "u-c"])
            #expect((again["ingested"] as? [String: Int] ?? [:]).isEmpty, "\(again)")
            #expect(try await eventCount(db) == events)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a sweep finds a subscription's later period a backend claimed for an order, unverified: the claim is taken back, the period recorded on its subscription")
    func sweepTakesBackARenewalClaim() async throws {
        try await withSweepApplication { http, db, _ in
            let now = Date()
            // An order the user abandoned, which the sweep is for, of the same product: it stays open.
            try await http.send(.post, "/v1/orders", json: newOrder("o-abandoned", user: "u-r", product: "pro.monthly"))
            try await http.send(.post, "/v1/orders", json: newOrder("o-start", user: "u-r", product: "pro.monthly"))
            var start = TestApple.subscriptionPeriod("7400060", of: "7400060", purchaseDate: now, expires: now + 30 * 86_400)
            start.appTransactionId = "acct-r"
            let (_, started) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-start", "signedTransaction": try await apple.sign(start)])
            #expect(started["outcome"] as? String == "matched", "\(started)")
            try await http.send(.post, "/v1/orders", json: newOrder("o-claims", user: "u-r", product: "pro.monthly"))
            var own = receipt("7400061", product: "pro.monthly")
            own["purchaseDate"] = ISO8601DateFormatter().string(from: Date())
            let (claimed, _) = try await http.send(.post, "/v1/orders/o-claims/events", json: ["type": "receipt-received", "data": own])
            #expect(claimed == .created)
            try await link(http, "u-r", try await apple.sign(TestApple.appTransaction("acct-r")))
            var renewal = TestApple.subscriptionPeriod("7400061", of: "7400060", purchaseDate: Date(), expires: now + 60 * 86_400)
            renewal.appTransactionId = "acct-r"
            await standIn.setHistory("acct-r", [.init(revision: "r1", hasMore: false, signedTransactions: [try await apple.sign(start), try await apple.sign(renewal)])])
            let (_, summary) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(summary["known"] as? Int == 1 && summary["ingested"] as? [String: Int] == ["recorded": 1], "\(summary)")
            let (_, order) = try await http.send(.get, "/v1/orders/o-claims")
            #expect(order["state"] as? String == "created" && order["transactionId"] is NSNull, "\(order)")
            let (_, abandoned) = try await http.send(.get, "/v1/orders/o-abandoned")
            #expect(abandoned["state"] as? String == "created", "\(abandoned)")
            #expect(try await scalar(db, "SELECT status FROM apple_transactions WHERE transaction_id = '7400061' AND order_id IS NULL", as: String.self) == "renewal")
            #expect(try await scalar(db, "SELECT count(*)::int FROM subscription_periods WHERE original_transaction_id = '7400060'", as: Int.self) == 2)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a user with neither a linked account nor an appTransactionId is swept by one transaction of each environment")
    func fallbackPerEnvironment() async throws {
        try await withReceiptsApplication(apple, configure: bothEnvironments) { http, db in
            // Two purchases a backend claimed, one in each environment, with no Apple account.
            for (order, id, environment) in [("o-fp-1", "9300001", "Sandbox"), ("o-fp-2", "9300002", "Production")] {
                try await http.send(.post, "/v1/orders", json: newOrder(order, user: "u-fp"))
                let claim = receipt(id).merging(["environment": environment, "purchaseDate": ISO8601DateFormatter().string(from: Date())]) { $1 }
                let (status, answer) = try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "receipt-received", "data": claim])
                #expect(status == .created, "\(answer)")
            }
            try await http.send(.post, "/v1/orders", json: newOrder("o-fp-open", user: "u-fp"))
            let due = try await HistoryCursors(database: db.database).dueAccounts(user: UserID("u-fp"), openFor: 0)
            #expect(due.map { "\($0.id) \($0.environment ?? "-")" }.sorted() == ["9300001 Sandbox", "9300002 Production"], "\(due)")
        }
    }

    @Test("a backend's claim naming an Apple account keeps no verified transaction of the user from being swept; what Apple signed is asked before a claim; a pooled one counts")
    func claimedAccountLeavesTheFallback() async throws {
        try await withReceiptsApplication(apple) { http, db in
            // A claim naming an Apple account Apple may not know (a mistyped id), and an earlier one naming none.
            for (order, id, account, bought) in [("o-fc-1", "9310001", "acct-typo", -600.0), ("o-fc-3", "9310003", nil, -3_600)] {
                try await http.send(.post, "/v1/orders", json: newOrder(order, user: "u-fc"))
                var claim = receipt(id).merging(["environment": "Sandbox", "purchaseDate": ISO8601DateFormatter().string(from: Date(timeIntervalSinceNow: bought))]) { $1 }
                claim["appTransactionId"] = account
                let (status, answer) = try await http.send(.post, "/v1/orders/\(order)/events", json: ["type": "receipt-received", "data": claim])
                #expect(status == .created, "\(answer)")
            }
            // A purchase Apple signed, of an older StoreKit (no appTransactionId).
            try await http.send(.post, "/v1/orders", json: newOrder("o-fc-2", user: "u-fc"))
            var signed = TestApple.transaction("9310002")
            signed.appTransactionId = nil
            let (_, verified) = try await http.send(.post, "/v1/receipts", json: ["orderId": "o-fc-2", "signedTransaction": try await apple.sign(signed)])
            #expect(verified["outcome"] as? String == "matched", "\(verified)")
            try await http.send(.post, "/v1/orders", json: newOrder("o-fc-open", user: "u-fc"))
            let due = try await HistoryCursors(database: db.database).dueAccounts(user: UserID("u-fc"), openFor: 0)
            #expect(due.map(\.id).sorted() == ["9310002", "acct-typo"], "the claim's account, and the user's own by what Apple signed: \(due)")

            // A user whose only transaction waits in the pool (no appTransactionId) is swept by it.
            try await http.send(.post, "/v1/orders", json: newOrder("o-fp-open", user: "u-fpool", product: "gems.500"))
            var pooled = TestApple.transaction("9310004")
            pooled.appTransactionId = nil
            let (_, unmatched) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-fpool", "signedTransaction": try await apple.sign(pooled)])
            #expect(unmatched["outcome"] as? String == "unmatched", "\(unmatched)")
            let poolDue = try await HistoryCursors(database: db.database).dueAccounts(user: UserID("u-fpool"), openFor: 0)
            #expect(poolDue.map(\.id) == ["9310004"], "\(poolDue)")
        }
    }

    @Test("ledger serve sweeps on its own every LEDGER_RECOVERY_INTERVAL seconds")
    func sweepsInTheBackground() async throws {
        try await withSweepApplication(interval: 1) { http, _, _ in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-bg", user: "u-bg"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            try await link(http, "u-bg", try await apple.sign(TestApple.appTransaction("acct-bg")))
            var purchase = TestApple.transaction("7600001", appAccountToken: token)
            purchase.appTransactionId = "acct-bg"
            await standIn.setHistory("acct-bg", [.init(revision: "b1", hasMore: false, signedTransactions: [try await apple.sign(purchase)])])
            var state: String?
            for _ in 0..<1200 where state != "verified" {
                try await Task.sleep(for: .milliseconds(100))
                state = try await http.send(.get, "/v1/orders/o-bg").1["state"] as? String
            }
            #expect(state == "verified", "the background sweep found the purchase within 2 minutes")
        }
    }

    @Test("without an API key POST /v1/recover answers 503 apple-api-not-configured")
    func notConfigured() async throws {
        try await withReceiptsApplication(apple) { http, _ in
            let (status, error) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(status == .serviceUnavailable && errorOf(error)["code"] as? String == "apple-api-not-configured")
        }
    }

    @Test("a page that says more follow but names the position it was asked from again ends each reader of Apple's pages after that page, as a failure")
    func unmovedPosition() async throws {
        try await withSweepApplication { http, db, base in
            let (_, created) = try await http.send(.post, "/v1/orders", json: newOrder("o-u", user: "u-u"))
            let token = try #require((created["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            try await http.send(.post, "/v1/orders", json: newOrder("o-u2", user: "u-u", product: "gems.900"))
            try await link(http, "u-u", try await apple.sign(TestApple.appTransaction("acct-u")))
            var purchase = TestApple.transaction("7800001", appAccountToken: token)
            purchase.appTransactionId = "acct-u"
            let stuck = { (signed: [String]) in
                [AppStoreServerStandIn.Page(revision: "same", hasMore: true, signedTransactions: signed),
                 .init(revision: "same", hasMore: true, signedTransactions: [])]
            }
            await standIn.setHistory("acct-u", stuck([try await apple.sign(purchase)]))
            var asked = await standIn.requests
            let (status, sweep) = try await http.send(.post, "/v1/recover", raw: "")
            #expect(status == .ok && sweep["pages"] as? Int == 2 && sweep["failures"] as? [String: Int] == ["apple-api-position-unmoved": 1], "\(sweep)")
            #expect(await standIn.requests - asked == 2, "no third request for the same page")
            let (_, order) = try await http.send(.get, "/v1/orders/o-u")
            #expect(order["state"] as? String == "verified", "the page's purchase is taken in all the same")

            await standIn.setHistory("7800001", stuck([try await apple.sign(purchase)]))
            asked = await standIn.requests
            let (refreshed, refusal) = try await http.send(.get, "/v1/subscriptions/7800001?refresh=true")
            #expect(refreshed == .badGateway && errorOf(refusal)["code"] as? String == "apple-api-position-unmoved", "\(refusal)")
            #expect(await standIn.requests - asked == 2)

            let api = LazyAppStoreServerAPI(settings: standIn.settings(baseURL: base), logger: TestServer.logger)
            let configuration = trusting(apple)
            let verifier = try configuration.apple.verifier(logger: TestServer.logger)
            await standIn.setRefunds("7800001", stuck([]))
            asked = await standIn.requests
            let refunds = try await configuration.refundCatchUp(secondServer(db), api: api, verifier: verifier).run(all: true)
            #expect(refunds.pages == 2 && refunds.failures == ["apple-api-position-unmoved": 1], "\(refunds)")
            #expect(await standIn.requests - asked == 2)

            await standIn.setNotifications(stuck([]))
            asked = await standIn.requests
            let backfill = try await secondServer(db).notificationBackfill(api: api, verifier: verifier).run(since: Date(timeIntervalSinceNow: -3600))
            #expect(backfill.pages == 2 && backfill.refusal?.contains("named the position it was asked from (same) again") == true, "\(backfill)")
            #expect(await standIn.requests - asked == 2)
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_notification_backfill WHERE abandoned_at IS NOT NULL", as: Int.self) == 1,
                    "the next run asks afresh")
        }
    }
}
