import Foundation
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerServices
import LedgerStore

/// `GET /v1/reports/reconciliation?from=&to=` and `GET /v1/reports/apple?from=&to=` (Apple's
/// sales beside the ledger's): JSON, or CSV with `Accept: text/csv`.
struct ReportsController {
    let database: Database

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/v1/reports/reconciliation") { request, context in
            let query = request.uri.queryParameters
            let (from, to) = try ReportPeriod.parse(from: query["from"].map(String.init), to: query["to"].map(String.init))
            let report = try await ReconciliationReport.make(database: database, from: from, to: to, apps: context.keyApps)
            return try Self.answer(report, csv: report.csv, to: request, context: context)
        }
        router.get("/v1/reports/apple") { request, context in
            let query = request.uri.queryParameters
            let (from, to) = try ReportPeriod.days(from: query["from"].map(String.init), to: query["to"].map(String.init))
            let report = try await AppleSalesComparison.make(database: database, from: from, to: to, apps: context.keyApps)
            return try Self.answer(report, csv: report.csv, to: request, context: context)
        }
    }

    /// A report as JSON, or as CSV when the request accepts `text/csv` at least as well as
    /// `application/json` (RFC 9110 quality values; `q=0` refuses it).
    static func answer(_ report: some Encodable, csv: String, to request: Request, context: LedgerRequestContext) throws -> Response {
        if prefersCSV(request.headers[values: .accept]) {
            return Response(status: .ok, headers: [.contentType: "text/csv; charset=utf-8"], body: .init(byteBuffer: ByteBuffer(string: csv)))
        }
        return try EventCoding.encoder.encode(report, from: request, context: context)
    }

    /// Whether `accept` (the Accept headers' values) asks for CSV: `text/csv` with a quality above
    /// 0, and no lower than `application/json`'s.
    static func prefersCSV(_ accept: [String]) -> Bool {
        var quality: [String: Double] = [:]
        for range in accept.flatMap({ $0.split(separator: ",") }) {
            let parts = range.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
            guard let type = parts.first, !type.isEmpty else { continue }
            let q = parts.dropFirst().first(where: { $0.hasPrefix("q=") }).flatMap { Double($0.dropFirst(2)) } ?? 1
            quality[type] = max(quality[type] ?? 0, q)
        }
        guard let csv = quality["text/csv"], csv > 0 else { return false }
        return csv >= (quality["application/json"] ?? 0)
    }
}

/// A report's period from the caller's `from` and `to`: a day (`2026-11-01`, `to` then counts
/// that whole day) or an ISO 8601 time (`to` exclusive). Defaults: the last 30 days, to now.
public enum ReportPeriod {
    public static func parse(from: String?, to: String?, now: Date = Date()) throws(LedgerInputError) -> (Date, Date) {
        let start = try from.map { text throws(LedgerInputError) in try date(text, field: "from", endOfDay: false) } ?? now.addingTimeInterval(-30 * 86_400)
        let end = try to.map { text throws(LedgerInputError) in try date(text, field: "to", endOfDay: true) } ?? now.addingTimeInterval(1)
        guard start < end else { throw LedgerInputError(field: "to", problem: "must be after from") }
        return (start, end)
    }

    /// A period of whole days (`YYYY-MM-DD`, both included), as Apple's reports count them: a day
    /// or a time (its UTC day). Defaults, in Pacific time as Apple's days are: 30 days back, to
    /// yesterday (the last day Apple may have published).
    public static func days(from: String?, to: String?, now: Date = Date()) throws(LedgerInputError) -> (String, String) {
        func day(_ date: Date) -> String { String(date.formatted(Date.ISO8601FormatStyle()).prefix(10)) }
        let start = try from.map { text throws(LedgerInputError) in day(try date(text, field: "from")) } ?? SalesReportFetch.pacificDay(-30, from: now)
        // Without `to`, a `from` past Apple's last published day (its today in UTC) is that day alone.
        let end = try to.map { text throws(LedgerInputError) in day(try date(text, field: "to")) } ?? max(start, SalesReportFetch.lastPublishedDay(now: now))
        guard start <= end else { throw LedgerInputError(field: "to", problem: "must not be before from") }
        return (start, end)
    }

    /// A day (midnight UTC; with `endOfDay`, the next midnight) or an ISO 8601 time, as every
    /// option and query parameter that takes a time reads it; the problem names `field`.
    public static func date(_ text: String, field: String, endOfDay: Bool = false) throws(LedgerInputError) -> Date {
        // A time's `+02:00` written in a query unencoded arrives as a space (a query's `+`).
        let text = text.replacingOccurrences(of: " ", with: "+")
        if text.count == 10, let day = EventCoding.parseDate(text + "T00:00:00Z") {
            return endOfDay ? day.addingTimeInterval(86_400) : day
        }
        guard let date = EventCoding.parseDate(text) else {
            throw LedgerInputError(field: field, problem: "must be a day such as 2026-11-01 or an ISO 8601 time (a real one, from 1970 on)")
        }
        return date
    }
}
