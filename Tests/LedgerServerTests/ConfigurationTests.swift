import AppleReceipts
import AppStoreStandIn
import Foundation
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("Configuration")
struct ConfigurationTests {
    @Test("defaults: private cluster under ./.ledger, 127.0.0.1:8080")
    func defaults() throws {
        let configuration = try LedgerConfiguration.load([:])
        #expect(configuration.database == .privateCluster(dataDirectory: "./.ledger"))
        #expect(configuration.host == "127.0.0.1")
        #expect(configuration.port == 8080)
        #expect(configuration.apple.environments == [.production, .sandbox], "App Review's sandbox purchases are accepted in production")
    }

    @Test("LEDGER_APPLE_ACCOUNT_TOKENS: order or user, in any case; left out, the app keeps its own; anything else names the setting")
    func accountTokens() throws {
        typealias Key = LedgerConfiguration.Key
        #expect(try LedgerConfiguration.load([:]).apple.appAccountTokens == nil)
        #expect(try LedgerConfiguration.load([Key.appleAccountTokens: "User"]).apple.appAccountTokens == .user)
        #expect(try LedgerConfiguration.load([Key.appleAccountTokens: "order"]).apple.appAccountTokens == .order)
        do {
            _ = try LedgerConfiguration.load([Key.appleAccountTokens: "account"])
            Issue.record("account was accepted")
        } catch {
            #expect(error.problems.map(\.setting) == [Key.appleAccountTokens] && error.description.contains("order or user"), "\(error)")
        }
    }

