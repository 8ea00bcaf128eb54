import AppleReceipts
import AppStoreStandIn
import ArgumentParser
import Foundation
import LedgerCore
import LedgerJSON
import LedgerServer
import LedgerServices
import LedgerStore
import Logging
import PostgresNIO

/// `ledger-bench sales`: a year of App Store Connect daily sales reports for one app (each line
/// a product in a storefront, from `--products` products in `--storefronts` storefronts) served
/// by the stand-in, fetched, stored and compared with a ledger of `--orders` orders whose
/// purchases they count (one more here and there: Apple's extra purchases). The ledger is made
/// first with the history import (its time printed apart). Baseline: psql's `\copy` of the same
/// stored report lines into copies of their tables, in the same run. Then the comparison query of
/// one month, alone.
struct BenchSales: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "sales", abstract: "A year of sales reports fetched, stored and compared with a ledger, against a COPY of the same lines.")

    @OptionGroup var options: BenchOptions
    @Option(help: "Orders in the ledger, each a purchase of the year") var orders = 1_000_000
    @Option(help: "Products of the app") var products = 100
    @Option(help: "Storefronts sold in") var storefronts = 175
    @Option(help: "Days of reports, ending yesterday (Pacific)") var days = 365

    static let bundleId = "com.example.bench-sales"
    static let sku = "BENCHSALES"

    func run() async throws {
        guard (1...365).contains(days), orders >= days, (1...250).contains(storefronts), products >= 1 else {
            throw ValidationError("--days 1...365, --orders at least --days, --storefronts 1...250, --products at least 1")
        }
        let logger = benchLogger
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-bench-sales-\(getpid())")
        try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: work) }
        let (orders, products, storefrontCount, days) = (orders, products, storefronts, days)

        try await options.withBenchDatabase { bench in
            let figures = try await withPostgresClient(bench, logger: logger) { client in
                let database = Database(client: client, logger: logger)
                _ = try await AppCatalog(database: database).add(try BundleID(Self.bundleId), AppChanges(environments: [.production], sku: Self.sku))
                var countries: [(alpha3: String, alpha2: String)] = []
                for try await pair in try await client.query("SELECT alpha3, alpha2 FROM storefront_countries ORDER BY alpha3", logger: logger)
                    .decode((String, String).self) { countries.append(pair) }
                countries = Array(countries.prefix(storefrontCount))

                // The year: each order a purchase, spread evenly over the days (Pacific), product
                // and storefront turning; Apple's units per day, product and country, with one
                // more every 997th purchase.
                let firstDay = SalesReportFetch.pacificDay(-days)
                let lastDay = SalesReportFetch.pacificDay(-1)
                var pacific = Calendar(identifier: .gregorian)
                pacific.timeZone = TimeZone(identifier: "America/Los_Angeles") ?? .gmt
                let first = try Date(firstDay + "T12:00:00Z", strategy: Date.ISO8601FormatStyle())
                let midnights = (0...days).map { pacific.startOfDay(for: pacific.date(byAdding: .day, value: $0, to: first) ?? first) }
                let dayNames = midnights.map { SalesReportFetch.pacificDay(0, from: $0.addingTimeInterval(3600)) }
                var units: [[String: Int]] = Array(repeating: [:], count: days)
                let file = work.appendingPathComponent("history.csv")
                FileManager.default.createFile(atPath: file.path, contents: nil)
                let handle = try FileHandle(forWritingTo: file)
                var text = "orderId,userId,productId,createdAt,state,price,currency,transactionId,purchaseDate,storefront\n"
                let style = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
                for index in 0..<orders {
                    let day = index * days / orders
                    // The day's first order and its count: each day's orders spread over it, none past its end.
                    let (dayFirst, dayNext) = ((day * orders + days - 1) / days, ((day + 1) * orders + days - 1) / days)
                    let within = Double(index - dayFirst) / Double(max(1, dayNext - dayFirst))
                    let purchased = midnights[day].addingTimeInterval(midnights[day + 1].timeIntervalSince(midnights[day]) * within)
                    let product = "p-\(index % products)"
                    let country = countries[(index / products) % countries.count]
                    units[day][product + "\t" + country.alpha2, default: 0] += index % 997 == 0 ? 2 : 1
                    text += "s-\(index),u-\(index % 20_000),\(product),\(purchased.addingTimeInterval(-10).formatted(style)),finished,0.99,USD,"
                    text += "\(8_000_000_000 + index),\(purchased.formatted(style)),\(country.alpha3)\n"
                    if text.utf8.count > 1 << 20 {
                        handle.write(Data(text.utf8))
                        text = ""
                    }
                }
                handle.write(Data(text.utf8))
                try handle.close()
                let history = try HistoryFile(try Data(contentsOf: file), format: .csv)
                let importStart = ContinuousClock.now
                let imported = try await HistoryImport(orders: ServiceAssembly(database: database).orders).run(history.lines, source: "history.csv")
                let importSeconds = (ContinuousClock.now - importStart).inSeconds
                guard imported.imported == orders else { throw ValidationError("imported \(imported.imported) of \(orders) orders: \(imported.refusals.prefix(3))") }

                let standIn = AppStoreConnectStandIn()
                var lines = 0
                for (day, counted) in units.enumerated() {
                    var rows = counted.map { key, n in
                        let parts = key.split(separator: "\t")
                        return (sku: String(parts[0]), parent: Self.sku, type: "IA1", units: n, country: String(parts[1]))
                    }
                    rows.append((sku: Self.sku, parent: "", type: "1", units: 40, country: "US"))  // the app's own downloads
                    lines += rows.count
                    await standIn.setReport(dayNames[day], tsv: AppStoreConnectStandIn.tsv(rows, day: dayNames[day]))
                }

                let reportLines = lines
                return try await standIn.run { baseURL in
                    let api = try await AppStoreConnectAPI(settings: standIn.settings(baseURL: baseURL), logger: logger)
                    let start = ContinuousClock.now
                    let fetched = try await SalesReportFetch(api: api, store: AppleSalesStore(database: database), logger: logger)
                        .run(from: firstDay, to: lastDay)
                    let fetchSeconds = (ContinuousClock.now - start).inSeconds
                    let compareStart = ContinuousClock.now
                    let year = try await AppleSalesComparison.make(database: database, from: firstDay, to: lastDay)
                    let compareSeconds = (ContinuousClock.now - compareStart).inSeconds
                    // One month: the query alone in the database (its rows counted there), and the
                    // comparison as `ledger report apple` reads it; five runs each, the median.
                    let monthFrom = dayNames[max(0, days - 31)], monthTo = dayNames[days - 1]
                    var querySeconds: [Double] = [], monthSeconds: [Double] = []
                    var monthRows = 0
                    for _ in 0..<5 {
                        let queryStart = ContinuousClock.now
                        monthRows = try await client.query("SELECT count(*)::int FROM ledger_apple_sales(\(monthFrom)::date, \(monthTo)::date)", logger: logger)
                            .collect().first!.decode(Int.self)
                        querySeconds.append((ContinuousClock.now - queryStart).inSeconds)
                        let monthStart = ContinuousClock.now
                        _ = try await AppleSalesComparison.make(database: database, from: monthFrom, to: monthTo)
                        monthSeconds.append((ContinuousClock.now - monthStart).inSeconds)
                    }
                    let differing = year.rows.filter { $0.purchaseDifference != 0 }.count
                    return Figures(
                        importSeconds: importSeconds, fetched: fetched.new.count, lines: reportLines, fetchSeconds: fetchSeconds, compareSeconds: compareSeconds,
                        yearRows: year.rows.count, differing: differing, monthRows: monthRows, querySeconds: querySeconds.sorted()[2],
                        monthSeconds: monthSeconds.sorted()[2])
                }
            }
            let copySeconds = try BenchImport.copyBaseline(
                bench, work: work, table: "apple_sales_rows",
                columns: "vendor_number, report_date, version, revision, line, sku, parent_identifier, product_type, units, country_code")
                + BenchImport.copyBaseline(bench, work: work, table: "apple_sales_fields", columns: "vendor_number, report_date, version, revision, line, fields")

            print("A year of App Store Connect daily sales reports (\(days) days, \(products) products in \(storefrontCount) storefronts, \(figures.lines) lines) fetched from the stand-in, stored and compared with a ledger of \(orders) orders (made by the history import in \(format(figures.importSeconds, decimals: 1)) s, not counted)")
            printTableHeader(["step", "days", "lines", "seconds", "lines/s"], leftAligned: [0])
            printTableRow(["fetch and store (`ledger sales fetch`)", "\(figures.fetched)", "\(figures.lines)", format(figures.fetchSeconds, decimals: 1), format(Double(figures.lines) / max(figures.fetchSeconds, 0.001))])
            printTableRow(["`\\copy` of the stored lines into copies of their two tables", "-", "\(figures.lines)", format(copySeconds, decimals: 1), format(Double(figures.lines) / max(copySeconds, 0.001))])
            printTableRow(["the comparison, the whole year (`ledger report apple`)", "\(days)", "\(figures.yearRows) rows", format(figures.compareSeconds, decimals: 2), "-"])
            printTableRow(["the comparison query alone, one month (in the database; median of 5)", "31", "\(figures.monthRows) rows", format(figures.querySeconds, decimals: 3), "-"])
            printTableRow(["the comparison, one month, read into the report (median of 5)", "31", "\(figures.monthRows) rows", format(figures.monthSeconds, decimals: 3), "-"])
            print("Fetch, store and compare the year: \(format(figures.fetchSeconds + figures.compareSeconds, decimals: 1)) s (target 60 s); ratio fetch and store / COPY: \(format(copySeconds / max(figures.fetchSeconds, 0.001), decimals: 2)); rows that differ: \(figures.differing) (Apple's extra purchases, one every 997th)")
        }
    }

    struct Figures: Sendable {
        var importSeconds: Double
        var fetched: Int
        var lines: Int
        var fetchSeconds: Double
        var compareSeconds: Double
        var yearRows: Int
        var differing: Int
        var monthRows: Int
        var querySeconds: Double
        var monthSeconds: Double
    }
}
