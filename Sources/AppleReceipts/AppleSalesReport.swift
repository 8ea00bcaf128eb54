import CompressNIO
import Foundation
import NIOCore

/// A daily sales report of App Store Connect (SALES / SUMMARY / DAILY): the gzip'd tab-separated
/// file Apple sends, decompressed (compress-nio) and read by its header's column names, since
/// Apple adds and moves columns from one version to the next (`Order Type`, …).
public struct AppleSalesReport: Sendable, Equatable {
    /// One line of the report: every column as Apple wrote it, by its header's name.
    public struct Row: Sendable, Equatable {
        public var fields: [String: String]

        /// The in-app purchase's product id (`SKU`).
        public var sku: String { fields["SKU"] ?? "" }
        /// The app's SKU, for an in-app purchase (`Parent Identifier`).
        public var parentIdentifier: String { fields["Parent Identifier"] ?? "" }
        /// Apple's product type (`IA1`, `IAY`, …).
        public var productType: String { fields["Product Type Identifier"] ?? "" }
        /// Units: purchases, and refunds as negative units.
        public var units: Int { Int(Double(fields["Units"] ?? "") ?? 0) }
        /// The storefront's country (ISO 3166 alpha-2).
        public var countryCode: String { fields["Country Code"] ?? "" }
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
        var lines = text.split(omittingEmptySubsequences: true, whereSeparator: { $0 == "\n" || $0 == "\r\n" })
        guard !lines.isEmpty else {
            throw AppStoreConnectError(code: "sales-report-malformed", message: "the sales report has no header line")
        }
        let header = lines.removeFirst().split(separator: "\t", omittingEmptySubsequences: false).map {
            $0.trimmingCharacters(in: .whitespaces)
        }
        for column in Self.requiredColumns where !header.contains(column) {
            throw AppStoreConnectError(code: "sales-report-malformed", message: "the sales report has no column \(column) (it has \(header.joined(separator: ", ")))")
        }
        self.header = header
        rows = lines.map { line in
            var fields: [String: String] = [:]
            for (name, value) in zip(header, line.split(separator: "\t", omittingEmptySubsequences: false)) {
                fields[name] = value.trimmingCharacters(in: .whitespaces)
            }
            return Row(fields: fields)
        }
    }
}
