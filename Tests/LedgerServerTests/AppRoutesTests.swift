import AppStoreStandIn
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Logging
import PostgresNIO
import Synchronization
import Testing

/// Every log line a server wrote, with its metadata, to look for what must never be logged.
final class CollectedLog: Sendable {
    let lines = Mutex<[String]>([])

    var logger: Logger {
        var logger = Logger(label: "apps-test") { _ in Handler(sink: self) }
        logger.logLevel = .trace
        return logger
    }

    var text: String { lines.withLock { $0.joined(separator: "\n") } }

    struct Handler: LogHandler {
        let sink: CollectedLog
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            let all = metadata.merging(event.metadata ?? [:]) { $1 }
            let error = event.error.map { " \(String(reflecting: $0))" } ?? ""
            sink.lines.withLock { $0.append("\(event.level) \(event.message) \(all)\(error)") }
        }
    }
}

/// The server's answer as text, to look for what must never be answered.
func rawAnswer(_ http: LedgerHTTP, _ method: HTTPRequest.Method, _ uri: String, json: Any? = nil) async throws -> (HTTPResponse.Status, String) {
    var headers: HTTPFields = [.contentType: "application/json", .authorization: "Bearer \(http.key)"]
    headers[.connection] = "keep-alive"
    let body = try json.map { ByteBuffer(bytes: try JSONSerialization.data(withJSONObject: $0)) }
    let response = try await http.client.execute(uri: uri, method: method, headers: headers, body: body)
    return (response.status, String(buffer: response.body))
}

/// Runs the application with `configuration` on `db`, logging to `log`, for `test`.
func serve(
    _ configuration: LedgerConfiguration, on db: TestDatabase, key: String, log: CollectedLog? = nil,
    _ test: @Sendable @escaping (LedgerHTTP) async throws -> Void
) async throws {
    var configuration = configuration
    configuration.port = 0
    let client = PostgresClient(configuration: db.configuration, backgroundLogger: TestServer.clientLogger)
    let application = try buildApplication(
        configuration: configuration, client: client, probing: .init(db.configuration), logger: log?.logger ?? TestServer.logger)
    try await withLiveServer(application) { http in try await test(LedgerHTTP(client: http, key: key)) }
}

@Suite("Apps are data: /v1/apps")
struct AppRoutesTests {
    /// The middle line of a PEM: the key's own bytes, which no answer or log line may hold.
    static func keyMaterial(_ pem: String) -> String {
        pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
    }

