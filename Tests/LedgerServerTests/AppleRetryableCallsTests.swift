import AppleReceipts
import AppStoreStandIn
import Foundation
import LedgerServer
import LedgerServices
import LedgerTestSupport
import Testing

/// Apple's "not found, try again" answers are Apple away, not Apple's refusal: a call the log
/// calls for is tried again later, and sent once Apple finds the transaction.
@Suite("Calls to Apple through Apple's retryable not-found codes")
struct AppleRetryableCallsTests {
    let apple: TestApple
    let standIn = AppStoreServerStandIn(bundleID: TestApple.bundleId)
    init() throws { apple = try TestApple() }

    @Test("finish after delivery: 4040006 past the client's tries is retried later, then sent; never recorded refused")
    func finishThroughRetryableNotFound() async throws {
        try await withAppleAPIApplication(apple, standIn, configure: { configuration in
            configuration.appleCallsInterval = 0
        }) { http, db, base in
            let calls = appleCalls(standIn, base, db, switches: .init(finishAfterDelivery: true))
            try await http.send(.post, "/v1/orders", json: newOrder("r-1"))
            let (_, verified) = try await http.send(.post, "/v1/receipts", json: [
                "orderId": "r-1", "signedTransaction": try await apple.sign(TestApple.transaction("8600001")),
            ])
            #expect(verified["state"] as? String == "verified")
            try await http.send(.post, "/v1/orders/r-1/events", json: ["type": "delivered", "data": [:]])
            // The stand-in's client tries four times: each answer is OriginalTransactionIdNotFoundRetryable.
            await standIn.queue(Array(repeating: .appleError(4_040_006), count: 4))
            let first = try await drain(calls, db)
            #expect(first.calls == ["finish retrying": 1], "\(first)")
            let lastError = try await scalar(db, "SELECT last_error FROM apple_calls WHERE transaction_id = '8600001'", as: String.self)
            #expect(lastError?.contains("4040006") == true, "\(lastError ?? "none")")
            // Due again: one more retryable answer (AccountNotFoundRetryable), retried within the call, then taken.
            try await db.client.query("UPDATE apple_calls SET due_at = now()", logger: TestServer.logger)
            await standIn.queue([.appleError(4_040_002)])
            let second = try await calls.run()
            #expect(second.calls == ["finish sent": 1], "\(second)")
            let finishes = await standIn.writes.filter { $0.path == "/inApps/v1/transactions/8600001/finish" }
            #expect(finishes.count == 1)
        }
    }
}
