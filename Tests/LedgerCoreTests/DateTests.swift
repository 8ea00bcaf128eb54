import Foundation
import LedgerCore
import Testing

@Suite("ISO 8601 dates")
struct DateTests {
    @Test("parsing agrees with Foundation's ISO8601DateFormatter", arguments: [
        "2026-11-21T10:00:00Z", "2026-11-21T10:00:00.250Z", "2026-02-28T23:59:59.999Z", "2024-02-29T12:00:00+08:00",
        "1999-12-31T23:59:59-05:30", "2026-11-21T10:00:00.123456Z",
    ])
    func agreesWithFoundation(text: String) throws {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = text.contains(".") ? [.withInternetDateTime, .withFractionalSeconds] : [.withInternetDateTime]
        let expected = try #require(formatter.date(from: text))
        let parsed = try #require(LedgerJSON.parseDate(text))
        #expect(abs(parsed.timeIntervalSince1970 - expected.timeIntervalSince1970) < 0.001)
    }

    @Test("malformed or impossible dates are refused", arguments: [
        "", "2026-11-21", "2026-11-21 10:00:00Z", "2026-13-01T10:00:00Z", "2026-02-30T10:00:00Z", "2026-11-21T25:00:00Z",
        "2026-11-21T10:00:00", "2026-11-21T10:00:00.Z", "2026-11-21T10:00:00+0800", "2026-11-21T10:00:00Zjunk", "yesterday", "0001-06-01T00:00:00Z", "1969-12-31T23:59:59Z",
    ])
    func refused(text: String) {
        #expect(LedgerJSON.parseDate(text) == nil)
    }

    @Test("formatting is UTC with milliseconds and round-trips")
    func formatting() throws {
        let date = try #require(LedgerJSON.parseDate("2026-11-21T10:00:00.123+01:00"))
        #expect(LedgerJSON.formatDate(date) == "2026-11-21T09:00:00.123Z")
        #expect(LedgerJSON.formatDate(Date(timeIntervalSince1970: 0)) == "1970-01-01T00:00:00.000Z")
        for seconds in stride(from: 0.0, to: 2_000_000_000, by: 123_456_789.125) {
            let original = Date(timeIntervalSince1970: seconds)
            #expect(LedgerJSON.parseDate(LedgerJSON.formatDate(original)) == original)
        }
        #expect(LedgerJSON.formatDate(Date(timeIntervalSince1970: 59.9996)) == "1970-01-01T00:01:00.000Z")
        #expect(LedgerJSON.formatDate(Date(timeIntervalSince1970: 253_402_300_800)) == "10000-01-01T00:00:00.000Z")
        let foundation = ISO8601DateFormatter()
        foundation.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        for seconds in stride(from: 0.0, to: 4_000_000_000, by: 86_399_999.937) {
            let date = Date(timeIntervalSince1970: seconds)
            #expect(LedgerJSON.formatDate(date) == foundation.string(from: date), "\(seconds)")
        }
    }
}
