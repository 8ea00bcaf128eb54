import Foundation
@testable import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// The rebuild writes its rows in binary COPY; the writer sends them to `append_events`, times as
/// microseconds (`PostgresTime`). Both must store the same values, down to a numeric's scale and
/// a timestamp's microseconds.
@Suite("Binary COPY stores what bound parameters store")
struct BinaryCopyTests {
    struct Value {
        var name: String?
        var big: Int64
        var price: String?
        var token: UUID?
        var at: Date?
        var body: String?
    }

    static let values: [Value] = [
        "0", "0.99", "0.990", "12", "1000.5", "0.0001", "0.00001", "00012.50", "123456789012345678.123456789", "99999999", "10000",
        "-5", "-0.99", "-1000.0001",
    ].enumerated().map { index, price in
        Value(name: "name-\(index) ü €", big: Int64(index) * 1_000_000_007 - 3, price: price, token: UUID(),
              at: Date(timeIntervalSince1970: 1_800_000_000.123456 + Double(index) * 86_400.000_001),
              body: #"{"a": \#(index), "b": ["x", null]}"#)
    } + [
        Value(name: nil, big: .min, price: nil, token: nil, at: nil, body: nil),
        Value(name: "", big: .max, price: "0.5", token: UUID(), at: Date(timeIntervalSince1970: 0.5), body: "{}"),
    ]

    @Test("text, integers, numerics, UUIDs, timestamps, jsonb and NULLs")
    func sameAsBoundParameters() async throws {
        try await withTestDatabase { db in
            let connection = try await db.connect()
            let logger = TestServer.logger
            for table in ["copied", "bound"] {
                try await connection.query(
                    "CREATE TABLE \(unescaped: table) (id int4, name text, big int8, price numeric, token uuid, at timestamptz, body jsonb)",
                    logger: logger)
            }
            for (id, value) in Self.values.enumerated() {
                try await connection.query(
                    """
                    INSERT INTO bound VALUES (\(Int32(id)), \(value.name), \(value.big), \(value.price)::numeric, \(value.token),
                                              ledger_time(\(value.at.map(PostgresTime.microseconds))), \(value.body)::jsonb)
                    """,
                    logger: logger)
            }
            try await connection.copyBinary(schema: "public", table: "copied", columns: ["id", "name", "big", "price", "token", "at", "body"], logger: logger) { writer in
                var rows = BinaryCopyRows()
                for (id, value) in Self.values.enumerated() {
                    rows.row(columns: 7)
                    rows.int32(Int32(id))
                    rows.text(value.name)
                    rows.int64(value.big)
                    rows.numeric(value.price)
                    rows.uuid(value.token)
                    rows.timestamp(value.at)
                    rows.jsonb(value.body)
                    // Several buffers, as a large rebuild sends.
                    if id % 4 == 3 { try await rows.flush(to: writer) }
                }
                try await rows.finish(to: writer)
            }
            // As text, so a numeric's scale counts ("0.990" is not "0.99") and NULLs compare.
            let columns = "id, name, big, price::text, token::text, to_char(at, 'YYYY-MM-DD HH24:MI:SS.US'), body::text"
            let rows = try await connection.query(
                """
                SELECT count(*)::int,
                       (SELECT count(*)::int FROM (SELECT \(unescaped: columns) FROM copied EXCEPT SELECT \(unescaped: columns) FROM bound) AS only_copied),
                       (SELECT count(*)::int FROM (SELECT \(unescaped: columns) FROM bound EXCEPT SELECT \(unescaped: columns) FROM copied) AS only_bound),
                       (SELECT string_agg(price::text, ' ' ORDER BY id) FROM copied)
                FROM copied
                """,
                logger: logger)
            for try await (count, onlyCopied, onlyBound, prices) in rows.decode((Int, Int, Int, String).self) {
                #expect(count == Self.values.count)
                #expect(onlyCopied == 0)
                #expect(onlyBound == 0)
                #expect(prices == "0 0.99 0.990 12 1000.5 0.0001 0.00001 12.50 123456789012345678.123456789 99999999 10000 -5 -0.99 -1000.0001 0.5")
            }
            try await connection.close()
        }
    }
}
