import Foundation
import LedgerTestSupport
import Testing

/// `ledger import`, run as an operator runs it: the built executable against the database.
@Suite("ledger import")
struct ImportCommandTests {
    @Test("imports a history file and says what it did; again, nothing new; a refused line or file is named and the exit status says so")
    func importsFiles() async throws {
        try await withTestDatabase { db in
            let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-import-\(UUID().uuidString.prefix(8))")
            try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: work) }
            let csv = work.appendingPathComponent("history.csv").path
            try """
                orderId,userId,productId,createdAt,state,price,currency,transactionId,purchaseDate
                c-1,u-1,gems.100,2025-01-01T00:00:00Z,finished,0.99,USD,6100001,2025-01-01T00:00:10Z
                c-2,u-2,gems.100,2025-01-02T00:00:00Z,created,0.99,USD,,

                """.write(toFile: csv, atomically: true, encoding: .utf8)
            let jsonl = work.appendingPathComponent("granted.jsonl").path
            try """
                {"transactionId":"6100002","userId":"u-3","productId":"gems.100","purchaseDate":"2024-06-01T00:00:00Z"}
                {"orderId":"c-3","userId":"u-3","productId":"gems.100","createdAt":"2025-01-03T00:00:00Z","state":"finished","transactionId":"6100001","purchaseDate":"2025-01-03T00:00:10Z"}

                """.write(toFile: jsonl, atomically: true, encoding: .utf8)
            let environment = ["LEDGER_DATABASE_URL": db.configuration.url]
            var step = 0
            func ledger(_ arguments: [String]) async throws -> (Int32, String) {
                step += 1
                return try await LedgerChild.run(arguments, environment: environment, log: work.appendingPathComponent("\(step).log"))
            }

            let (first, output) = try await ledger(["import", csv])
            #expect(first == 0 && output.contains("history.csv: read 2, imported 2, already present 0, refused 0"), "\(output)")
            // The tables it grew are analysed: a report right after is planned for what they hold.
            #expect(try await scalarText(db, "SELECT (last_analyze IS NOT NULL)::text FROM pg_stat_user_tables WHERE relname = 'events'") == "true")
            let (again, againOutput) = try await ledger(["import", csv, jsonl])
            #expect(again == 2, "\(againOutput)")
            #expect(againOutput.contains("history.csv: read 2, imported 0, already present 2, refused 0"), "\(againOutput)")
            #expect(againOutput.contains("granted.jsonl: read 2, imported 1, already present 0, refused 1"), "\(againOutput)")
            #expect(againOutput.contains("line 2: transaction-granted: Apple transaction 6100001 is granted to another order already"), "\(againOutput)")
            let (unknown, unknownOutput) = try await ledger(["import", work.appendingPathComponent("history.txt").path])
            #expect(unknown != 0 && unknownOutput.contains("neither .csv nor .jsonl"), "\(unknownOutput)")

            // A file refused as a whole (a column no import knows) stops the command before any
            // file is imported: the other file's new order stays out too.
            let coupons = work.appendingPathComponent("coupons.csv").path
            try "orderId,userId,coupon\nc-9,u-9,X\n".write(toFile: coupons, atomically: true, encoding: .utf8)
            let fresh = work.appendingPathComponent("fresh.jsonl").path
            try #"{"orderId":"c-8","userId":"u-8","productId":"gems.100","createdAt":"2025-01-04T00:00:00Z","state":"created"}"#
                .write(toFile: fresh, atomically: true, encoding: .utf8)
            let (refused, refusedOutput) = try await ledger(["import", fresh, coupons])
            #expect(refused == 65, "\(refusedOutput)")
            #expect(refusedOutput.contains("coupons.csv: coupon is not a column of an import") && refusedOutput.contains("nothing was imported"), "\(refusedOutput)")
            #expect(!refusedOutput.contains("Usage:"), "a file's problem, not the command line's: \(refusedOutput)")
            #expect(try await scalarText(db, "SELECT count(*)::text FROM orders WHERE order_id IN ('c-8', 'c-9')") == "0")
        }
    }
}