    @Test("LEDGER_APPLE_ENVIRONMENT: a comma-separated list in any case; anything else names the setting")
    func environmentList() throws {
        typealias Key = LedgerConfiguration.Key
        func environments(_ text: String) throws -> [AppleEnvironment] {
            try LedgerConfiguration.load([Key.appleEnvironment: text]).apple.environments
        }
        #expect(try environments("Production") == [.production])
        #expect(try environments("sandbox") == [.sandbox])
        #expect(try environments("PRODUCTION, Sandbox") == [.production, .sandbox])
        #expect(try environments("Sandbox,Production,sandbox") == [.sandbox, .production])
        for bad in ["Staging", "Production,Xcode", "LocalTesting", ",", "Production;Sandbox"] {
            do {
                _ = try LedgerConfiguration.load([Key.appleEnvironment: bad])
                Issue.record("\(bad) was accepted")
            } catch {
                #expect(error.problems.map(\.setting) == [Key.appleEnvironment], "\(bad): \(error)")
                #expect(error.description.contains("Production,Sandbox"), "\(error)")
            }
        }
        // The verifier takes the list; the API's host is production's when the list has it.
        let both = try LedgerConfiguration.load([Key.appleEnvironment: "sandbox,production"])
        #expect(try both.apple.verifier(logger: TestServer.logger).app.environments == [.production, .sandbox])
        #expect(both.apple.apiEnvironment == .production)
        #expect(try LedgerConfiguration.load([Key.appleEnvironment: "Sandbox"]).apple.apiEnvironment == .sandbox)
        // Left out, the configured app keeps the environments it has; given, even as the default, they are set.
        let app = "com.example.game"
        #expect(try LedgerConfiguration.load([Key.appleBundleID: app]).apple.configuredApp()?.app.environments == nil)
        #expect(try LedgerConfiguration.load([Key.appleBundleID: app, Key.appleEnvironment: "Production,Sandbox"]).apple.configuredApp()?.app.environments
            == [.production, .sandbox])
    }

    @Test("Apple roots: a missing file, or one without a certificate, is a configuration error naming the setting")
    func appleRoots() throws {
        #expect(throws: LedgerConfigurationError.self) {
            _ = try LedgerConfiguration.load([LedgerConfiguration.Key.appleRootCertificates: "/nonexistent/AppleRootCA-G3.cer"])
        }
        let garbage = NSTemporaryDirectory() + "not-a-root-\(UUID()).pem"
        try "not a certificate".write(toFile: garbage, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: garbage) }
        // With roots, the app they check against (a sandbox ledger needs no app id).
        let app = [LedgerConfiguration.Key.appleBundleID: TestApple.bundleId, LedgerConfiguration.Key.appleEnvironment: "Sandbox"]
        do {
            _ = try LedgerConfiguration.load(app.merging([LedgerConfiguration.Key.appleRootCertificates: garbage]) { $1 })
            Issue.record("a file without a certificate was accepted")
        } catch {
            #expect(String(describing: error).contains("LEDGER_APPLE_ROOT_CERTS names \(garbage), which holds no PEM or DER certificate"), "\(error)")
        }
        let apple = try TestApple()
        let good = try LedgerConfiguration.load(app.merging([LedgerConfiguration.Key.appleRootCertificates: apple.rootFile]) { $1 })
        #expect(try good.apple.verifier(logger: TestServer.logger).signedData.rootCount == 1)
    }

    @Test("every bad setting is named in one error")
    func allProblemsAtOnce() {
        do {
            _ = try LedgerConfiguration.load([
                "LEDGER_DATABASE_URL": "mysql://x", "LEDGER_PORT": "80000", "LEDGER_APPLE_ENVIRONMENT": "Staging",
                "LEDGER_APPLE_ROOT_CERTS": "/nonexistent/AppleRootCA-G3.cer", "LEDGER_APPLE_APP_ID": "abc",
                "LEDGER_LOG_LEVEL": "loud", "LEDGER_APPLE_VERIFY_RECEIPT_URL": "ftp://x", "LEDGER_HOST": "abc def",
            ])
            Issue.record("bad settings were accepted")
        } catch {
            let names = Set(error.problems.map(\.setting))
            #expect(names == [
                "LEDGER_DATABASE_URL", "LEDGER_PORT", "LEDGER_APPLE_ENVIRONMENT", "LEDGER_APPLE_ROOT_CERTS",
                "LEDGER_APPLE_APP_ID", "LEDGER_LOG_LEVEL", "LEDGER_APPLE_VERIFY_RECEIPT_URL", "LEDGER_APPLE_BUNDLE_ID", "LEDGER_HOST",
            ])
            #expect(error.problems.filter { $0.setting == "LEDGER_APPLE_APP_ID" }.count == 1, "a bad app id is not also called missing")
            #expect(error.description.contains("/nonexistent/AppleRootCA-G3.cer"))
        }
    }

    @Test("database URLs: TCP with password and sslmode, Unix socket through host=")
    func databaseURLs() throws {
        let tcp = try DatabaseURL("postgres://ledger:s%40cret@db.internal:6543/orders?sslmode=require")
        #expect(tcp.host == "db.internal")
        #expect(tcp.port == 6543)
        #expect(tcp.username == "ledger")
        #expect(tcp.password == "s@cret")
        #expect(tcp.database == "orders")
        #expect(tcp.sslMode == .require)
        #expect(!tcp.description.contains("s@cret"))

        let socket = try DatabaseURL("postgresql://ledger@/ledger?host=/var/run/postgresql")
        #expect(socket.clientConfiguration.unixSocketPath == "/var/run/postgresql/.s.PGSQL.5432")

        #expect(throws: LedgerConfigurationProblem.self) { try DatabaseURL("postgres://db.internal/x") }
        #expect(throws: LedgerConfigurationProblem.self) { try DatabaseURL("postgres://u@h/x?sslmode=maybe") }
        // Refused at once, not after a minute of failed connections.
        #expect(throws: LedgerConfigurationProblem("LEDGER_DATABASE_URL", "has port 99999; a port is 1 to 65535")) {
            try DatabaseURL("postgres://u@127.0.0.1:99999/x")
        }
        #expect(throws: LedgerConfigurationProblem.self) { try DatabaseURL("postgres://u@127.0.0.1:0/x") }
    }

    @Test("LEDGER_HOST: an IP address or a host name, anything else named before the server starts")
    func host() throws {
        for host in ["127.0.0.1", "0.0.0.0", "::1", "::", "fe80::1%eth0", "localhost", "ledger-1.internal", "host.example.", "proj_ledger_1"] {
            #expect(try LedgerConfiguration.load(["LEDGER_HOST": host]).host == host)
        }
        for host in ["abc def", "-1", "a..b", ".", "1.2.3.4:80", "fe80::1%", String(repeating: "a", count: 64)] {
            #expect(throws: LedgerConfigurationError.self, "\(host)") { _ = try LedgerConfiguration.load(["LEDGER_HOST": host]) }
        }
    }

    @Test("an empty setting counts as unset")
    func emptyIsUnset() throws {
        let configuration = try LedgerConfiguration.load(["LEDGER_DATABASE_URL": "", "LEDGER_PORT": ""])
        #expect(configuration.port == 8080)
        #expect(configuration.database == .privateCluster(dataDirectory: "./.ledger"))
    }
}

