import AppleReceipts
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
        #expect(configuration.apple.environment == "Production")
    }

    @Test("Apple roots: a missing file is a configuration error; a file without a certificate stops the application from being built")
    func appleRoots() throws {
        #expect(throws: LedgerConfigurationError.self) {
            _ = try LedgerConfiguration.load([LedgerConfiguration.Key.appleRootCertificates: "/nonexistent/AppleRootCA-G3.cer"])
        }
        let garbage = NSTemporaryDirectory() + "not-a-root-\(UUID()).pem"
        try "not a certificate".write(toFile: garbage, atomically: true, encoding: .utf8)
        let configuration = try LedgerConfiguration.load([LedgerConfiguration.Key.appleRootCertificates: garbage])
        do {
            _ = try configuration.apple.verifier(logger: TestServer.logger)
            Issue.record("a file without a certificate was accepted")
        } catch let error as AppleVerificationError {
            #expect(error.code == "root-certificate-unreadable" && error.message.contains(garbage))
        }
        let apple = try TestApple()
        let good = try LedgerConfiguration.load([LedgerConfiguration.Key.appleRootCertificates: apple.rootFile])
        #expect(try good.apple.verifier(logger: TestServer.logger).signedData.rootCount == 1)
    }

    @Test("every bad setting is named in one error")
    func allProblemsAtOnce() {
        do {
            _ = try LedgerConfiguration.load([
                "LEDGER_DATABASE_URL": "mysql://x", "LEDGER_PORT": "80000", "LEDGER_APPLE_ENVIRONMENT": "Staging",
                "LEDGER_APPLE_ROOT_CERTS": "/nonexistent/AppleRootCA-G3.cer", "LEDGER_APPLE_APP_ID": "abc",
                "LEDGER_LOG_LEVEL": "loud", "LEDGER_APPLE_VERIFY_RECEIPT_URL": "ftp://x",
            ])
            Issue.record("bad settings were accepted")
        } catch {
            let names = Set(error.problems.map(\.setting))
            #expect(names == [
                "LEDGER_DATABASE_URL", "LEDGER_PORT", "LEDGER_APPLE_ENVIRONMENT", "LEDGER_APPLE_ROOT_CERTS",
                "LEDGER_APPLE_APP_ID", "LEDGER_LOG_LEVEL", "LEDGER_APPLE_VERIFY_RECEIPT_URL",
            ])
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
    }

    @Test("an empty setting counts as unset")
    func emptyIsUnset() throws {
        let configuration = try LedgerConfiguration.load(["LEDGER_DATABASE_URL": "", "LEDGER_PORT": ""])
        #expect(configuration.port == 8080)
        #expect(configuration.database == .privateCluster(dataDirectory: "./.ledger"))
    }
}
