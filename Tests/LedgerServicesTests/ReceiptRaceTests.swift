import Foundation
import LedgerCore
import LedgerServices
import LedgerStore
import LedgerTestSupport
import Testing

/// Receipts racing through the common case (group commit, no locks while reading) and the
/// locked path: the database decides, and the answers say what it decided.
@Suite("Receipts racing each other")
struct ReceiptRaceTests {
    let metadata = Data(#"{"appendedBy":"test"}"#.utf8)

    func transaction(_ id: String, token: UUID? = nil) -> AppleTransaction {
        AppleTransaction(
            transactionId: TransactionID(unchecked: id), originalTransactionId: id, productId: ProductID(unchecked: "gems.100"),
            purchaseDate: Date(), environment: "Sandbox", bundleId: "com.example.game", appAccountToken: token, format: .jws,
            receiptSha256: String(repeating: "cd", count: 32))
    }

    @Test("one transaction sent for 16 orders at once, each through its own client: one order gets it, 15 fail as duplicates")
    func oneTransactionManyOrders() async throws {
        try await withTestDatabase { db in
            let services = ServiceAssembly(database: db.database)
            let receipts = services.receipts
            for index in 0..<16 {
                _ = try await services.orders.create(
                    OrderID(unchecked: "race-\(index)"), OrderCreated(userId: UserID(unchecked: "u-race"), productId: ProductID(unchecked: "gems.100")),
                    tokenGiven: false, metadata: metadata)
            }
            let paid = transaction("5100001")
            let groupWrites = services.writer.groupCommitStatistics.writes
            let answers = try await withThrowingTaskGroup(of: ReceiptLedger.Answer.self) { group in
                for index in 0..<16 {
                    group.addTask {
                        try await receipts.apply(paid, claim: .init(userId: nil, orderId: OrderID(unchecked: "race-\(index)")), metadata: metadata)
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(answers.count == 16)
            #expect(services.writer.groupCommitStatistics.writes - groupWrites >= 16, "each went the common case first")
            #expect(answers.filter { $0.outcome == .matched }.count == 1, "\(answers.map(\.outcome))")
            #expect(answers.filter { $0.outcome == .duplicate }.count == 15, "\(answers.map(\.outcome))")
            let orders = try await (0..<16).asyncMap { try await services.orders.order(OrderID(unchecked: "race-\($0)")) }
            #expect(orders.compactMap { $0 }.filter { $0.transactionId == paid.transactionId }.count == 1)
            #expect(orders.compactMap { $0 }.filter { $0.state == .failed }.count == 15)
        }
    }

    @Test("one proof sent 16 times at once for its order: matched every time, stored once")
    func oneProofManyTimes() async throws {
        try await withTestDatabase { db in
            let services = ServiceAssembly(database: db.database)
            let receipts = services.receipts
            let created = try await services.orders.create(
                OrderID(unchecked: "again"), OrderCreated(userId: UserID(unchecked: "u-again"), productId: ProductID(unchecked: "gems.100")),
                tokenGiven: false, metadata: metadata)
            let paid = transaction("5100002", token: created.order.appAccountToken)
            let answers = try await withThrowingTaskGroup(of: ReceiptLedger.Answer.self) { group in
                for index in 0..<16 {
                    // Half name the order, half are found by their token.
                    let claim = ReceiptLedger.Claim(userId: nil, orderId: index % 2 == 0 ? OrderID(unchecked: "again") : nil)
                    group.addTask { try await receipts.apply(paid, claim: claim, metadata: metadata) }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(answers.count == 16 && answers.allSatisfy { $0.outcome == .matched && $0.orderId == OrderID(unchecked: "again") }, "\(answers)")
            let order = try #require(try await services.orders.order(OrderID(unchecked: "again")))
            #expect(order.state == .verified && order.version == 2)
        }
    }
}

extension Sequence {
    fileprivate func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for element in self { out.append(try await transform(element)) }
        return out
    }
}
