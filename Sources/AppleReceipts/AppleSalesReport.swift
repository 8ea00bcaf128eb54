import CompressNIO
import Foundation
import NIOCore

/// A daily sales report of App Store Connect (SALES / SUMMARY / DAILY): the gzip'd tab-separated
/// file Apple sends, decompressed (compress-nio) and read by its header's column names, since
/// Apple adds and moves columns from one version to the next (`Order Type`, …).
public struct AppleSalesReport: Sendable, Equatable {
    /// One line of the report: every column as Apple wrote it, in the header's order (`values`),
    /// and the columns the ledger reads.
    public struct Row: Sendable, Equatable {
        /// Each column's value, one per header column ('' where the line stops short).
        public var values: [String]
        /// The in-app purchase's product id (`SKU`).
        public var sku: String
        /// The app's SKU, for an in-app purchase (`Parent Identifier`).
        public var parentIdentifier: String
        /// Apple's product type (`IA1`, `IAY`, …).
        public var productType: String
        /// Units: purchases, and refunds as negative units.
        public var units: Int
        /// The storefront's country (ISO 3166 alpha-2).
        public var countryCode: String
    }

    public let header: [String]
    public let rows: [Row]
    /// The report's text, decompressed: what a restatement changes (a file compressed again
    /// differs in its gzip header alone).
    public let text: Data

    /// The columns a report must have for the ledger to compare it.
    public static let requiredColumns = ["SKU", "Parent Identifier", "Units", "Country Code", "Product Type Identifier"]

