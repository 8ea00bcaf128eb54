import AppStoreStandIn
import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// `ledger apps`, run as an operator runs it: the built executable against the database.
@Suite("ledger apps")
struct AppsCommandTests {
    @Test("adds, lists and changes apps from the command line, never printing a key or a secret; a bad option is named")
    func managesApps() async throws {
        try await withTestDatabase { db in
            let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-apps-\(UUID().uuidString.prefix(8))")
            try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: work) }
            let pem = AppStoreServerStandIn(bundleID: "com.example.cli").privateKeyPEM
            let material = pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
            let keyFile = work.appendingPathComponent("key.p8").path
            try pem.write(toFile: keyFile, atomically: true, encoding: .utf8)
            let environment = ["LEDGER_DATABASE_URL": db.configuration.url, "LEDGER_LOG_LEVEL": "trace"]
            var step = 0
            func ledger(_ arguments: [String], _ extra: [String: String] = [:]) async throws -> (Int32, String) {
                step += 1
                return try await LedgerChild.run(arguments, environment: environment.merging(extra) { $1 }, log: work.appendingPathComponent("\(step).log"))
            }

            let (added, addOutput) = try await ledger([
                "apps", "add", "--bundle-id", "com.example.cli", "--app-apple-id", "1234567890", "--shared-secret", "cli-s3cr3t",
                "--issuer-id", AppStoreServerStandIn.issuerID, "--key-id", "CLIKEY", "--private-key-file", keyFile,
            ])
            #expect(added == 0, "\(addOutput)")
            #expect(addOutput.contains("com.example.cli\tapp-apple-id 1234567890\tProduction,Sandbox\tapi-key CLIKEY (stored)\tshared-secret"), "\(addOutput)")
            let stored = try await scalarText(db, "SELECT api_private_key FROM app_credentials WHERE bundle_id = 'com.example.cli'")
            #expect(stored == pem, "the key file's text is stored")

            let (changed, changeOutput) = try await ledger([
                "apps", "set", "--bundle-id", "COM.example.cli", "--environments", "sandbox", "--refund-preference", "DECLINE",
                "--clear", "shared-secret", "--retired", "true", "--app-account-tokens", "user", "--sku", "CLI1",
            ])
            #expect(changed == 0, "\(changeOutput)")
            #expect(changeOutput.contains("com.example.cli\tapp-apple-id 1234567890\tSandbox\tapi-key CLIKEY (stored)\tno shared-secret\tDECLINE\tapp-account-tokens user\tretired\tsku CLI1"), "\(changeOutput)")
            // A secret kept off the command line, where any user listing processes would see it.
            let secretFile = work.appendingPathComponent("secret").path
            try "cli-s3cr3t-2\n".write(toFile: secretFile, atomically: true, encoding: .utf8)
            let (fromFile, fromFileOutput) = try await ledger(["apps", "set", "--bundle-id", "com.example.cli", "--shared-secret-file", secretFile])
            #expect(fromFile == 0 && fromFileOutput.contains("\tshared-secret\t"), "\(fromFileOutput)")
            #expect(try await scalarText(db, "SELECT shared_secret FROM app_credentials WHERE bundle_id = 'com.example.cli'") == "cli-s3cr3t-2")
            let (referred, referOutput) = try await ledger([
                "apps", "set", "--bundle-id", "com.example.cli", "--issuer-id", "issuer-2", "--key-id", "KEY2", "--private-key-ref", "env:CLI_IAP_KEY",
            ])
            #expect(referred == 0 && referOutput.contains("api-key KEY2 (env:CLI_IAP_KEY)"), "\(referOutput)")

            // The settings' app is created by a command that opens the ledger, as by serve.
            let (listed, list) = try await ledger(["apps", "list"], ["LEDGER_APPLE_BUNDLE_ID": "com.example.configured", "LEDGER_APPLE_ENVIRONMENT": "Sandbox"])
            #expect(listed == 0, "\(list)")
            #expect(list.contains("com.example.cli\t") && list.contains("com.example.configured\tno app-apple-id\tSandbox\tno api-key"), "\(list)")

