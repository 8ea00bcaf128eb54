import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerCore
@testable import LedgerServer
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// Two apps and keys scoped to them (issue 39, "Keys are scoped to apps").
enum TwoApps {
    static let alpha = "com.example.alpha"
    static let beta = "com.example.beta"

    /// Adds both apps to the ledger of `db`.
    static func add(_ db: TestDatabase) async throws {
        let catalog = AppCatalog(database: db.database)
        for app in [alpha, beta] { _ = try await catalog.add(try BundleID(app), AppChanges()) }
    }
}

@Suite("API keys scoped to apps over HTTP")
struct KeyAppsTests {
    @Test("a key names the apps it reaches as the ledger spells them, every app by default; an unknown app is refused")
    func keysStoreTheirApps() async throws {
        try await withTestDatabase { db in
            try await TwoApps.add(db)
            let keys = APIKeyStore(database: db.database)
            _ = try await keys.create(name: "alpha-backend", scopes: [.append, .read], apps: [try BundleID("COM.Example.Alpha")])
            _ = try await keys.create(name: "platform", scopes: [.admin])
            let listed = Dictionary(uniqueKeysWithValues: try await keys.list().map { ($0.name, $0) })
            #expect(listed["alpha-backend"]?.apps == [BundleID(unchecked: TwoApps.alpha)], "stored as the apps table spells it")
            #expect(listed["platform"]?.apps == nil, "no apps named: every app, those added later too")
            await #expect(throws: APIKeyError.unknownApps(["com.example.gamma"])) {
                try await keys.create(name: "gamma", scopes: [.read], apps: [try BundleID(TwoApps.beta), try BundleID("com.example.gamma")])
            }
            await #expect(throws: APIKeyError.noApps) { try await keys.create(name: "none", scopes: [.read], apps: []) }
            #expect(try await keys.list().map(\.name) == ["alpha-backend", "platform"], "nothing refused was stored")
        }
    }

    @Test("the global feed, changes to apps and admin's work on every app need a key of every app; GET /v1/apps shows a key its apps")
    func everyAppRoutes() async throws {
        try await withLiveApplication { http, db in
            try await TwoApps.add(db)
            let scoped = try await APIKeyStore(database: db.database).create(name: "alpha-admin", scopes: [.admin], apps: [try BundleID(TwoApps.alpha)])
            let refused: [(HTTPRequest.Method, String, [String: Any]?)] = [
                (.get, "/v1/events", nil), (.get, "//v1/events/", nil), (.post, "/v1/apps", ["bundleId": "com.example.gamma"]),
                (.patch, "/v1/apps/\(TwoApps.beta)", ["retired": true]), (.patch, "/v1/apps/\(TwoApps.alpha)", ["retired": true]),
                (.post, "/v1/reconcile", nil), (.post, "/v1/recover", [String: Any]()), (.post, "/v1/apple-orders/MQ1N2CD3EF/lookup", [String: Any]()),
            ]
            for (method, uri, body) in refused {
                let (status, answer) = try await http.send(method, uri, json: body, key: .some(scoped))
                #expect(status == .forbidden && errorOf(answer)["code"] as? String == "all-apps-key-required", "\(method) \(uri): \(status) \(answer)")
                #expect(errorOf(answer)["apps"] as? [String] == [TwoApps.alpha])
            }
            #expect(try await scalar(db, "SELECT count(*)::int FROM apps WHERE retired OR bundle_id = 'com.example.gamma'", as: Int.self) == 0)
            let (listed, apps) = try await http.send(.get, "/v1/apps", key: .some(scoped))
            #expect(listed == .ok && (apps["apps"] as? [[String: Any]])?.map { $0["bundleId"] as? String } == [TwoApps.alpha])
            // The same routes with a key of every app.
            let (feed, _) = try await http.send(.get, "/v1/events")
            #expect(feed == .ok)
            let (all, every) = try await http.send(.get, "/v1/apps")
            #expect(all == .ok && (every["apps"] as? [[String: Any]])?.map { $0["bundleId"] as? String } == [TwoApps.alpha, TwoApps.beta])
            let (changed, _) = try await http.send(.patch, "/v1/apps/\(TwoApps.beta)", json: ["retired": true])
            #expect(changed == .ok)
        }
    }

    @Test("a proof Apple signed for an app the key does not reach is refused with 403 app-not-allowed, and nothing is stored")
    func proofsOfAnotherApp() async throws {
        let apple = try TestApple()
        try await withReceiptsApplication(apple) { http, db in
            _ = try await AppCatalog(database: db.database).add(try BundleID(TwoApps.alpha), AppChanges())
            let keys = APIKeyStore(database: db.database)
            let alphaOnly = try await keys.create(name: "alpha-backend", scopes: [.append, .read], apps: [try BundleID(TwoApps.alpha)])
            let ledgerTests = try await keys.create(name: "tests-backend", scopes: [.append, .read], apps: [try BundleID(TestApple.bundleId)])
            let signed = try await apple.sign(TestApple.transaction("9100001"))
            let (refused, answer) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": signed], key: .some(alphaOnly))
            #expect(refused == .forbidden && errorOf(answer)["code"] as? String == "app-not-allowed", "\(refused) \(answer)")
            #expect(errorOf(answer)["bundleId"] as? String == TestApple.bundleId)
            let account = try await apple.sign(TestApple.appTransaction("account-1"))
            let (notLinked, linkAnswer) = try await http.send(
                .post, "/v1/users/u-1/app-transaction", json: ["signedAppTransaction": account], key: .some(alphaOnly))
            #expect(notLinked == .forbidden && errorOf(linkAnswer)["code"] as? String == "app-not-allowed", "\(notLinked) \(linkAnswer)")
            #expect(try await scalar(db, "SELECT count(*)::int FROM events", as: Int.self) == 0, "nothing refused was stored")

            // The app's own key sends them.
            let (pooled, taken) = try await http.send(.post, "/v1/receipts", json: ["userId": "u-1", "signedTransaction": signed], key: .some(ledgerTests))
            #expect(pooled == .ok && taken["outcome"] as? String == "unmatched", "\(taken)")
            let (linked, _) = try await http.send(.post, "/v1/users/u-1/app-transaction", json: ["signedAppTransaction": account], key: .some(ledgerTests))
            #expect(linked == .ok)
        }
    }

    @Test("a proof of an app the key does not reach is refused alike whether the ledger holds that app or not, before its app is checked")
    func proofsOfAppsBeyondReach() async throws {
        let apple = try TestApple()
        let purchase = Int64(Date().timeIntervalSince1970 * 1000) - 60_000
        let standIn = VerifyReceiptStandIn(answers: [
            "production:TESTS": VerifyReceiptStandIn.valid(transactions: [("9100031", "gems.100", purchase)]),
            "production:STRANGER": VerifyReceiptStandIn.valid(bundleId: "com.example.gamma", transactions: [("9100032", "gems.100", purchase)]),
        ])
        try await standIn.run { production, sandbox in
            try await withReceiptsApplication(apple, production: production, sandbox: sandbox, configure: { $0.apple.sharedSecret = "secret-of-tests" }) { http, db in
                // Both apps hold a shared secret: a receipt is first asked with none, then again
                // with its own app's, which a key of another app never has it asked with.
                _ = try await AppCatalog(database: db.database).add(try BundleID(TwoApps.alpha), AppChanges(sharedSecret: "secret-of-alpha"))
                let alphaOnly = try await APIKeyStore(database: db.database).create(
                    name: "alpha-backend", scopes: [.append, .read], apps: [try BundleID(TwoApps.alpha)])
                // Another app's proof would be told apart by its app's checks: one the ledger does
                // not hold (unknown-app), one signed in an environment its app refuses (the tests'
                // app takes the sandbox alone: wrong-environment).
                let gamma = "com.example.gamma"
                let proofs: [(String, [String: Any], String)] = [
                    ("/v1/receipts", ["userId": "u-1", "signedTransaction": try await apple.sign(TestApple.transaction("9100021", bundleId: gamma))], gamma),
                    ("/v1/receipts", ["userId": "u-1", "signedTransaction": try await apple.sign(TestApple.transaction("9100022", environment: "Production"))], TestApple.bundleId),
                    ("/v1/receipts", ["userId": "u-1", "receiptData": "STRANGER"], gamma),
                    ("/v1/receipts", ["userId": "u-1", "receiptData": "TESTS"], TestApple.bundleId),
                    ("/v1/users/u-1/app-transaction", ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("account-2", bundleId: gamma))], gamma),
                    ("/v1/users/u-1/app-transaction", ["signedAppTransaction": try await apple.sign(TestApple.appTransaction("account-3", environment: "Production"))], TestApple.bundleId),
                ]
                for (route, body, app) in proofs {
                    let (status, answer) = try await http.send(.post, route, json: body, key: .some(alphaOnly))
                    #expect(status == .forbidden && errorOf(answer)["code"] as? String == "app-not-allowed", "\(route) \(app): \(status) \(answer)")
                    #expect(errorOf(answer)["bundleId"] as? String == app, "\(answer)")
                }
                #expect(try await scalar(db, "SELECT count(*)::int FROM events", as: Int.self) == 0, "nothing refused was stored")
            }
        }
        // Each receipt was asked once, with no secret: not again with its own app's for a key that cannot have it.
        #expect(await standIn.calls("production:TESTS") == 1)
        #expect(await standIn.calls("production:STRANGER") == 1)
        #expect(await standIn.calls("password:secret-of-tests") == 0)
    }

    @Test("a proof of the key's app naming another app's order, by id or token, is answered as for an order that does not exist")
    func proofNamingAnotherAppsOrder() async throws {
        let apple = try TestApple()
        try await withReceiptsApplication(apple) { http, db in
            _ = try await AppCatalog(database: db.database).add(try BundleID(TwoApps.alpha), AppChanges())
            let (_, order) = try await http.send(.post, "/v1/orders", json: newOrder("alpha-order", user: "u-a").merging(["bundleId": TwoApps.alpha]) { $1 })
            let token = try #require((order["appAccountToken"] as? String).flatMap(UUID.init(uuidString:)))
            let own = try await APIKeyStore(database: db.database).create(
                name: "tests-backend", scopes: [.append, .read], apps: [try BundleID(TestApple.bundleId)])
            func answer(_ body: [String: Any], key: String? = nil) async throws -> [String: Any] {
                let (status, answer) = try await http.send(.post, "/v1/receipts", json: body, key: key.map { .some($0) } ?? .none)
                #expect(status == .ok, "\(answer)")
                return answer
            }
            // Named by id, with the right user or a guessed one: unknown-order, nothing of it shown.
            for (id, user) in [("9100011", "u-a"), ("9100012", "u-guess")] {
                let seen = try await answer(["orderId": "alpha-order", "userId": user, "signedTransaction": try await apple.sign(TestApple.transaction(id))], key: own)
                #expect(seen["outcome"] as? String == "unmatched" && seen["reason"] as? String == "unknown-order", "\(seen)")
                #expect(seen["orderId"] is NSNull && seen["state"] is NSNull, "\(seen)")
            }
            // Named by its token: as a transaction whose token names no order.
            let tokened = try await apple.sign(TestApple.transaction("9100013", appAccountToken: token))
            let byToken = try await answer(["signedTransaction": tokened], key: own)
            #expect(byToken["outcome"] as? String == "unmatched" && byToken["reason"] as? String == "no-order" && byToken["orderId"] is NSNull, "\(byToken)")
            // A key of every app (the client's own) still learns why: the order is another app's.
            let all = try await answer(["orderId": "alpha-order", "userId": "u-a", "signedTransaction": try await apple.sign(TestApple.transaction("9100014"))])
            #expect(all["reason"] as? String == "app-mismatch", "\(all)")
            let (_, untouched) = try await http.send(.get, "/v1/orders/alpha-order")
            #expect(untouched["state"] as? String == "created", "\(untouched)")
        }
    }
}
