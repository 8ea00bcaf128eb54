import Foundation
import Hummingbird
import HTTPTypes
import HummingbirdTesting
@testable import LedgerServer
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("API keys and scopes over HTTP")
struct AuthTests {
    @Test("the key and scope matrix: 401 without or with a bad key, 403 without the scope")
    func matrix() async throws {
        try await withLiveApplication { http, db in
            let keys = APIKeyStore(database: db.database)
            let reader = try await keys.create(name: "dashboard", scopes: [.read])
            let writer = try await keys.create(name: "game-backend", scopes: [.append])
            let revoked = try await keys.create(name: "old", scopes: [.append, .read])
            #expect(try await keys.revoke(name: "old"))
            #expect(try await keys.revoke(name: "old") == false)

            let create: [String: Any] = newOrder("o-1")
            for (key, status) in [(nil, HTTPResponse.Status.unauthorized), ("ol_unknown", .unauthorized), (revoked, .unauthorized), (reader, .forbidden)] as [(String?, HTTPResponse.Status)] {
                let (answer, json) = try await http.send(.post, "/v1/orders", json: create, key: .some(key))
                #expect(answer == status, "key \(String(describing: key))")
                #expect(errorOf(json)["code"] as? String == (status == .unauthorized ? "unauthorized" : "forbidden"))
            }
            let (created, _) = try await http.send(.post, "/v1/orders", json: create, key: .some(writer))
            #expect(created == .created)
            let (writerReads, readError) = try await http.send(.get, "/v1/orders/o-1", key: .some(writer))
            #expect(writerReads == .forbidden)
            #expect(errorOf(readError)["requiredScope"] as? String == "read")
            let (readerReads, order) = try await http.send(.get, "/v1/orders/o-1", key: .some(reader))
            #expect(readerReads == .ok)
            // The appending key's name is recorded with the event.
            let metadata = (order["events"] as? [[String: Any]])?.first?["metadata"] as? [String: Any]
            #expect(metadata?["appendedBy"] as? String == "game-backend")
            let (adminReads, _) = try await http.send(.get, "/v1/events")
            #expect(adminReads == .ok)
            let (malformed, _) = try await http.send(.get, "/v1/orders/o-1", key: .some(""))
            #expect(malformed == .unauthorized)
            // The scheme's name in any case (RFC 9110); another scheme is no key.
            for (scheme, status) in [("bearer", HTTPResponse.Status.ok), ("BEARER", .ok), ("Basic", .unauthorized), ("Bearerx", .unauthorized)] {
                let response = try await http.client.execute(uri: "/v1/orders/o-1", method: .get, headers: [.authorization: "\(scheme) \(reader)"])
                #expect(response.status == status, "\(scheme)")
            }
            var twice = HTTPFields()
            twice.append(HTTPField(name: .authorization, value: "Bearer \(reader)"))
            twice.append(HTTPField(name: .authorization, value: "Bearer \(reader)"))
            let doubled = try await http.client.execute(uri: "/v1/orders/o-1", method: .get, headers: twice)
            #expect(doubled.status == .unauthorized)
            #expect(String(buffer: doubled.body).contains("send one Authorization header"), "not an unknown key: \(String(buffer: doubled.body))")
            // Health needs no key.
            let health = try await http.client.execute(uri: "/healthz", method: .get)
            #expect(health.status == .ok)
            #expect(try await keys.list().map(\.name) == ["dashboard", "game-backend", "old", "test-admin"])
        }
    }

    @Test("paths with empty segments need the same key as the route they reach")
    func noBypassThroughSlashes() async throws {
        try await withLiveApplication { http, _ in
            try await http.send(.post, "/v1/orders", json: newOrder("o-1"))
            for (method, uri) in [(HTTPRequest.Method.post, "//v1/orders"), (.get, "//v1/orders/o-1"), (.get, "/v1//events"),
                                  (.get, "//v1//orders/o-1/"), (.post, "/v1/orders/o-1//events"), (.get, "/v1")] {
                let (status, json) = try await http.send(method, uri, json: method == .post ? newOrder("o-2") : nil, key: .some(nil))
                #expect(status == .unauthorized, "\(method) \(uri)")
                #expect(errorOf(json)["code"] as? String == "unauthorized")
            }
            #expect(AuthMiddleware.requiredScope(.post, "/v1/transactions/t-1/match/") == .admin)
            #expect(AuthMiddleware.requiredScope(.post, "//v1/reconcile") == .admin)
            #expect(AuthMiddleware.requiredScope(.get, "/healthz") == nil)
            #expect(AuthMiddleware.requiredScope(.post, "/v1//notifications/apple/") == nil)
            // Each app's own notification URL is Apple's too (issue #39); anything deeper needs a key.
            #expect(AuthMiddleware.requiredScope(.post, "/v1/notifications/apple/com.example.game") == nil)
            #expect(AuthMiddleware.requiredScope(.post, "/v1/notifications/apple/x/y") == .append)
            #expect(AuthMiddleware.requiredScope(.post, "/v1/reconcile/x") == .append)
        }
    }

    @Test("keys are stored hashed, never in clear")
    func hashedOnly() async throws {
        try await withTestDatabase { db in
            let key = try await APIKeyStore(database: db.database).create(name: "k", scopes: [.read])
            #expect(key.hasPrefix("ol_") && key.count == 67)
            let rows = try await db.client.query("SELECT count(*) FROM api_keys WHERE key_hash = \(key) OR name = \(key)", logger: TestServer.logger)
            for try await count in rows.decode(Int.self) { #expect(count == 0) }
            await #expect(throws: APIKeyError.nameTaken("k")) { try await APIKeyStore(database: db.database).create(name: "k", scopes: [.read]) }
        }
    }
}