    @Test("admins add, list and change apps over HTTP; no answer and no log line holds the private key or the shared secret")
    func addListChange() async throws {
        let pem = AppStoreServerStandIn(bundleID: "com.example.game").privateKeyPEM
        let secret = "0123456789abcdef0123456789abcdef"
        let log = CollectedLog()
        try await withTestDatabase { db in
            let admin = try await APIKeyStore(database: db.database).create(name: "apps-admin", scopes: [.admin])
            // No Apple settings (the README's quickstart): the ledger holds no app.
            try await serve(LedgerConfiguration(), on: db, key: admin, log: log) { http in
                var answers: [String] = []
                let (empty, none) = try await http.send(.get, "/v1/apps")
                #expect(empty == .ok && (none["apps"] as? [Any])?.isEmpty == true)

                let (created, body) = try await rawAnswer(http, .post, "/v1/apps", json: [
                    "bundleId": "com.example.game", "appAppleId": 1_234_567_890, "sharedSecret": secret,
                    "apiKey": ["issuerId": AppStoreServerStandIn.issuerID, "keyId": "KEY1", "privateKey": pem],
                ])
                answers.append(body)
                #expect(created == .created, "\(body)")
                let app = json(ByteBuffer(string: body))
                #expect(app["bundleId"] as? String == "com.example.game" && app["appAppleId"] as? Int == 1_234_567_890)
                #expect(app["environments"] as? [String] == ["Production", "Sandbox"], "both environments by default")
                #expect(app["hasApiKey"] as? Bool == true && app["hasSharedSecret"] as? Bool == true && app["retired"] as? Bool == false)
                #expect(app["refundPreference"] is NSNull)
                let key = app["apiKey"] as? [String: Any]
                #expect(key?["keyId"] as? String == "KEY1" && key?["privateKeySource"] as? String == "stored")
                // The key is kept (where only the ledger's roles read it), just never shown.
                let stored = try await scalar(db, "SELECT api_private_key FROM app_credentials WHERE bundle_id = 'com.example.game'", as: String.self)
                #expect(stored == pem)

                let (again, exists) = try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.game"])
                #expect(again == .conflict && errorOf(exists)["code"] as? String == "app-exists")
                let (otherCase, sameApp) = try await http.send(.post, "/v1/apps", json: ["bundleId": "COM.Example.Game"])
                #expect(otherCase == .conflict && errorOf(sameApp)["code"] as? String == "app-exists", "bundle ids are the same whatever their case")
                let heldName = errorOf(sameApp)["message"] as? String ?? ""
                #expect(heldName.contains("com.example.game") && !heldName.contains("COM.Example.Game"), "named as the ledger holds it: \(heldName)")

                let (changed, changedBody) = try await rawAnswer(http, .patch, "/v1/apps/com.example.game", json: [
                    "environments": ["sandbox"], "refundPreference": "GRANT_PRORATED", "appAppleId": NSNull(), "retired": true,
                ])
                answers.append(changedBody)
                let after = json(ByteBuffer(string: changedBody))
                #expect(changed == .ok, "\(changedBody)")
                #expect(after["environments"] as? [String] == ["Sandbox"] && after["refundPreference"] as? String == "GRANT_PRORATED")
                #expect(after["appAppleId"] is NSNull && after["retired"] as? Bool == true)
                #expect(after["hasApiKey"] as? Bool == true && after["hasSharedSecret"] as? Bool == true, "what is not given stays")

                let (referenced, referencedBody) = try await rawAnswer(http, .patch, "/v1/apps/COM.EXAMPLE.GAME", json: [
                    "apiKey": ["issuerId": "issuer-2", "keyId": "KEY2", "privateKeyRef": "env:GAME_IAP_KEY"], "sharedSecret": NSNull(),
                ])
                answers.append(referencedBody)
                let viaReference = json(ByteBuffer(string: referencedBody))
                #expect(referenced == .ok && (viaReference["apiKey"] as? [String: Any])?["privateKeySource"] as? String == "env:GAME_IAP_KEY")
                #expect(viaReference["hasSharedSecret"] as? Bool == false)
                #expect(try await scalar(db, "SELECT count(*)::int FROM app_credentials WHERE api_private_key IS NOT NULL", as: Int.self) == 0,
                        "a key replaced by a reference is no longer stored")

                let (_, second) = try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.other", "environments": ["Production"]])
                #expect(second["hasApiKey"] as? Bool == false && second["apiKey"] is NSNull)
                let (listed, listBody) = try await rawAnswer(http, .get, "/v1/apps")
                answers.append(listBody)
                #expect(listed == .ok)
                let apps = json(ByteBuffer(string: listBody))["apps"] as? [[String: Any]] ?? []
                #expect(apps.map { $0["bundleId"] as? String } == ["com.example.game", "com.example.other"])
                let (cleared, noKey) = try await http.send(.patch, "/v1/apps/com.example.game", json: ["apiKey": NSNull()])
                #expect(cleared == .ok && noKey["hasApiKey"] as? Bool == false)

                for answer in answers {
                    #expect(!answer.contains(Self.keyMaterial(pem)) && !answer.contains("PRIVATE KEY") && !answer.contains(secret))
                }
            }
        }
        #expect(!log.text.isEmpty, "the server logged its requests")
        #expect(!log.text.contains(Self.keyMaterial(pem)) && !log.text.contains(secret), "no log line holds a secret")
    }

    @Test("bad input is a 400 naming the member (never repeating a private key), an unknown app a 404, and only admins may see or change apps")
    func refusals() async throws {
        try await withLiveApplication { http, db in
            try await http.send(.post, "/v1/apps", json: ["bundleId": "com.example.game"])
            let notAKey = "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5IGF0IGFsbA==\n-----END PRIVATE KEY-----"
            let cases: [(String, [String: Any], String)] = [
                ("POST", ["appAppleId": 5], "bundleId"),
                ("POST", ["bundleId": "com example game"], "bundleId"),
                ("POST", ["bundleId": ".hidden"], "bundleId"),
                ("POST", ["bundleId": "com.example.x", "appAppleId": 0], "appAppleId"),
                ("POST", ["bundleId": "com.example.x", "appAppleId": "1234"], "appAppleId"),
                ("POST", ["bundleId": "com.example.x", "appAppleId": 1.5], "appAppleId"),
                ("POST", ["bundleId": "com.example.x", "environments": ["Staging"]], "environments"),
                ("POST", ["bundleId": "com.example.x", "environments": [String]()], "environments"),
                ("POST", ["bundleId": "com.example.x", "environments": NSNull()], "environments"),
                ("POST", ["bundleId": "com.example.x", "environments": "Production"], "environments"),
                ("POST", ["bundleId": "com.example.x", "refundPreference": "MAYBE"], "refundPreference"),
                ("POST", ["bundleId": "com.example.x", "retired": "yes"], "retired"),
                ("POST", ["bundleId": "com.example.x", "colour": "blue"], "colour"),
                ("POST", ["bundleId": "com.example.x", "sharedSecret": ""], "sharedSecret"),
                ("POST", ["bundleId": "com.example.x", "sharedSecret": "  "], "sharedSecret"),
                ("POST", ["bundleId": "com.example.x", "sku": " SKU "], "sku"),
                ("POST", ["bundleId": "com.example.x", "apiKey": ["issuerId": "i", "keyId": "k", "privateKey": notAKey]], "apiKey.privateKey"),
                ("POST", ["bundleId": "com.example.x", "apiKey": ["issuerId": "i", "privateKeyRef": "env:KEY"]], "apiKey.keyId"),
                ("POST", ["bundleId": "com.example.x", "apiKey": ["issuerId": "i", "keyId": "k"]], "apiKey.privateKey"),
                ("POST", ["bundleId": "com.example.x", "apiKey": ["issuerId": "i", "keyId": "k", "privateKeyRef": "vault:x"]], "apiKey.privateKeyRef"),
                ("POST", ["bundleId": "com.example.x", "apiKey": ["issuerId": "i", "keyId": "k", "privateKeyRef": "env:1X"]], "apiKey.privateKeyRef"),
                ("POST", ["bundleId": "com.example.x", "apiKey": ["issuerId": "i", "keyId": "k", "privateKeyRef": "env:K", "privateKey": notAKey]], "apiKey.privateKeyRef"),
                ("POST", ["bundleId": "com.example.x", "apiKey": ["issuerId": "i", "keyId": "k", "privateKeyRef": "env:K", "secret": "x"]], "apiKey.secret"),
                ("PATCH", ["bundleId": "com.example.renamed"], "bundleId"),
                ("PATCH", ["retired": NSNull()], "retired"),
            ]
            for (method, body, field) in cases {
                let (status, answer) = method == "POST"
                    ? try await rawAnswer(http, .post, "/v1/apps", json: body)
                    : try await rawAnswer(http, .patch, "/v1/apps/com.example.game", json: body)
                let error = errorOf(json(ByteBuffer(string: answer)))
                #expect(status == .badRequest && error["field"] as? String == field, "\(method) \(body): \(status) \(answer)")
                #expect(!answer.contains("Array<") && !answer.contains("Dictionary<"), "JSON's names for what is expected, not Swift's: \(answer)")
                #expect(!answer.contains("bm90IGEga2V5IGF0IGFsbA"), "the private key is never repeated: \(answer)")
            }
            let (unknown, missing) = try await http.send(.patch, "/v1/apps/com.example.nothing", json: ["retired": true])
            #expect(unknown == .notFound && errorOf(missing)["code"] as? String == "unknown-app")
            let (badPath, _) = try await http.send(.patch, "/v1/apps/com%20example", json: ["retired": true])
            #expect(badPath == .badRequest)
            #expect(try await scalar(db, "SELECT count(*)::int FROM apps", as: Int.self) == 1, "nothing refused was stored")

            let reader = try await APIKeyStore(database: db.database).create(name: "reader", scopes: [.read, .append])
            for (method, uri, body) in [(HTTPRequest.Method.get, "/v1/apps", nil), (.post, "/v1/apps", ["bundleId": "com.example.y"]),
                                        (.patch, "/v1/apps/com.example.game", ["retired": true])] as [(HTTPRequest.Method, String, [String: Any]?)] {
                let (forbidden, answer) = try await http.send(method, uri, json: body, key: .some(reader))
                #expect(forbidden == .forbidden && errorOf(answer)["requiredScope"] as? String == "admin", "\(method) \(uri)")
                let (anonymous, _) = try await http.send(method, uri, json: body, key: .some(nil))
                #expect(anonymous == .unauthorized, "\(method) \(uri)")
            }
        }
    }

    @Test("the LEDGER_APPLE_* settings describe one app, created at start and updated when they change; a setting left out clears nothing")
    func configuredApp() async throws {
        let standIn = AppStoreServerStandIn(bundleID: "com.example.configured")
        let keyFile = NSTemporaryDirectory() + "iap-key-\(UUID()).p8"
        try standIn.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: keyFile) }
        try await withTestDatabase { db in
            let admin = try await APIKeyStore(database: db.database).create(name: "apps-admin", scopes: [.admin])
            var configuration = LedgerConfiguration()
            configuration.apple.bundleID = "com.example.configured"
            configuration.apple.appID = 1_234_567_890
            configuration.apple.sharedSecret = "configured-secret"
            configuration.apple.apiKeyID = AppStoreServerStandIn.keyID
            configuration.apple.apiIssuerID = AppStoreServerStandIn.issuerID
            configuration.apple.apiPrivateKeyFile = keyFile
            configuration.apple.apiURL = "http://127.0.0.1:9/"
            configuration.recoveryInterval = 0
            configuration.backfillNotificationsAtStart = false
            configuration.refundCatchUpInterval = 0
            try await serve(configuration, on: db, key: admin) { http in
                let (_, answer) = try await http.send(.get, "/v1/apps")
                let apps = answer["apps"] as? [[String: Any]] ?? []
                #expect(apps.count == 1)
                #expect(apps.first?["bundleId"] as? String == "com.example.configured" && apps.first?["appAppleId"] as? Int == 1_234_567_890)
                #expect(apps.first?["environments"] as? [String] == ["Production", "Sandbox"], "the environments the settings accept (both by default)")
                #expect(apps.first?["hasSharedSecret"] as? Bool == true)
                let key = apps.first?["apiKey"] as? [String: Any]
                #expect(key?["keyId"] as? String == AppStoreServerStandIn.keyID && key?["privateKeySource"] as? String == "file:\(keyFile)",
                        "the configured key file is referred to, not copied: \(String(describing: key))")
            }
            let first = try await scalar(db, "SELECT updated_at::text FROM apps", as: String.self)
            // Started again with the same settings: nothing changes.
            try await serve(configuration, on: db, key: admin) { _ in }
            #expect(try await scalar(db, "SELECT updated_at::text FROM apps", as: String.self) == first)
            configuration.apple.environments = [.sandbox]
            configuration.apple.appID = 42
            configuration.apple.sharedSecret = nil
            try await serve(configuration, on: db, key: admin) { http in
                let (_, answer) = try await http.send(.get, "/v1/apps")
                let app = (answer["apps"] as? [[String: Any]])?.first
                #expect(app?["environments"] as? [String] == ["Sandbox"] && app?["appAppleId"] as? Int == 42)
                #expect(app?["hasSharedSecret"] as? Bool == true, "a setting left out clears nothing")
            }
        }
    }

    @Test("a configured bundle id Apple could not have signed is named at start")
    func badConfiguredBundleID() {
        do {
            _ = try LedgerConfiguration.load([LedgerConfiguration.Key.appleBundleID: "com.example/game"])
            Issue.record("a bad bundle id was taken")
        } catch {
            #expect(error.problems.map(\.setting) == [LedgerConfiguration.Key.appleBundleID])
        }
    }

    @Test("ledger_reader sees apps through dashboards.apps only, and neither it nor ledger_writer can read an app's secrets")
    func secretsAreTheLedgersAlone() async throws {
        let pem = AppStoreServerStandIn(bundleID: "com.example.game").privateKeyPEM
        try await withLiveApplication { http, db in
            let (created, _) = try await http.send(.post, "/v1/apps", json: [
                "bundleId": "com.example.game", "sharedSecret": "s3cret",
                "apiKey": ["issuerId": "issuer", "keyId": "KEY1", "privateKey": pem],
            ])
            #expect(created == .created)
            let connection = try await db.connect()
            let log = TestServer.logger
            func sqlState(_ query: String) async -> String? {
                do {
                    try await connection.query(PostgresQuery(unsafeSQL: query), logger: log)
                    return nil
                } catch let error as PSQLError { return error.serverInfo?[.sqlState] } catch { return "\(error)" }
            }
            try await connection.query("SET ROLE ledger_reader", logger: log)
            #expect(await sqlState("SELECT api_private_key FROM public.app_credentials") == "42501")
            #expect(await sqlState("SELECT shared_secret FROM public.app_credentials") == "42501")
            #expect(await sqlState("SELECT bundle_id FROM public.apps") == "42501")
            let rows = try await connection.query("SELECT bundle_id, has_api_key, has_shared_secret FROM dashboards.apps", logger: log)
            var seen: [String] = []
            for try await (id, hasKey, hasSecret) in rows.decode((String, Bool, Bool).self) { seen.append("\(id):\(hasKey):\(hasSecret)") }
            #expect(seen == ["com.example.game:true:true"])
            try await connection.query("RESET ROLE", logger: log)
            try await connection.query("SET ROLE ledger_writer", logger: log)
            #expect(await sqlState("SELECT api_private_key FROM public.app_credentials") == "42501")
            try await connection.close()
        }
    }
}
