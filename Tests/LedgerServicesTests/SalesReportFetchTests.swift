import AppleReceipts
import AppStoreStandIn
import Foundation
import LedgerServices
import LedgerStore
import LedgerTestSupport
import Logging
import Testing

/// Issue 42, points 1, 2 and 5: App Store Connect's daily sales reports fetched from a stand-in
/// as strict as Apple, with its faults, and stored as Apple sent them.
@Suite("App Store Connect sales reports")
struct SalesReportFetchTests {
    static let logger = Logger(label: "sales-test")

    static func day(_ offset: Int) -> String {
        String(Date(timeIntervalSinceNow: Double(offset) * 86_400).formatted(Date.ISO8601FormatStyle()).prefix(10))
    }

    /// A fetch from `standIn` into a fresh test database, and its store.
    static func withFetch(
        _ standIn: AppStoreConnectStandIn, _ body: @Sendable @escaping (SalesReportFetch, AppleSalesStore, TestDatabase) async throws -> Void
    ) async throws {
        try await withTestDatabase { db in
            try await standIn.run { baseURL in
                let api = try await AppStoreConnectAPI(settings: standIn.settings(baseURL: baseURL), logger: Self.logger)
                let store = AppleSalesStore(database: db.database)
                try await body(SalesReportFetch(api: api, store: store, logger: Self.logger), store, db)
            }
        }
    }