            // Product ids are per app: `--bundle-id` sets the named app's (else the first app's).
            let (set, setOutput) = try await ledger(["products", "set", "--product", "gems.100", "--price", "1.99", "--currency", "USD", "--bundle-id", "com.example.configured"])
            #expect(set == 0, "\(setOutput)")
            // Every column in its place, the app among them (two apps may sell one product id).
            #expect(setOutput.contains("gems.100\tactive\t1.99\tUSD\t-\t-\tcom.example.configured\t-\t-"), "\(setOutput)")
            #expect(try await scalarText(db, "SELECT bundle_id FROM products WHERE product_id = 'gems.100'") == "com.example.configured")
            let (unknownApp, unknownOutput) = try await ledger(["products", "set", "--product", "gems.100", "--bundle-id", "com.example.none"])
            #expect(unknownApp != 0 && unknownOutput.contains("the ledger holds no app com.example.none") && !unknownOutput.contains("Error: PSQLError"), "\(unknownOutput)")
            // Product types (issue 40): a subscription group only for an auto-renewable product.
            let (typed, typedOutput) = try await ledger(["products", "set", "--product", "pro.monthly", "--type", "auto-renewable", "--subscription-group", "21000001"])
            #expect(typed == 0 && typedOutput.contains("pro.monthly\tactive\t-\t-\tauto-renewable\t21000001"), "\(typedOutput)")
            let (badType, badTypeOutput) = try await ledger(["products", "set", "--product", "pro.monthly", "--type", "subscription"])
            #expect(badType != 0 && badTypeOutput.contains("--type"), "\(badTypeOutput)")
            let (badGroup, badGroupOutput) = try await ledger(["products", "set", "--product", "lifetime", "--type", "non-consumable", "--subscription-group", "21000001"])
            #expect(badGroup == 64 && badGroupOutput.contains("Error: --subscription-group is only for an auto-renewable product"), "\(badGroupOutput)")
            let (badPrice, badPriceOutput) = try await ledger(["products", "set", "--product", "lifetime", "--price", "abc"])
            #expect(badPrice == 64 && badPriceOutput.contains("Error: --price must be a decimal string"), "a usage error: \(badPriceOutput)")
            #expect(try await scalarText(db, "SELECT type || ' ' || subscription_group FROM products WHERE product_id = 'pro.monthly'") == "auto-renewable 21000001")

            for (arguments, named) in [
                (["apps", "add", "--bundle-id", "com.example.cli"], "holds the app com.example.cli already"),
                (["apps", "add", "--bundle-id", "com example"], "--bundle-id"),
                (["apps", "add", "--bundle-id", "com.example.x", "--environments", "Staging"], "--environments"),
                (["apps", "add", "--bundle-id", "com.example.x", "--app-apple-id", "abc"], "--app-apple-id"),
                (["apps", "add", "--bundle-id", "com.example.x", "--refund-preference", "MAYBE"], "--refund-preference"),
                (["apps", "add", "--bundle-id", "com.example.x", "--issuer-id", "i", "--private-key-file", keyFile], "--key-id"),
                (["apps", "add", "--bundle-id", "com.example.x", "--issuer-id", "i", "--key-id", "k", "--private-key-file", "/nonexistent/key.p8"], "--private-key-file"),
                (["apps", "add", "--bundle-id", "com.example.x", "--issuer-id", "i", "--key-id", "k", "--private-key-file", work.appendingPathComponent("1.log").path], "--private-key-file"),
                (["apps", "add", "--bundle-id", "com.example.x", "--issuer-id", "i", "--key-id", "k", "--private-key-ref", "vault:x"], "--private-key-ref"),
                (["apps", "set", "--bundle-id", "com.example.cli", "--clear", "colour"], "--clear"),
                (["apps", "set", "--bundle-id", "com.example.cli", "--shared-secret-file", "/nonexistent/secret"], "--shared-secret-file"),
                (["apps", "set", "--bundle-id", "com.example.cli", "--shared-secret", "x", "--shared-secret-file", secretFile], "--shared-secret-file"),
                (["apps", "set", "--bundle-id", "com.example.none", "--retired", "true"], "no app com.example.none"),
            ] {
                let (status, output) = try await ledger(arguments)
                #expect(status != 0 && output.contains(named), "\(arguments): \(output)")
                // A value of an option is a usage error, with the usage (operations.md); what the
                // database holds is not.
                let usage = named.hasPrefix("--")
                #expect((status == 64) == usage && output.contains("Usage: ledger apps") == usage, "\(arguments): \(status) \(output)")
            }
            for run in 1...step {
                let text = (try? String(contentsOf: work.appendingPathComponent("\(run).log"), encoding: .utf8)) ?? ""
                #expect(!text.contains(material) && !text.contains("cli-s3cr3t"), "run \(run) printed a secret")
                // PostgreSQL's client library traces rows and values as hex bytes, a secret among them: never at any level.
                #expect(!text.contains("cli-s3cr3t".utf8.map { String($0, radix: 16) }.joined()), "run \(run) printed a secret's bytes")
                #expect(!text.split(separator: "\n").contains { $0.contains(" trace ") && $0.contains("[PostgresNIO]") }, "run \(run) wrote the database client's traces")
            }
        }
    }
}
