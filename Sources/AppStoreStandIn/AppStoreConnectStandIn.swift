import AppleReceipts
import CompressNIO
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import JWTKit
import NIOCore

/// A stand-in for the App Store Connect API's sales reports (`GET /v1/salesReports`) on a local
/// port, for the tests and `ledger demo`. It checks each request as Apple does: the ES256 token
/// (the Team key's public half, `kid`, `iss`, audience `appstoreconnect-v1`, at most 20 minutes
/// between `iat` and `exp`, expiring at most 20 minutes ahead of its clock, not expired),
/// `Accept: application/a-gzip` (406 otherwise), the filters (`DAILY`, `SALES`, `SUMMARY`, its
/// vendor number, a version it knows, a date within the last 365 days). It serves the reports a
/// test made (gzip'd, tab-separated), "no sales" (404) for a day with none, "not available yet"
/// (404) for a day not published, and plays the faults a test queued (429 with `Retry-After`,
/// 500). A test may restate a day by making it again.
public final class AppStoreConnectStandIn: Sendable {
    public enum Fault: Sendable {
        /// 429 with `Retry-After` in seconds.
        case tooManyRequests(retryAfterSeconds: Int)
        case serverError
    }

    public static let keyID = "ASCSTANDIN1"
    public static let issuerID = "69a6de70-03db-47e3-e053-5b8c7c11a4d1"
    public static let versions = ["1_0"]

    public let vendorNumber: String
    public let privateKeyPEM: String
    let publicKey: P256.Signing.PublicKey
    let state = State()
    /// How far Apple's clock is behind this machine's (a server's clock a little ahead of Apple's).
    public let clockBehind: TimeInterval

    public init(vendorNumber: String = "85000000", clockBehind: TimeInterval = 0) {
        let key = P256.Signing.PrivateKey()
        self.vendorNumber = vendorNumber
        self.clockBehind = clockBehind
        self.privateKeyPEM = key.pemRepresentation
        self.publicKey = key.publicKey
    }

    /// The client's settings for this stand-in at `baseURL`.
    public func settings(baseURL: String) -> AppStoreConnectAPI.Settings {
        .init(keyID: Self.keyID, issuerID: Self.issuerID, privateKeyPEM: privateKeyPEM, vendorNumber: vendorNumber, baseURL: baseURL,
              backoff: .milliseconds(10), longestBackoff: .milliseconds(40))
    }

    /// The report of `day` (`YYYY-MM-DD`): its tab-separated text, served gzip'd; made again, the
    /// day is restated.
    public func setReport(_ day: String, tsv: String) async { await state.setReport(day, tsv) }
    /// The file served for `day` as it is, not made from a report: one damaged on its way.
    public func setReportFile(_ day: String, file: Data) async { await state.setFile(day, file) }
    /// `text` gzip'd, as the stand-in serves a report.
    public static func gzip(_ text: String) throws -> Data {
        var plain = ByteBuffer(string: text)
        return Data(buffer: try plain.compress(with: .gzip()))
    }
    /// A day answered "no sales" again (a report Apple took back, or one it had not counted yet).
    public func removeReport(_ day: String) async { await state.removeReport(day) }
    /// A day Apple has not published yet.
    public func setUnpublished(_ day: String) async { await state.setUnpublished(day, true) }
    public func publish(_ day: String) async { await state.setUnpublished(day, false) }
    public func queue(_ faults: [Fault]) async { await state.queue(faults) }
    /// The days asked for, in order (every request that passed the checks).
    public var asked: [String] { get async { await state.asked } }
    public var requests: Int { get async { await state.requests } }

    /// A report's text in Apple's columns (those of version 1_0 the ledger reads, and some it
    /// does not) from rows of (SKU, parent identifier, product type, units, country code).
    public static func tsv(_ rows: [(sku: String, parent: String, type: String, units: Int, country: String)], day: String) -> String {
        let date = day.split(separator: "-")
        let apple = date.count == 3 ? "\(date[1])/\(date[2])/\(date[0])" : day
        var text = "Provider\tProvider Country\tSKU\tDeveloper\tTitle\tVersion\tProduct Type Identifier\tUnits\tDeveloper Proceeds\tBegin Date\tEnd Date\tCustomer Currency\tCountry Code\tCurrency of Proceeds\tApple Identifier\tCustomer Price\tPromo Code\tParent Identifier\tSubscription\tPeriod\tCategory\tCMB\tDevice\tSupported Platforms\tProceeds Reason\tPreserved Pricing\tClient\tOrder Type\n"
        for row in rows {
            text += "APPLE\tUS\t\(row.sku)\tExample Studio\t\(row.sku)\t\t\(row.type)\t\(row.units)\t0.7\t\(apple)\t\(apple)\tUSD\t\(row.country)\tUSD\t1\t0.99\t\t\(row.parent)\t\t\tGames\t\tiPhone\tiOS\t\t\t\t\n"
        }
        return text
    }

    /// Runs the stand-in for the duration of `body`, which gets its base URL.
    public func run<T: Sendable>(_ body: @Sendable (_ baseURL: String) async throws -> T) async throws -> T {
        let router = Router()
        router.get("/v1/salesReports") { request, _ -> Response in try await self.answer(request) }
        return try await serveStandIn(router) { bound in try await body("http://127.0.0.1:\(bound)") }
    }

