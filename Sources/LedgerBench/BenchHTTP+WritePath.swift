import Foundation
import LedgerCore
import LedgerStore
import NIOPosix
import PostgresNIO

extension BenchHTTP {
    /// The events each order is taken through after its creation, as the HTTP workload sends
    /// them: type and data.
    static func orderEvents(transaction: String, at stamp: String) -> [(type: String, data: String)] {
        [
            ("payment-added", #"{"queuedAt":"\#(stamp)"}"#),
            ("receipt-received", #"{"transactionId":"\#(transaction)","productId":"gems.100","purchaseDate":"\#(stamp)","receiptSha256":"\#(String(repeating: "ab", count: 32))","format":"jws","matchedBy":"applicationUsername"}"#),
            ("verified", #"{"environment":"Sandbox"}"#),
            ("delivered", "{}"),
            ("finished", "{}"),
        ]
    }

    /// The write path alone, measured.
    struct WritePath {
        let operations: Int
        let seconds: Double
        let machine: MachineCPU
        let postgresSeconds: Double
        /// Writes per group-commit transaction.
        let perGroup: Double

        var perSecond: Double { seconds > 0 ? Double(operations) / seconds : 0 }
        var postgresMicroseconds: Double { operations > 0 ? postgresSeconds / Double(operations) * 1_000_000 : .nan }
    }

    /// The HTTP workload's orders appended through `OrderLedger` in this process, with no HTTP,
    /// JSON, key or route: callers on the global executor, the writer on the connections' own
    /// loop, as `ledger serve` runs them. `seconds` after a 2 s warm-up.
    func writePath(_ configuration: PostgresClient.Configuration, concurrency: Int, seconds: Int) async throws -> WritePath {
        let loop = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let measured: Result<WritePath, any Error>
        do {
            measured = .success(try await withPostgresClient(configuration, eventLoopGroup: loop, logger: benchLogger) { client in
                let database = Database(client: client, logger: benchLogger, writerExecutor: EventLoopTaskExecutor(loop.next()))
                let ledger = OrderLedger(writer: LedgerWriter(database: database))
                let run = UUID().uuidString.prefix(6)
                _ = try await Self.appendOrders(ledger, concurrency: concurrency, until: .now + .seconds(2), prefix: "alone-warm-\(run)")
                let groups = ledger.writer.groupCommitStatistics
                let start = ContinuousClock.now
                let machine = MachineCPU.now()
                let postgres = ProcessCPU.postgresSeconds()
                let operations = try await Self.appendOrders(ledger, concurrency: concurrency, until: .now + .seconds(Int64(seconds)), prefix: "alone-\(run)")
                let after = ledger.writer.groupCommitStatistics
                return WritePath(
                    operations: operations, seconds: (ContinuousClock.now - start).inSeconds, machine: MachineCPU.now() - machine,
                    postgresSeconds: ProcessCPU.postgresSeconds() - postgres,
                    perGroup: Double(after.writes - groups.writes) / Double(max(1, after.groups - groups.groups)))
            })
        } catch {
            measured = .failure(error)
        }
        try? await loop.shutdownGracefully()
        return try measured.get()
    }

    /// Each caller creates an order, then appends its five events, one at a time, then the next
    /// order, until the deadline; answers the events appended.
    static func appendOrders(_ ledger: OrderLedger, concurrency: Int, until deadline: ContinuousClock.Instant, prefix: String) async throws -> Int {
        let metadata = Data(#"{"appendedBy":"bench","requestId":"bench"}"#.utf8)
        let ids = LoadEventIDs()
        let product = try ProductID("gems.100")
        return try await withThrowingTaskGroup(of: Int.self) { group in
            for worker in 0..<concurrency {
                group.addTask {
                    var appended = 0
                    var n = 0
                    let user = try UserID("u-\(worker)")
                    while ContinuousClock.now < deadline {
                        let id = try OrderID("\(prefix)-\(worker)-\(n)")
                        let now = Date()
                        let transaction = try TransactionID("t-\(id.rawValue)")
                        let events: [OrderEvent] = [
                            .paymentAdded(PaymentAdded(queuedAt: now)),
                            .receiptReceived(ReceiptReceived(
                                transactionId: transaction, productId: product, purchaseDate: now, receiptSha256: String(repeating: "ab", count: 32),
                                format: .jws, matchedBy: .applicationUsername)),
                            .verified(Verified(environment: "Sandbox")), .delivered, .finished,
                        ]
                        let bodies = orderEvents(transaction: transaction.rawValue, at: EventCoding.formatDate(now))
                        _ = try await ledger.create(
                            id, OrderCreated(userId: user, productId: product, price: "0.99", currency: "USD"), tokenGiven: false, metadata: metadata)
                        for (index, (event, body)) in zip(events, bodies).enumerated() {
                            _ = try await ledger.append(
                                id, event: event, eventID: ids.id(worker: worker, index: n * 8 + index), expected: nil, data: Data(body.data.utf8),
                                metadata: metadata)
                        }
                        appended += 1 + events.count
                        n += 1
                    }
                    return appended
                }
            }
            return try await group.reduce(0, +)
        }
    }
}
