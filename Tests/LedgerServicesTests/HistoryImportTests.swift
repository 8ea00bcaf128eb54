import Foundation
import LedgerCore
import LedgerJSON
import LedgerServices
import LedgerStore
import LedgerTestSupport
import Testing

/// The import's batches in flight at once (issue 41): a line that shares an order or a
/// transaction with a batch still being stored waits for it, so the file's first line wins.
@Suite("History import batches")
struct HistoryImportTests {
    @Test("small batches, two in flight: each transaction goes to its first line's order, every time")
    func firstLineWins() async throws {
        try await withTestDatabase { db in
            var text = "orderId,userId,productId,createdAt,state,transactionId,purchaseDate\n"
            for index in 0..<40 {
                // Every fifth order reuses the transaction of the order two lines before it.
                let transaction = index % 5 == 4 ? 8_000_000 + index - 2 : 8_000_000 + index
                text += "b-\(index),u-\(index % 7),gems.100,2025-01-01T00:00:00Z,finished,\(transaction),2025-01-01T00:00:10Z\n"
            }
            var history = HistoryImport(orders: ServiceAssembly(database: db.database).orders)
            history.batchSize = 2
            let file = try HistoryFile(Data(text.utf8), format: .csv)
            let summary = try await history.run(file.lines, source: "batches.csv")
            #expect(summary.imported == 32 && summary.refused == 8, "\(summary)")
            #expect(summary.refusals.map(\.line) == (0..<40).filter { $0 % 5 == 4 }.map { $0 + 2 }, "\(summary)")
            #expect(summary.refusals.allSatisfy { $0.code == "transaction-granted" }, "\(summary)")
            let again = try await history.run(file.lines, source: "batches.csv")
            #expect(again.imported == 0 && again.alreadyPresent == 32 && again.refused == 8, "\(again)")
        }
    }

    @Test("each imported event's metadata names the file as given, whatever it holds, its line, and when the event happened")
    func metadataNamesTheFile() async throws {
        try await withTestDatabase { db in
            let source = "exports/2025 \"Q1\" \\ backup\tü.csv"
            let text = "orderId,userId,productId,createdAt,state,transactionId,purchaseDate\n"
                + "m-1,u-1,gems.100,2025-01-01T00:00:00Z,finished,8100001,2025-01-01T00:00:10.5Z\n"
            let history = HistoryImport(orders: ServiceAssembly(database: db.database).orders)
            let summary = try await history.run(try HistoryFile(Data(text.utf8), format: .csv).lines, source: source)
            #expect(summary.imported == 1, "\(summary)")
            let rows = try await db.client.query(
                "SELECT type, metadata::text FROM events WHERE stream_id = 'order-m-1' ORDER BY stream_version", logger: TestServer.logger)
            var seen: [String] = []
            for try await (type, stored) in rows.decode((String, String).self) {
                let metadata = try #require(try JSONSerialization.jsonObject(with: Data(stored.utf8)) as? [String: Any])
                let origin = try #require(metadata["importedFrom"] as? [String: Any])
                #expect(metadata["appendedBy"] as? String == "import" && metadata.count == 2, "\(stored)")
                #expect(origin["source"] as? String == source && origin["line"] as? Int == 2 && origin.count == 3, "\(stored)")
                let at = type == "created" ? "2025-01-01T00:00:00.000Z" : "2025-01-01T00:00:10.500Z"
                #expect(origin["at"] as? String == at, "\(type): \(stored)")
                seen.append(type)
            }
            #expect(seen == ["created", "receipt-received", "verified", "delivered", "finished"])
        }
    }
}
