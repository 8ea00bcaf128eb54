import Foundation
import Logging
import NIOCore
import PostgresNIO

/// Rows in PostgreSQL's binary `COPY` format, written a buffer at a time: the rebuild's bulk
/// write, several times cheaper for PostgreSQL than the same rows as `INSERT`s.
///
/// UUIDs go through postgres-nio's own encoder; times are rounded to PostgreSQL's microseconds as
/// the writer rounds them (`PostgresTime`), so a rebuilt row is bit for bit the row the writer wrote.
struct BinaryCopyRows {
    private(set) var buffer: ByteBuffer

    /// Rows are handed on a megabyte at a time, so PostgreSQL stores one buffer while the next
    /// is encoded.
    static let flushSize = 1 << 20
    /// Room for a flush's worth and the row that crosses it, so the buffer is not copied into a
    /// larger one on the way.
    static let capacity = flushSize + 1 << 18

    init() {
        buffer = ByteBufferAllocator().buffer(capacity: Self.capacity)
        buffer.writeBytes(Self.signature)
        buffer.writeInteger(Int32(0))  // flags
        buffer.writeInteger(Int32(0))  // header extension length
    }

    /// `PGCOPY\n\377\r\n\0`.
    static let signature: [UInt8] = [0x50, 0x47, 0x43, 0x4F, 0x50, 0x59, 0x0A, 0xFF, 0x0D, 0x0A, 0x00]

    mutating func row(columns: Int16) { buffer.writeInteger(columns) }

    mutating func null() { buffer.writeInteger(Int32(-1)) }

    /// A field whose bytes `write` appends, preceded by their length.
    private mutating func field(_ write: (inout ByteBuffer) -> Void) {
        let lengthAt = buffer.writerIndex
        buffer.writeInteger(Int32(0))
        write(&buffer)
        buffer.setInteger(Int32(buffer.writerIndex - lengthAt - 4), at: lengthAt)
    }

    mutating func text(_ value: String?) {
        guard let value else { return null() }
        field { $0.writeString(value) }
    }

    mutating func int32(_ value: Int32) { field { $0.writeInteger(value) } }
    mutating func int64(_ value: Int64) { field { $0.writeInteger(value) } }

    /// An `integer` column's value that may be absent.
    mutating func integer(_ value: Int?) {
        guard let value else { return null() }
        int32(Int32(clamping: value))
    }

    mutating func bool(_ value: Bool?) {
        guard let value else { return null() }
        field { $0.writeInteger(UInt8(value ? 1 : 0)) }
    }

    mutating func timestamp(_ value: Date?) {
        guard let value else { return null() }
        field { $0.writeInteger(PostgresTime.microseconds(value)) }
    }

    mutating func uuid(_ value: UUID?) {
        guard let value else { return null() }
        field { value.encode(into: &$0, context: .default) }
    }

    /// A jsonb value from its text: format version 1, then the text.
    mutating func jsonb(_ text: String?) {
        guard let text else { return null() }
        field {
            $0.writeInteger(UInt8(1))
            $0.writeString(text)
        }
    }

    /// A numeric from a plain decimal string (`"0.99"`, `"12"`, `"-5"`: a sign, digits, at most
    /// one point, as orders take prices), with the scale PostgreSQL's `numeric_in` gives it.
    mutating func numeric(_ text: String?) {
        guard var text else { return null() }
        let negative = text.hasPrefix("-")
        if negative { text.removeFirst() }
        let parts = text.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        let whole = String(parts[0].drop { $0 == "0" })
        let fraction = parts.count > 1 ? String(parts[1]) : ""
        // Base-10000 digits: the whole part padded on the left, the fraction on the right.
        let wholeDigits = String(repeating: "0", count: (4 - whole.count % 4) % 4) + whole
        let fractionDigits = fraction + String(repeating: "0", count: (4 - fraction.count % 4) % 4)
        func groups(_ digits: String) -> [Int16] {
            var result: [Int16] = []
            var value: Int16 = 0
            for (index, character) in digits.utf8.enumerated() {
                value = value * 10 + Int16(character - 0x30)
                if index % 4 == 3 { result.append(value); value = 0 }
            }
            return result
        }
        let wholeGroups = groups(wholeDigits)
        let digits = wholeGroups + groups(fractionDigits)
        field {
            $0.writeInteger(Int16(digits.count))
            $0.writeInteger(Int16(wholeGroups.count - 1))  // weight of the first digit
            $0.writeInteger(negative ? Int16(0x4000) : 0)  // sign: PostgreSQL's NUMERIC_NEG or NUMERIC_POS
            $0.writeInteger(Int16(fraction.count))  // display scale
            for digit in digits { $0.writeInteger(digit) }
        }
    }

    /// Hands the rows so far to `writer` and starts an empty buffer.
    mutating func flush(to writer: PostgresCopyFromWriter) async throws {
        try await writer.write(buffer)
        buffer = ByteBufferAllocator().buffer(capacity: Self.capacity)
    }

    /// Flushes once a flush's worth of rows is waiting.
    mutating func flushIfFull(to writer: PostgresCopyFromWriter) async throws {
        if buffer.readableBytes >= Self.flushSize { try await flush(to: writer) }
    }

    /// Ends the data with its trailer and hands the rest to `writer`.
    mutating func finish(to writer: PostgresCopyFromWriter) async throws {
        buffer.writeInteger(Int16(-1))
        try await flush(to: writer)
    }
}

extension PostgresConnection {
    /// `COPY schema.table (columns) FROM STDIN (FORMAT binary)`, with the rows `write` hands to
    /// the writer; answers what `write` answers.
    ///
    /// postgres-nio 1.33's `copyFrom` writes only `FORMAT text`, and puts the table name into the
    /// statement as given between double quotes; the name below closes those quotes and ends the
    /// statement with a comment. `schema`, `table` and `columns` are this module's constants.
    func copyBinary<Result>(
        schema: String, table: String, columns: [String], logger: Logger,
        _ write: (PostgresCopyFromWriter) async throws -> Result
    ) async throws -> Result {
        let target = "\(schema)\".\"\(table)\" (\(columns.joined(separator: ", "))) FROM STDIN (FORMAT binary) --"
        var result: Result?
        try await copyFrom(table: target, logger: logger) { writer in
            result = try await write(writer)
        }
        return result!
    }
}