    func answer(_ request: Request) async throws -> Response {
        guard let token = request.headers[.authorization].flatMap({ $0.hasPrefix("Bearer ") ? String($0.dropFirst(7)) : nil }),
              await problem(with: token) == nil else {
            return Self.error(401, "NOT_AUTHORIZED", "Authentication credentials are missing or invalid.")
        }
        guard (request.headers[.accept] ?? "").contains("application/a-gzip") else {
            return Self.error(406, "NOT_ACCEPTABLE", "The provided Accept header is not supported for this request. Allowed: application/a-gzip")
        }
        if let fault = await state.nextFault() {
            switch fault {
            case .tooManyRequests(let seconds):
                var response = Self.error(429, "RATE_LIMIT_EXCEEDED", "The request rate limit has been reached.")
                response.headers[.retryAfter] = String(seconds)
                return response
            case .serverError:
                return Self.error(500, "UNEXPECTED_ERROR", "An unexpected error occurred on the server side.")
            }
        }
        // Keys and values percent-decoded, as Apple reads them (brackets sent either way).
        var query: [String: String] = [:]
        for pair in (request.uri.query ?? "").split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map { String($0).removingPercentEncoding ?? String($0) }
            if parts.count == 2 { query[parts[0]] = parts[1] }
        }
        func filter(_ name: String) -> String? { query["filter[\(name)]"] }
        for (name, expected) in [("frequency", "DAILY"), ("reportType", "SALES"), ("reportSubType", "SUMMARY")] where filter(name) != expected {
            return Self.error(400, "PARAMETER_ERROR.INVALID", "The parameter filter[\(name)] is \(filter(name) ?? "missing"); this stand-in serves \(expected).")
        }
        guard filter("vendorNumber") == vendorNumber else {
            return Self.error(403, "FORBIDDEN_ERROR", "You are not permitted to view reports of vendor \(filter("vendorNumber") ?? "-").")
        }
        guard let version = filter("version"), Self.versions.contains(version) else {
            return Self.error(400, "PARAMETER_ERROR.INVALID", "The version parameter you have specified is invalid. The latest version for this report is 1_0.")
        }
        guard let day = filter("reportDate"), let date = Self.day(day) else {
            return Self.error(400, "PARAMETER_ERROR.INVALID", "filter[reportDate] must be a date such as 2026-11-24.")
        }
        // Apple keeps the past 365 days, counted in Pacific time as its reports are.
        guard day >= Self.pacificDay(-365) else {
            return Self.error(400, "PARAMETER_ERROR.INVALID", "Daily reports are only available for past 365 days. Please enter a new date.")
        }
        await state.ask(day)
        if await state.unpublished.contains(day) || date > Date() || day >= Self.pacificDay(0) {
            return Self.error(404, "NOT_FOUND", "Report is not available yet. Daily reports for the Americas are available by 5 am Pacific Time.")
        }
        guard let tsv = await state.reports[day] else {
            return Self.error(404, "NOT_FOUND", "There were no sales for the date specified.")
        }
        let file = try await state.files[day] ?? Self.gzip(tsv)
        return Response(status: .ok, headers: [.contentType: "application/a-gzip"], body: .init(byteBuffer: ByteBuffer(data: file)))
    }

    /// Why a token is refused, or nil when Apple would take it.
    func problem(with token: String) async -> String? {
        let keys = JWTKeyCollection()
        do {
            await keys.add(ecdsa: try ES256PublicKey(backing: publicKey), kid: JWKIdentifier(string: Self.keyID))
            let (header, _, _) = try DefaultJWTParser().parse(Array(token.utf8), as: AppStoreConnectAPI.Claims.self)
            guard header.kid == Self.keyID, header.alg == "ES256" else { return "header" }
            let claims = try await keys.verify(token, as: AppStoreConnectAPI.Claims.self)
            // "Tokens that expire more than 20 minutes into the future are not valid", by Apple's clock.
            let now = Int(Date().timeIntervalSince1970 - clockBehind)
            guard claims.iss == Self.issuerID, claims.aud == "appstoreconnect-v1", claims.exp - claims.iat <= 1200,
                  claims.exp <= now + 1200, claims.exp > now, claims.iat <= now + 60 else { return "claims" }
            return nil
        } catch {
            return "\(error)"
        }
    }

    /// The day `offset` days from today's in Pacific time (`YYYY-MM-DD`).
    static func pacificDay(_ offset: Int) -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "America/Los_Angeles") ?? .gmt
        let parts = calendar.dateComponents([.year, .month, .day], from: calendar.date(byAdding: .day, value: offset, to: Date()) ?? Date())
        return String(format: "%04d-%02d-%02d", parts.year ?? 1970, parts.month ?? 1, parts.day ?? 1)
    }

    static func day(_ text: String) -> Date? {
        guard text.count == 10 else { return nil }
        return try? Date(text + "T00:00:00Z", strategy: Date.ISO8601FormatStyle())
    }

    static func error(_ status: Int, _ code: String, _ detail: String) -> Response {
        let body = #"{"errors":[{"id":"\#(UUID().uuidString)","status":"\#(status)","code":"\#(code)","title":"\#(code)","detail":"\#(detail)"}]}"#
        return Response(status: .init(code: status), headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: body)))
    }

    actor State {
        var reports: [String: String] = [:]
        /// Files served as they are, in place of a report made gzip'd (a damaged one).
        var files: [String: Data] = [:]
        var unpublished = Set<String>()
        var faults: [Fault] = []
        var asked: [String] = []
        var requests = 0

        func setReport(_ day: String, _ tsv: String) { (reports[day], files[day]) = (tsv, nil) }
        func setFile(_ day: String, _ file: Data) { (reports[day], files[day]) = ("", file) }
        func removeReport(_ day: String) { (reports[day], files[day]) = (nil, nil) }
        func setUnpublished(_ day: String, _ yes: Bool) { if yes { unpublished.insert(day) } else { unpublished.remove(day) } }
        func queue(_ more: [Fault]) { faults += more }
        func nextFault() -> Fault? {
            requests += 1
            return faults.isEmpty ? nil : faults.removeFirst()
        }
        func ask(_ day: String) { asked.append(day) }
    }
}
