import AppStoreStandIn
import Foundation
import LedgerTestSupport
import Testing

/// `ledger sales fetch`, run as an operator runs it, against a stand-in App Store Connect.
@Suite("ledger sales fetch")
struct SalesCommandTests {
    @Test("fetches the days not stored, says what it found; a second run asks only for the day not published; without a key it is refused, naming the settings")
    func fetches() async throws {
        let standIn = AppStoreConnectStandIn()
        let (d1, d2) = (Self.day(-3), Self.day(-2))
        await standIn.setReport(d1, tsv: AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 2, "US")], day: d1))
        await standIn.setUnpublished(d2)
        try await withTestDatabase { db in
            let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-sales-\(UUID().uuidString.prefix(8))")
            try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: work) }
            let keyFile = work.appendingPathComponent("AuthKey.p8").path
            try standIn.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
            try await standIn.run { baseURL in
                let environment = [
                    "LEDGER_DATABASE_URL": db.configuration.url, "LEDGER_APP_STORE_CONNECT_URL": baseURL,
                    "LEDGER_APP_STORE_CONNECT_ISSUER_ID": AppStoreConnectStandIn.issuerID, "LEDGER_APP_STORE_CONNECT_KEY_ID": AppStoreConnectStandIn.keyID,
                    "LEDGER_APP_STORE_CONNECT_PRIVATE_KEY": keyFile, "LEDGER_APP_STORE_CONNECT_VENDOR_NUMBER": standIn.vendorNumber,
                ]
                let (status, output) = try await LedgerChild.run(["sales", "fetch", "--from", d1, "--to", d2], environment: environment, log: work.appendingPathComponent("1.log"))
                #expect(status == 0 && output.contains("sales reports: 1 new, 0 restated, 0 unchanged, 0 without sales, 1 not published yet"), "\(output)")
                #expect(!output.contains("BEGIN PRIVATE KEY"))
                // Today is not over in Pacific time: no report yet, and nothing asked.
                let (early, notYet) = try await LedgerChild.run(["sales", "fetch", "--from", d1, "--to", Self.day(1)], environment: environment, log: work.appendingPathComponent("0.log"))
                #expect(early == 64 && notYet.contains("yesterday in Pacific time"), "\(notYet)")
                await standIn.publish(d2)
                let (again, second) = try await LedgerChild.run(["sales", "fetch", "--from", d1, "--to", d2], environment: environment, log: work.appendingPathComponent("2.log"))
                #expect(again == 0 && second.contains("sales reports: 0 new, 0 restated, 0 unchanged, 1 without sales"), "\(second)")
                #expect(await standIn.asked.sorted() == [d1, d2, d2], "two days at once: in either order")
                let (none, refusal) = try await LedgerChild.run(["sales", "fetch"], environment: ["LEDGER_DATABASE_URL": db.configuration.url], log: work.appendingPathComponent("3.log"))
                #expect(none != 0 && refusal.contains("LEDGER_APP_STORE_CONNECT_ISSUER_ID"), "\(refusal)")
                var partial = environment
                partial["LEDGER_APP_STORE_CONNECT_VENDOR_NUMBER"] = nil
                let (bad, named) = try await LedgerChild.run(["sales", "fetch"], environment: partial, log: work.appendingPathComponent("4.log"))
                #expect(bad != 0 && named.contains("LEDGER_APP_STORE_CONNECT_VENDOR_NUMBER is missing"), "\(named)")
            }
        }
    }

    static func day(_ offset: Int) -> String {
        String(Date(timeIntervalSinceNow: Double(offset) * 86_400).formatted(Date.ISO8601FormatStyle()).prefix(10))
    }
}
