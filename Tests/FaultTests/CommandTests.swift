import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// `ledger unmatch`, run as an operator runs it: the built executable against the database.
@Suite("ledger unmatch")
struct UnmatchCommandTests {
    @Test("undoes a support pairing from the command line, and says why when it cannot")
    func undoesFromTheCommandLine() async throws {
        try await withTestDatabase { db in
            let metadata = Data(#"{"appendedBy":"test"}"#.utf8)
            let receipts = ReceiptLedger(orders: OrderLedger(writer: LedgerWriter(database: db.database)))
            let orderID = OrderID(unchecked: "cli-order")
            _ = try await receipts.orders.create(
                orderID, OrderCreated(userId: UserID(unchecked: "cli-user"), productId: ProductID(unchecked: "gems.100")),
                tokenGiven: false, metadata: metadata)
            let transaction = AppleTransaction(
                transactionId: TransactionID(unchecked: "7000001"), originalTransactionId: "7000001", productId: ProductID(unchecked: "gems.100"),
                purchaseDate: Date(), environment: "Sandbox", bundleId: "com.example.game", format: .jws,
                receiptSha256: String(repeating: "ab", count: 32))
            let pooled = try await receipts.apply(transaction, claim: .init(userId: UserID(unchecked: "cli-user"), orderId: nil), metadata: metadata)
            #expect(pooled.outcome == .unmatched)
            let paired = try await SupportDesk(receipts: receipts).match(
                transaction.transactionId, to: orderID, force: false, reason: nil, metadata: metadata)
            #expect(paired.state == .verified)

            let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-unmatch-\(UUID().uuidString.prefix(8))")
            try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: work) }
            let environment = ["LEDGER_DATABASE_URL": db.configuration.url, "LEDGER_LOG_LEVEL": "warning", "USER": "support-ann"]
            let (status, output) = try await LedgerChild.run(
                ["unmatch", "7000001", "--reason", "wrong character"], environment: environment, log: work.appendingPathComponent("1.log"))
            #expect(status == 0, "\(output)")
            #expect(output.contains("order cli-order is created again"), "\(output)")
            let order = try #require(try await receipts.orders.order(orderID))
            #expect(order.state == .created && order.transactionId == nil)
            let appendedBy = try await scalarText(db, "SELECT metadata->>'appendedBy' FROM events WHERE type = 'pairing-undone'")
            #expect(appendedBy == "ledger unmatch (support-ann)")

            let (again, refusal) = try await LedgerChild.run(
                ["unmatch", "7000001", "--reason", "again"], environment: environment, log: work.appendingPathComponent("2.log"))
            #expect(again != 0)
            #expect(refusal.contains("is paired with no order"), "\(refusal)")
        }
    }

    func scalarText(_ db: TestDatabase, _ query: PostgresQuery) async throws -> String? {
        for try await value in try await db.client.query(query, logger: TestServer.logger).decode(String?.self) { return value }
        return nil
    }
}

/// `ledger lookup`, run as an operator runs it, against the stand-in App Store Server API.
@Suite("ledger lookup")
struct LookupCommandTests {
    @Test("takes an Apple order's purchases in from the command line; an unknown order is named")
    func looksUp() async throws {
        let apple = try TestApple()
        let standIn = AppStoreServerStandIn()
        try await withTestDatabase { db in
            let work = FileManager.default.temporaryDirectory.appendingPathComponent("ledger-lookup-\(UUID().uuidString.prefix(8))")
            try FileManager.default.createDirectory(at: work, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: work) }
            let keyFile = work.appendingPathComponent("key.p8").path
            try standIn.privateKeyPEM.write(toFile: keyFile, atomically: true, encoding: .utf8)
            await standIn.setOrder("MQ7CLI", [try await apple.sign(TestApple.transaction("9200001"))])
            try await standIn.run { base in
                let environment = [
                    "LEDGER_DATABASE_URL": db.configuration.url, "LEDGER_LOG_LEVEL": "warning",
                    "LEDGER_APPLE_ROOT_CERTS": apple.rootFile, "LEDGER_APPLE_BUNDLE_ID": TestApple.bundleId,
                    "LEDGER_APPLE_ENVIRONMENT": "Sandbox", "LEDGER_APPLE_API_KEY_ID": AppStoreServerStandIn.keyID,
                    "LEDGER_APPLE_API_ISSUER_ID": AppStoreServerStandIn.issuerID, "LEDGER_APPLE_API_PRIVATE_KEY": keyFile,
                    "LEDGER_APPLE_API_URL": base,
                ]
                let (status, output) = try await LedgerChild.run(
                    ["lookup", "MQ7CLI", "--user", "cli-user"], environment: environment, log: work.appendingPathComponent("1.log"))
                #expect(status == 0, "\(output)")
                #expect(output.contains("transaction 9200001, unmatched"), "\(output)")
                let (missing, refusal) = try await LedgerChild.run(
                    ["lookup", "MQ0000"], environment: environment, log: work.appendingPathComponent("2.log"))
                #expect(missing != 0)
                #expect(refusal.contains("apple-order-not-found"), "\(refusal)")
            }
        }
    }
}