    /// Reads a report file as Apple sends it: gzip'd (or, from some tools, already plain).
    public init(file: Data) throws(AppStoreConnectError) {
        var text: String
        if file.starts(with: [0x1F, 0x8B]) {
            var buffer = ByteBuffer(data: file)
            let plain: ByteBuffer
            do {
                plain = try buffer.decompress(with: .gzip(), maxSize: 1 << 30)
            } catch {
                throw AppStoreConnectError(code: "sales-report-malformed", message: "the sales report is not a gzip file Apple would send (\(error))")
            }
            // compress-nio stops at the end of the data it was given, or of the first gzip member,
            // without asking for the member's trailer: a file cut short read as a shorter report.
            // Its last eight bytes must be the trailer of all it held (CRC-32 and length).
            guard Self.trailerMatches(Array(file.suffix(8)), plain.readableBytesView) else {
                throw AppStoreConnectError(
                    code: "sales-report-malformed",
                    message: "the sales report's gzip file is cut short or damaged: its end is not the checksum of what it holds")
            }
            text = String(buffer: plain)
        } else {
            text = String(decoding: file, as: UTF8.self)
        }
        if text.hasPrefix("\u{FEFF}") { text.removeFirst() }
        self.text = Data(text.utf8)
        // Lines and columns split on their bytes (a tab and a newline are never part of a
        // character): a year of reports is a million lines.
        let bytes = Array(text.utf8)
        if let nul = bytes.firstIndex(of: 0) {
            let line = bytes[..<nul].count { $0 == UInt8(ascii: "\n") } + 1
            throw AppStoreConnectError(code: "sales-report-malformed", message: "line \(line) of the sales report holds a NUL character, which no report of Apple's does")
        }
        var lines = bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: true).map { line in
            line.last == UInt8(ascii: "\r") ? line.dropLast() : line
        }.filter { !$0.isEmpty }
        guard !lines.isEmpty else {
            throw AppStoreConnectError(code: "sales-report-malformed", message: "the sales report has no header line")
        }
        let header = Self.columns(lines.removeFirst())
        for column in Self.requiredColumns where !header.contains(column) {
            throw AppStoreConnectError(code: "sales-report-malformed", message: "the sales report has no column \(column) (it has \(header.joined(separator: ", ")))")
        }
        self.header = header
        let at = Dictionary(header.enumerated().map { ($1, $0) }, uniquingKeysWith: { first, _ in first })
        let (sku, parent, type, units, country) = (at["SKU"]!, at["Parent Identifier"]!, at["Product Type Identifier"]!, at["Units"]!, at["Country Code"]!)
        var rows: [Row] = []
        rows.reserveCapacity(lines.count)
        for (index, line) in lines.enumerated() {
            var values = Self.columns(line)
            if values.count < header.count { values += Array(repeating: "", count: header.count - values.count) }
            if values.count > header.count { values.removeLast(values.count - header.count) }
            // Apple's units are whole numbers (refunds negative); anything else is no report of
            // Apple's (a proxy's page, a damaged file), never a count of 0 nor a crash.
            guard let count = Double(values[units]), count.isFinite, count.rounded() == count, abs(count) <= Double(Int32.max) else {
                throw AppStoreConnectError(
                    code: "sales-report-malformed",
                    message: "line \(index + 2) of the sales report: Units is \"\(values[units])\", not a whole number of at most \(Int32.max)")
            }
            rows.append(Row(
                values: values, sku: values[sku], parentIdentifier: values[parent], productType: values[type],
                units: Int(count), countryCode: values[country]))
        }
        self.rows = rows
    }

    /// Whether `trailer` (a gzip file's last eight bytes) is that of `content`: its CRC-32 and its
    /// length modulo 2^32, little-endian (RFC 1952).
    static func trailerMatches(_ trailer: [UInt8], _ content: some Sequence<UInt8>) -> Bool {
        guard trailer.count == 8 else { return false }
        func word(_ at: Int) -> UInt32 { (0..<4).reduce(0) { $0 | UInt32(trailer[at + $1]) << (8 * $1) } }
        var crc: UInt32 = 0xFFFF_FFFF
        var length: UInt32 = 0
        for byte in content {
            crc = crcTable[Int((crc ^ UInt32(byte)) & 0xFF)] ^ (crc >> 8)
            length &+= 1
        }
        return ~crc == word(0) && length == word(4)
    }

    /// CRC-32's table (the reflected polynomial 0xEDB88320, as gzip's).
    static let crcTable: [UInt32] = (0..<256).map { index in
        (0..<8).reduce(UInt32(index)) { crc, _ in crc & 1 == 1 ? 0xEDB8_8320 ^ (crc >> 1) : crc >> 1 }
    }

    /// Refuses a report whose lines say they are of another day than `day` (`YYYY-MM-DD`) in
    /// their `Begin Date` (Apple's `MM/DD/YYYY`): a proxy or cache that answers every day with
    /// one day's report would count that day's sales on every other. A date the ledger cannot
    /// read is left alone.
    public func check(day: String) throws(AppStoreConnectError) {
        guard let begin = header.firstIndex(of: "Begin Date") else { return }
        let parts = day.split(separator: "-").compactMap { Int($0) }
        guard parts.count == 3 else { return }
        let (year, month, date) = (parts[0], parts[1], parts[2])
        let apple = String(format: "%02d/%02d/%04d", month, date, year)
        for (index, row) in rows.enumerated() {
            let value = row.values[begin]
            // Read as numbers (11/5/2026 is 11/05/2026); anything else is left alone.
            let fields = value.split(separator: "/").map { $0.allSatisfy({ $0.isASCII && $0.isNumber }) ? Int($0) : nil }
            guard fields.count == 3, let m = fields[0], let d = fields[1], let y = fields[2] else { continue }
            guard (m, d, y) != (month, date, year) else { continue }
            throw AppStoreConnectError(
                code: "sales-report-malformed",
                message: "line \(index + 2) of the sales report is of \(value) (Begin Date), not of \(apple), the day asked for")
        }
    }

    /// A line's tab-separated columns, each without the spaces around it.
    static func columns(_ line: ArraySlice<UInt8>) -> [String] {
        line.split(separator: UInt8(ascii: "\t"), omittingEmptySubsequences: false).map { column in
            var column = column
            while column.first == UInt8(ascii: " ") { column = column.dropFirst() }
            while column.last == UInt8(ascii: " ") { column = column.dropLast() }
            return String(decoding: column, as: UTF8.self)
        }
    }
}