extension ConfigurationTests {
    @Test("the App Store Server API: off without a key, its three settings together, a key file that holds a P-256 key")
    func appStoreServerAPI() throws {
        typealias Key = LedgerConfiguration.Key
        #expect(try LedgerConfiguration.load([:]).apple.appStoreServerAPI() == nil)
        do {
            _ = try LedgerConfiguration.load([Key.appleAPIKeyID: "K1", Key.appleAPIRate: "0"])
            Issue.record("a key id alone was taken")
        } catch {
            let text = String(describing: error)
            let named = [Key.appleAPIIssuerID, Key.appleAPIPrivateKey, Key.appleAPIRate].filter { text.contains($0) }
            #expect(named.count == 3, "\(text)")
        }
        let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
        let file = NSTemporaryDirectory() + "iap-key-\(UUID()).p8"
        try standIn.privateKeyPEM.write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let values = [
            Key.appleAPIKeyID: "K1", Key.appleAPIIssuerID: "issuer", Key.appleAPIPrivateKey: file,
            Key.appleBundleID: TestApple.bundleId, Key.appleEnvironment: "Sandbox",
        ]
        let settings = try #require(try LedgerConfiguration.load(values).apple.appStoreServerAPI())
        #expect(settings.baseURL == AppStoreServerAPI.sandboxURL && settings.requestsPerSecond == 10 && settings.bundleID == TestApple.bundleId)
        #expect(settings.effectiveBudgets == .apple(.sandbox, atMost: 10), "the sandbox's limits, each endpoint apart")
        var elsewhere = values
        elsewhere[Key.appleAPIURL] = "http://127.0.0.1:9/"
        elsewhere[Key.appleAPIRate] = "2.5"
        let local = try #require(try LedgerConfiguration.load(elsewhere).apple.appStoreServerAPI())
        #expect(local.baseURL == "http://127.0.0.1:9/" && local.requestsPerSecond == 2.5)
        for rate in ["0x10", "1e2", " 5", "inf", "nan"] {
            var odd = values
            odd[Key.appleAPIRate] = rate
            #expect(throws: LedgerConfigurationError.self, "\(rate)") { _ = try LedgerConfiguration.load(odd) }
        }
        var noBundle = values
        noBundle[Key.appleBundleID] = nil
        #expect(throws: LedgerConfigurationError.self) { _ = try LedgerConfiguration.load(noBundle) }
        try "not a key".write(toFile: file, atomically: true, encoding: .utf8)
        // Refused as the settings are read, naming the setting: no command records it as the app's key.
        do {
            _ = try LedgerConfiguration.load(values)
            Issue.record("a file without a key was taken")
        } catch {
            #expect(String(describing: error).contains("\(Key.appleAPIPrivateKey) names \(file), which holds no P-256 private key in PEM"), "\(error)")
        }
    }
}

extension ConfigurationTests {
    @Test("with root certificates, serve refuses to start without the bundle id, and in production without the app id, in one line naming them")
    func verificationNeedsTheApp() throws {
        typealias Key = LedgerConfiguration.Key
        let apple = try TestApple()
        func refusal(_ values: [String: String]) -> LedgerConfigurationError? {
            switch Result(catching: { () throws(LedgerConfigurationError) in try LedgerConfiguration.load(values) }) {
            case .success: nil
            case .failure(let error): error
            }
        }
        let production = try #require(refusal([Key.appleRootCertificates: apple.rootFile]))
        #expect(Set(production.problems.map(\.setting)) == [Key.appleBundleID, Key.appleAppID])
        #expect(!production.description.contains("\n") && production.description.contains(Key.appleBundleID) && production.description.contains(Key.appleAppID))
        let noAppID = try #require(refusal([Key.appleRootCertificates: apple.rootFile, Key.appleBundleID: TestApple.bundleId]))
        #expect(noAppID.problems.map(\.setting) == [Key.appleAppID])
        let noBundle = try #require(refusal([Key.appleRootCertificates: apple.rootFile, Key.appleEnvironment: "Sandbox"]))
        #expect(noBundle.problems.map(\.setting) == [Key.appleBundleID])
        // Enough: the sandbox with a bundle id; production with both.
        #expect(refusal([Key.appleRootCertificates: apple.rootFile, Key.appleEnvironment: "Sandbox", Key.appleBundleID: TestApple.bundleId]) == nil)
        #expect(refusal([Key.appleRootCertificates: apple.rootFile, Key.appleBundleID: TestApple.bundleId, Key.appleAppID: "1234567890"]) == nil)
        // A list that has Production needs the app id too; one without it does not.
        let both = try #require(refusal([Key.appleRootCertificates: apple.rootFile, Key.appleBundleID: TestApple.bundleId, Key.appleEnvironment: "Sandbox,Production"]))
        #expect(both.problems.map(\.setting) == [Key.appleAppID])
        // No Apple settings at all (the quickstart): nothing required.
        #expect(refusal([:]) == nil)
        // Settings made in code are held to the same rule when the verifier is built.
        var made = LedgerConfiguration()
        made.apple.rootCertificateFiles = [apple.rootFile]
        #expect(throws: LedgerConfigurationError.self) { _ = try made.apple.verifier(logger: TestServer.logger) }
        made.apple.bundleID = TestApple.bundleId
        made.apple.appID = TestApple.appAppleId
        #expect(try made.apple.verifier(logger: TestServer.logger).app.appAppleId == TestApple.appAppleId)
    }
}
