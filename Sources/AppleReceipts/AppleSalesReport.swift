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
            do {
                text = String(buffer: try buffer.decompress(with: .gzip(), maxSize: 1 << 30))
            } catch {
                throw AppStoreConnectError(code: "sales-report-malformed", message: "the sales report is not a gzip file Apple would send (\(error))")
            }
        } else {
            text = String(decoding: file, as: UTF8.self)
        }
        if text.hasPrefix("\u{FEFF}") { text.removeFirst() }
        self.text = Data(text.utf8)
        // Lines and columns split on their bytes (a tab and a newline are never part of a
        // character): a year of reports is a million lines.
        let bytes = Array(text.utf8)
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
            guard let count = Double(values[units]), count.isFinite, count.rounded() == count, abs(count) <= 1e12 else {
                throw AppStoreConnectError(
                    code: "sales-report-malformed", message: "line \(index + 2) of the sales report: Units is \"\(values[units])\", not a whole number")
            }
            rows.append(Row(
                values: values, sku: values[sku], parentIdentifier: values[parent], productType: values[type],
                units: Int(count), countryCode: values[country]))
        }
        self.rows = rows
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
