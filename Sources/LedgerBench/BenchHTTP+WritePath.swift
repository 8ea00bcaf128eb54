import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import PostgresNIO

extension BenchHTTP {
    /// The events each order is taken through after its creation, as of `date`: the event, and
    /// its data as the HTTP workload sends it.
    static func orderEvents(transaction: TransactionID, at date: Date) -> [(event: OrderEvent, data: String)] {
        let stamp = EventCoding.formatDate(date)
        let receipt = ReceiptReceived(
            transactionId: transaction, productId: ProductID(unchecked: "gems.100"), purchaseDate: date,
            receiptSha256: String(repeating: "ab", count: 32), format: .jws, matchedBy: .applicationUsername)
        return [
            (.paymentAdded(PaymentAdded(queuedAt: date)), #"{"queuedAt":"\#(stamp)"}"#),
            (.receiptReceived(receipt), #"{"transactionId":"\#(transaction.rawValue)","productId":"gems.100","purchaseDate":"\#(stamp)","receiptSha256":"\#(receipt.receiptSha256)","format":"jws","matchedBy":"applicationUsername"}"#),
            (.verified(Verified(environment: "Sandbox")), #"{"environment":"Sandbox"}"#),
            (.delivered, "{}"),
            (.finished, "{}"),
        ]
    }

    /// The write path alone, measured: its latencies and CPU as an HTTP run's (no failures, no
    /// server process), and the group commits it made.
    struct WritePath {
        let measured: Measured
        let groups: Int
        let writes: Int

        var perGroup: Double { Double(writes) / Double(max(1, groups)) }
    }

    /// The HTTP workload's orders appended through `OrderLedger` in this process, with no HTTP,
    /// JSON, key or route: callers on the global executor, the writer on the connections' own
    /// loop, as `ledger serve` runs them. `seconds` after a 2 s warm-up.
    func writePath(_ configuration: PostgresClient.Configuration, concurrency: Int, seconds: Int) async throws -> WritePath {
        try await withWriterLoop(configuration, logger: benchLogger) { database, _ in
            let ledger = OrderLedger(writer: LedgerWriter(database: database))
            let run = UUID().uuidString.prefix(6)
            _ = try await Self.appendOrders(ledger, concurrency: concurrency, until: .now + .seconds(2), prefix: "alone-warm-\(run)")
            let before = ledger.writer.groupCommitStatistics
            let start = ContinuousClock.now
            let machine = MachineCPU.now()
            let postgres = ProcessCPU.postgresSeconds()
            let latencies = try await Self.appendOrders(ledger, concurrency: concurrency, until: .now + .seconds(Int64(seconds)), prefix: "alone-\(run)")
            let after = ledger.writer.groupCommitStatistics
            return WritePath(
                measured: Measured(
                    latencies: LatencySummary(operations: latencies.count, seconds: (ContinuousClock.now - start).inSeconds, latencies: latencies),
                    failures: 0, serverSeconds: 0, postgresSeconds: ProcessCPU.postgresSeconds() - postgres, machine: MachineCPU.now() - machine),
                groups: after.groups - before.groups, writes: after.writes - before.writes)
        }
    }

    /// Each caller creates an order, then appends its five events, one at a time, then the next
    /// order, until the deadline; answers every append's latency in ms.
    static func appendOrders(_ ledger: OrderLedger, concurrency: Int, until deadline: ContinuousClock.Instant, prefix: String) async throws -> [Double] {
        let metadata = Data(#"{"appendedBy":"bench","requestId":"bench"}"#.utf8)
        let ids = LoadEventIDs()
        return try await withThrowingTaskGroup(of: [Double].self) { group in
            for worker in 0..<concurrency {
                group.addTask {
                    var latencies: [Double] = []
                    var n = 0
                    let user = try UserID("u-\(worker)")
                    func timed(_ append: () async throws -> Void) async throws {
                        let started = ContinuousClock.now
                        try await append()
                        latencies.append((ContinuousClock.now - started).inSeconds * 1000)
                    }
                    while ContinuousClock.now < deadline {
                        let id = try OrderID("\(prefix)-\(worker)-\(n)")
                        let created = OrderCreated(userId: user, productId: ProductID(unchecked: "gems.100"), price: "0.99", currency: "USD")
                        try await timed { _ = try await ledger.create(id, created, tokenGiven: false, metadata: metadata) }
                        for (index, (event, data)) in orderEvents(transaction: try TransactionID("t-\(id.rawValue)"), at: Date()).enumerated() {
                            try await timed {
                                _ = try await ledger.append(
                                    id, event: event, eventID: ids.id(worker: worker, index: n * 8 + index), expected: nil, data: Data(data.utf8),
                                    metadata: metadata)
                            }
                        }
                        n += 1
                    }
                    return latencies
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
    }
}
