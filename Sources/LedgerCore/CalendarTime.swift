import Foundation

/// The times the ledger takes from clients and import files: from 1970 (no App Store time is
/// older) to the end of 9999 (a four-digit year writes none later, and the ledger's JSON could not
/// read such a time back), on a day and at a time a calendar has.
public enum CalendarTime {
    /// 10000-01-01T00:00:00Z, the first time past the range.
    public static let end = Date(timeIntervalSince1970: 253_402_300_800)

    /// Whether `date` is within the range the ledger keeps.
    public static func isInRange(_ date: Date) -> Bool {
        date.timeIntervalSince1970 >= 0 && date < end
    }

    /// Whether the fields of an ISO 8601 time (`YYYY-MM-DDTHH:MM:SS` first, always) name a day of
    /// its month and a time of its day: Foundation's format styles roll `2026-11-31` or `T25:00`
    /// over into the next ones.
    public static func isCalendarTime(_ text: String) -> Bool {
        let bytes = Array(text.utf8.prefix(19))
        guard bytes.count == 19 else { return false }
        func number(_ range: Range<Int>) -> Int? {
            var value = 0
            for index in range {
                guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) else { return nil }
                value = value * 10 + Int(bytes[index] - UInt8(ascii: "0"))
            }
            return value
        }
        guard let year = number(0..<4), let month = number(5..<7), let day = number(8..<10),
              let hour = number(11..<13), let minute = number(14..<16), let second = number(17..<19),
              (1...12).contains(month), hour < 24, minute < 60, second < 60 else { return false }
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
        let days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1]
        return (1...days).contains(day)
    }
}