    @Test("faults Apple plays: 429 with Retry-After and 500 retried, no sales an empty day, a day not published asked again, a restated day a new revision")
    func fetchesThroughFaults() async throws {
        let standIn = AppStoreConnectStandIn()
        let (d1, d2, d3, d4) = (Self.day(-5), Self.day(-4), Self.day(-3), Self.day(-2))
        await standIn.setReport(d1, tsv: AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 3, "US"), ("gems.100", "GAME1", "IA1", -1, "DE")], day: d1))
        await standIn.setReport(d3, tsv: AppStoreConnectStandIn.tsv([("gems.500", "GAME1", "IA1", 2, "FR")], day: d3))
        await standIn.setUnpublished(d4)
        // d2: no sales.
        await standIn.queue([.tooManyRequests(retryAfterSeconds: 0), .serverError])
        try await Self.withFetch(standIn) { fetch, store, db in
            let first = try await fetch.run(from: d1, to: d4)
            #expect(first.new == [d1, d3] && first.noSales == [d2] && first.notYetPublished == [d4] && first.failed.isEmpty, "\(first)")
            #expect(await standIn.requests == 6, "two faults retried, four days")
            let rows = try await db.client.query(
                "SELECT r.sku || ' ' || r.country_code || ' ' || r.units::text || ' ' || (f.fields->>'Order Type' IS NOT NULL)::text FROM apple_sales_rows r JOIN apple_sales_fields f USING (vendor_number, report_date, version, revision, line) ORDER BY r.report_date, r.line",
                logger: TestServer.logger)
            var lines: [String] = []
            for try await line in rows.decode(String.self) { lines.append(line) }
            #expect(lines == ["gems.100 US 3 true", "gems.100 DE -1 true", "gems.500 FR 2 true"], "every column kept, new ones too")

            // The next run asks for the day not published then (it is now) and the day of this week without sales.
            await standIn.publish(d4)
            await standIn.setReport(d4, tsv: AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 1, "US")], day: d4))
            let asked = await standIn.asked.count
            let second = try await fetch.run(from: d1, to: d4)
            #expect(second.new == [d4] && second.unchanged == [d2], "the day without sales of this week asked again: \(second)")
            #expect(await standIn.asked.count == asked + 2)

            // Fetched again: the same files change nothing; a restated day is a new revision.
            await standIn.setReport(d1, tsv: AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 4, "US")], day: d1))
            let again = try await fetch.run(from: d1, to: d4, again: true)
            #expect(again.restated == [d1] && again.unchanged == [d2, d3, d4], "\(again)")
            let revision = try await store.latest(vendor: standIn.vendorNumber, day: d1, version: "1_0")
            #expect(revision?.revision == 2 && revision?.rows == 1, "\(String(describing: revision))")
        }
    }

    @Test("a damaged day fails alone, named: a file cut short, two gzip members, a NUL, units past an integer, another day's report; the others are stored")
    func damagedDaysFailAlone() async throws {
        let standIn = AppStoreConnectStandIn()
        let days = (2...8).reversed().map { Self.day(-$0) }
        @Sendable func report(_ day: String, units: String = "3") -> String {
            AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 1, "US"), ("gems.500", "GAME1", "IA1", 2, "DE")], day: day)
                .replacingOccurrences(of: "\tIA1\t1\t", with: "\tIA1\t\(units)\t")
        }
        // Cut short: without its trailer and some of its data; without the length alone.
        await standIn.setReportFile(days[0], file: try AppStoreConnectStandIn.gzip(report(days[0])).dropLast(13))
        await standIn.setReportFile(days[1], file: try AppStoreConnectStandIn.gzip(report(days[1])).dropLast(4))
        // Two gzip members (RFC 1952 allows them; Apple sends one): the second is not dropped unseen.
        let lines = report(days[2]).split(separator: "\n", omittingEmptySubsequences: false)
        let split = lines.count / 2
        await standIn.setReportFile(days[2], file: try AppStoreConnectStandIn.gzip(lines[..<split].joined(separator: "\n") + "\n")
                                        + AppStoreConnectStandIn.gzip(lines[split...].joined(separator: "\n")))
        await standIn.setReport(days[3], tsv: report(days[3]).replacingOccurrences(of: "Example Studio", with: "Example\u{0}Studio"))
        await standIn.setReport(days[4], tsv: report(days[4], units: "3000000000"))
        // A proxy answering another day's report.
        await standIn.setReport(days[5], tsv: report(days[0]))
        await standIn.setReport(days[6], tsv: report(days[6]))
        try await Self.withFetch(standIn) { fetch, store, _ in
            let summary = try await fetch.run(from: days[0], to: days[6])
            #expect(summary.new == [days[6]], "\(summary)")
            #expect(Set(summary.failed.keys) == Set(days[0...5]), "\(summary)")
            for day in days[0...2] {
                #expect(summary.failed[day]?.contains("cut short or damaged") == true, "\(day): \(summary.failed[day] ?? "-")")
            }
            #expect(summary.failed[days[3]]?.contains("holds a NUL character") == true, "\(summary.failed[days[3]] ?? "-")")
            #expect(summary.failed[days[4]]?.contains("Units is \"3000000000\"") == true, "\(summary.failed[days[4]] ?? "-")")
            #expect(summary.failed[days[5]]?.contains("not of") == true, "\(summary.failed[days[5]] ?? "-")")
            for day in days[0...5] {
                #expect(try await store.latest(vendor: standIn.vendorNumber, day: day, version: "1_0") == nil, "\(day): nothing stored")
            }
            // Mended at Apple's end: the next run stores them.
            for day in days[0...5] { await standIn.setReport(day, tsv: report(day)) }
            let next = try await fetch.run(from: days[0], to: days[6])
            #expect(next.new == Array(days[0...5]) && next.failed.isEmpty, "\(next)")
        }
    }

    @Test("a day Apple answered without sales is asked again for a week: its report when it comes is the day's next revision; older days are not asked again")
    func noSalesAskedAgain() async throws {
        let standIn = AppStoreConnectStandIn()
        let (old, recent) = (Self.day(-10), Self.day(-3))
        try await Self.withFetch(standIn) { fetch, store, _ in
            let first = try await fetch.run(from: old, to: recent)
            #expect(first.noSales.count == 8 && first.noSales.first == old && first.noSales.last == recent, "\(first)")
            // Apple publishes both days' reports after all.
            for day in [old, recent] {
                await standIn.setReport(day, tsv: AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 2, "US")], day: day))
            }
            let before = await standIn.asked.count
            let second = try await fetch.run(from: old, to: recent)
            #expect(second.restated == [recent] && second.new.isEmpty && second.noSales.isEmpty, "\(second)")
            let asked = await standIn.asked.dropFirst(before)
            #expect(asked.contains(recent) && !asked.contains(old) && asked.count < 8, "the days of the past week only: \(asked)")
            let latest = try await store.latest(vendor: standIn.vendorNumber, day: recent, version: "1_0")
            #expect(latest?.revision == 2 && latest?.outcome == "report" && latest?.rows == 1, "\(String(describing: latest))")
            let kept = try await store.latest(vendor: standIn.vendorNumber, day: old, version: "1_0")
            #expect(kept?.revision == 1 && kept?.outcome == "no-sales", "\(String(describing: kept))")
            // A day with a report is not asked again by itself; taken back to no sales (fetched again), a restatement.
            let third = try await fetch.run(from: recent, to: recent)
            #expect(third == SalesReportFetch.Summary(), "\(third)")
            await standIn.removeReport(recent)
            let again = try await fetch.run(from: recent, to: recent, again: true)
            #expect(again.restated == [recent] && again.noSales.isEmpty, "\(again)")
            #expect(try await store.latest(vendor: standIn.vendorNumber, day: recent, version: "1_0")?.revision == 3)
        }
    }

    @Test("a server whose clock is a little ahead of Apple's: its token still expires within Apple's 20 minutes, and is taken")
    func tokenWithClockAhead() async throws {
        let standIn = AppStoreConnectStandIn(clockBehind: 100)
        await standIn.setReport(Self.day(-2), tsv: AppStoreConnectStandIn.tsv([("gems.100", "GAME1", "IA1", 1, "US")], day: Self.day(-2)))
        try await standIn.run { baseURL in
            let answer = try await AppStoreConnectAPI(settings: standIn.settings(baseURL: baseURL), logger: Self.logger).dailySalesReport(Self.day(-2))
            guard case .report = answer else { Issue.record("\(answer)"); return }
        }
    }

    @Test("Apple's refusals are named: a wrong key, a vendor the key may not read, a day past Apple's 365, a version Apple does not know")
    func refusals() async throws {
        let standIn = AppStoreConnectStandIn()
        try await standIn.run { baseURL in
            var wrongKey = standIn.settings(baseURL: baseURL)
            wrongKey.privateKeyPEM = AppStoreConnectStandIn().privateKeyPEM
            do {
                _ = try await AppStoreConnectAPI(settings: wrongKey, logger: Self.logger).dailySalesReport(Self.day(-1))
                Issue.record("another key's token was taken")
            } catch let error as AppStoreConnectError {
                #expect(error.code == "app-store-connect-unauthorized", "\(error)")
            }
            var otherVendor = standIn.settings(baseURL: baseURL)
            otherVendor.vendorNumber = "1"
            do {
                _ = try await AppStoreConnectAPI(settings: otherVendor, logger: Self.logger).dailySalesReport(Self.day(-1))
                Issue.record("another vendor's report was served")
            } catch let error as AppStoreConnectError {
                #expect(error.code == "app-store-connect-forbidden" && error.message.contains("Sales or Finance"), "\(error)")
            }
            let api = try await AppStoreConnectAPI(settings: standIn.settings(baseURL: baseURL), logger: Self.logger)
            do {
                _ = try await api.dailySalesReport(Self.day(-400))
                Issue.record("a day past 365 was served")
            } catch let error as AppStoreConnectError {
                #expect(error.code == "app-store-connect-refused" && error.message.contains("365 days"), "\(error)")
            }
            var newer = standIn.settings(baseURL: baseURL)
            newer.version = "1_3"
            do {
                _ = try await AppStoreConnectAPI(settings: newer, logger: Self.logger).dailySalesReport(Self.day(-1))
                Issue.record("an unknown version was served")
            } catch let error as AppStoreConnectError {
                #expect(error.code == "app-store-connect-refused" && error.message.contains("version"), "\(error)")
            }
            // Rate-limited past the client's tries: Apple away, a later run's business.
            await standIn.queue(Array(repeating: .tooManyRequests(retryAfterSeconds: 0), count: 5))
            do {
                _ = try await api.dailySalesReport(Self.day(-1))
                Issue.record("five 429s were not an error")
            } catch let error as AppStoreConnectError {
                #expect(error.isAppleAway && error.code == "app-store-connect-rate-limited", "\(error)")
            }
        }
    }

    @Test("a report is read by its header's names, whatever the columns' order; a file without a column the ledger reads is refused, naming it")
    func readsByHeader() throws {
        // Windows line ends, spaces around a value, and a line that stops short of the last column.
        let text = "Units\tCountry Code\tSKU\tParent Identifier\tProduct Type Identifier\tSomething New\r\n2\tJP\t gems.100 \tGAME1\tIA1\tx\r\n-1\tFR\tgems.500\tGAME1\tIA1\r\n"
        let report = try AppleSalesReport(file: Data(text.utf8))
        let new = try #require(report.header.firstIndex(of: "Something New"))
        #expect(report.rows.map { "\($0.sku) \($0.countryCode) \($0.units) \($0.values[new])" } == ["gems.100 JP 2 x", "gems.500 FR -1 "])
        do {
            _ = try AppleSalesReport(file: Data("SKU\tUnits\n".utf8))
            Issue.record("a report without Parent Identifier was read")
        } catch {
            #expect(error.message.contains("Parent Identifier"), "\(error)")
        }
        // The day a report says it is of, read as numbers: Apple's MM/DD/YYYY, padded or not.
        let dated = try AppleSalesReport(file: Data("SKU\tParent Identifier\tProduct Type Identifier\tUnits\tCountry Code\tBegin Date\ngems.100\tGAME1\tIA1\t1\tUS\t1/2/2026\ngems.100\tGAME1\tIA1\t1\tUS\t01/02/2026\n".utf8))
        try dated.check(day: "2026-01-02")
        #expect(throws: AppStoreConnectError.self) { try dated.check(day: "2026-01-03") }
        // Units that are no whole number: the file is refused, naming the line, never read as 0.
        for units in ["nan", "1e300", "x", "", "1.5", "2147483648", "-3000000000"] {
            do {
                _ = try AppleSalesReport(file: Data("SKU\tParent Identifier\tProduct Type Identifier\tUnits\tCountry Code\ngems.100\tGAME1\tIA1\t1\tUS\ngems.100\tGAME1\tIA1\t\(units)\tUS\n".utf8))
                Issue.record("Units \(units) was read")
            } catch {
                #expect(error.code == "sales-report-malformed" && error.message.hasPrefix("line 3 of the sales report: Units is"), "\(error)")
            }
        }
    }
}
