import AppleReceipts
import Foundation
import LedgerCore
import LedgerTestSupport
import Logging
import NIOCore
import Testing

/// A verifier that asks `standIn`'s URLs, with a short time-out.
func legacyVerifier(_ production: String, _ sandbox: String, timeout: TimeAmount = .seconds(30)) -> AppleProofVerifier {
    AppleProofVerifier(
        app: .init(bundleId: TestApple.bundleId, appAppleId: nil, environments: [.production, .sandbox]),
        signedData: SignedDataVerifier(rootCertificates: []),
        verifyReceipt: VerifyReceiptClient(
            settings: .init(productionURL: production, sandboxURL: sandbox, sharedSecret: "s3cret", timeout: timeout),
            logger: Logger(label: "test")))
}

@Suite("Legacy receipts through a stand-in verifyReceipt")
struct VerifyReceiptTests {
    static let purchase: Int64 = 1_795_000_000_000

    @Test("status 0: the receipt's transactions, in_app and latest_receipt_info, each once")
    func valid() async throws {
        let standIn = VerifyReceiptStandIn(answers: [
            "production:R1": .json("""
                {"status": 0, "environment": "Production", "receipt": {"bundle_id": "\(TestApple.bundleId)",
                 "in_app": [{"transaction_id": "t2", "product_id": "gems.100", "purchase_date_ms": "\(Self.purchase + 5)"},
                            {"transaction_id": "t1", "product_id": "gems.500", "purchase_date_ms": "\(Self.purchase)"}]},
                 "latest_receipt_info": [{"transaction_id": "t1", "product_id": "gems.500", "purchase_date_ms": "\(Self.purchase)"},
                                         {"transaction_id": "t3", "product_id": "gems.100", "purchase_date_ms": "\(Self.purchase + 9)"}]}
                """),
        ])
        let transactions = try await standIn.run { production, sandbox in
            try await legacyVerifier(production, sandbox).transactions(receipt: "R1")
        }
        #expect(transactions.map(\.transactionId.rawValue) == ["t1", "t2", "t3"])
        #expect(transactions.allSatisfy { $0.format == .receipt && $0.environment == "Production" })
        #expect(await standIn.calls("sandbox:R1") == 0)
        #expect(await standIn.calls("password:s3cret") == 1)
    }

    @Test("a subscription's transactions carry their period's end, its id and the group; a legacy receipt names no type")
    func subscriptionFields() async throws {
        let standIn = VerifyReceiptStandIn(answers: [
            "production:S1": .json("""
                {"status": 0, "environment": "Production", "receipt": {"bundle_id": "\(TestApple.bundleId)", "in_app": []},
                 "latest_receipt_info": [
                   {"transaction_id": "510", "original_transaction_id": "510", "product_id": "pro.monthly",
                    "purchase_date_ms": "\(Self.purchase)", "expires_date_ms": "\(Self.purchase + 2_592_000_000)",
                    "web_order_line_item_id": "9001", "subscription_group_identifier": "20500001"},
                   {"transaction_id": "511", "original_transaction_id": "510", "product_id": "pro.monthly",
                    "purchase_date_ms": "\(Self.purchase + 2_592_000_000)", "expires_date_ms": "\(Self.purchase + 5_184_000_000)",
                    "web_order_line_item_id": "9002", "subscription_group_identifier": "20500001"},
                   {"transaction_id": "512", "product_id": "gems.100", "purchase_date_ms": "\(Self.purchase + 1)"}]}
                """),
            "production:S2": .json("""
                {"status": 0, "environment": "Production", "receipt": {"bundle_id": "\(TestApple.bundleId)",
                 "in_app": [{"transaction_id": "520", "product_id": "pro.monthly", "purchase_date_ms": "\(Self.purchase)",
                             "expires_date_ms": "soon"}]}}
                """),
        ])
        try await standIn.run { production, sandbox in
            let transactions = try await legacyVerifier(production, sandbox).transactions(receipt: "S1")
            #expect(transactions.map(\.transactionId.rawValue) == ["510", "512", "511"])
            let renewal = try #require(transactions.last)
            #expect(renewal.originalTransactionId == "510" && renewal.webOrderLineItemId == "9002")
            #expect(renewal.expiresDate == Date(millisecondsSince1970: Self.purchase + 5_184_000_000))
            #expect(renewal.subscriptionGroupIdentifier == "20500001" && renewal.type == nil)
            #expect(transactions[1].expiresDate == nil && transactions[1].webOrderLineItemId == nil)
            // The catalog decides: a monthly subscription's renewal, never an order's purchase.
            #expect(try TransactionRole.of(renewal, catalogType: .autoRenewable) == .subscriptionPeriod(originalTransactionId: "510"))
            #expect(try TransactionRole.of(transactions[0], catalogType: .autoRenewable) == .subscriptionStart(originalTransactionId: "510"))
            do {
                _ = try await legacyVerifier(production, sandbox).transactions(receipt: "S2")
                Issue.record("an expires_date_ms that is no number was taken")
            } catch let error as AppleVerificationError {
                #expect(error.code == "apple-answer-malformed")
            }
        }
    }

    @Test("21007 from production: asked again in the sandbox, which answers 0")
    func sandboxReceipt() async throws {
        let standIn = VerifyReceiptStandIn(answers: [
            "production:R2": .json(#"{"status": 21007}"#),
            "sandbox:R2": VerifyReceiptStandIn.valid(environment: "Sandbox", transactions: [("t9", "gems.100", Self.purchase)]),
        ])
        let transactions = try await standIn.run { production, sandbox in
            try await legacyVerifier(production, sandbox).transactions(receipt: "R2")
        }
        #expect(transactions.map(\.transactionId.rawValue) == ["t9"])
        #expect(transactions.first?.environment == "Sandbox")
        #expect(await standIn.calls("production:R2") == 1)
        #expect(await standIn.calls("sandbox:R2") == 1)
    }

    /// The error verifying `receipt` against `answer` gives.
    func failure(_ answer: VerifyReceiptStandIn.Answer, timeout: TimeAmount = .seconds(30)) async throws -> AppleVerificationError? {
        let standIn = VerifyReceiptStandIn(answers: ["production:R": answer])
        return try await standIn.run { production, sandbox -> AppleVerificationError? in
            do {
                _ = try await legacyVerifier(production, sandbox, timeout: timeout).transactions(receipt: "R")
                return nil
            } catch let error as AppleVerificationError {
                return error
            }
        }
    }

    @Test("21005: Apple unavailable, retry later")
    func unavailable() async throws {
        let error = try #require(try await failure(.json(#"{"status": 21005}"#)))
        #expect(error.isRetryable && error.appleStatus == 21005 && error.code == "apple-unavailable")
    }

    @Test("21003: the receipt is not authentic, rejected for good")
    func notAuthentic() async throws {
        let error = try #require(try await failure(.json(#"{"status": 21003}"#)))
        #expect(!error.isRetryable && error.appleStatus == 21003 && error.code == "receipt-not-authenticated")
    }

    @Test("a malformed answer: retry later; so is a valid status naming no receipt, and an answer over 8 MiB")
    func malformedAnswer() async throws {
        let error = try #require(try await failure(.raw("<html>oops</html>")))
        #expect(error.isRetryable && error.code == "apple-answer-malformed")
        for answer in [#"{"status": 0}"#, #"{"status": 21006}"#] {
            let empty = try #require(try await failure(.json(answer)))
            #expect(empty.isRetryable && empty.code == "apple-answer-malformed", "\(answer): \(empty)")
        }
        let padding = String(repeating: " ", count: 9 * 1024 * 1024)
        let huge = try #require(try await failure(.raw(#"{"status": 0,"# + padding + #""receipt": {"bundle_id": "x", "in_app": []}}"#)))
        #expect(huge.isRetryable && huge.code == "apple-answer-malformed", "\(huge)")
    }

    @Test("no answer within the time-out: retry later")
    func timeout() async throws {
        let started = ContinuousClock.now
        let error = try #require(try await failure(.hang, timeout: .milliseconds(500)))
        #expect(error.isRetryable && error.code == "apple-timeout")
        #expect(ContinuousClock.now - started < .seconds(10))
    }

    @Test("cancellation_date_ms is Apple's refund, in either list, except on a subscription period the customer upgraded from")
    func cancellations() async throws {
        let standIn = VerifyReceiptStandIn(answers: [
            "production:C": .json("""
                {"status": 0, "environment": "Production", "receipt": {"bundle_id": "\(TestApple.bundleId)", "in_app": [
                  {"transaction_id": "t1", "product_id": "gems.100", "purchase_date_ms": "\(Self.purchase)", "cancellation_date_ms": "\(Self.purchase + 9)", "cancellation_reason": "1"},
                  {"transaction_id": "t2", "original_transaction_id": "t0", "product_id": "pro.monthly", "purchase_date_ms": "\(Self.purchase + 1)",
                   "expires_date_ms": "\(Self.purchase + 99)", "cancellation_date_ms": "\(Self.purchase + 5)", "is_upgraded": "true"},
                  {"transaction_id": "t3", "product_id": "gems.100", "purchase_date_ms": "\(Self.purchase + 2)"}]},
                 "latest_receipt_info": [
                  {"transaction_id": "t3", "product_id": "gems.100", "purchase_date_ms": "\(Self.purchase + 2)", "cancellation_date_ms": "\(Self.purchase + 7)"}]}
                """),
        ])
        let verified = try await standIn.run { production, sandbox in
            try await legacyVerifier(production, sandbox).transactionsAndRevocations(receipt: "C")
        }
        #expect(verified.map(\.transaction.transactionId.rawValue) == ["t1", "t2", "t3"])
        // t3's refund is in latest_receipt_info alone (Apple's current word): taken all the same.
        #expect(verified.map { $0.revocation?.date.millisecondsSince1970 } == [Self.purchase + 9, nil, Self.purchase + 7])
        #expect(verified.first?.revocation?.reason == 1)
    }

    @Test("an answer without `environment` is of the environment that gave it; a quantity that is no number of units is malformed")
    func environmentAndQuantity() async throws {
        let standIn = VerifyReceiptStandIn(answers: [
            "production:E": .json(#"{"status": 21007}"#),
            "sandbox:E": .json("""
                {"status": 0, "receipt": {"bundle_id": "\(TestApple.bundleId)", "in_app": [
                  {"transaction_id": "t1", "product_id": "gems.100", "purchase_date_ms": "\(Self.purchase)", "quantity": "2"}]}}
                """),
            "production:Q": .json("""
                {"status": 0, "environment": "Production", "receipt": {"bundle_id": "\(TestApple.bundleId)", "in_app": [
                  {"transaction_id": "t2", "product_id": "gems.100", "purchase_date_ms": "\(Self.purchase)", "quantity": "abc"}]}}
                """),
        ])
        try await standIn.run { production, sandbox in
            let transactions = try await legacyVerifier(production, sandbox).transactions(receipt: "E")
            #expect(transactions.map(\.environment) == ["Sandbox"] && transactions.map(\.quantity) == [2])
            do {
                _ = try await legacyVerifier(production, sandbox).transactions(receipt: "Q")
                Issue.record("a quantity of abc was taken")
            } catch let error as AppleVerificationError {
                #expect(error.code == "apple-answer-malformed" && error.isRetryable, "\(error)")
            }
        }
    }

    @Test("an answer whose body stalls after its head is no answer within the time-out: retry later")
    func stalledBody() async throws {
        let started = ContinuousClock.now
        let error = try #require(try await failure(
            .stalled(#"{"status": 0, "receipt": {"bundle_id": "\#(TestApple.bundleId)", "in_app": []}}"#), timeout: .milliseconds(500)))
        #expect(error.isRetryable && error.code == "apple-timeout", "\(error)")
        // Ended by the time-out, not by the stand-in, which holds the rest of its body for 30 s.
        #expect(ContinuousClock.now - started < .seconds(20))
    }

    @Test("a receipt of another app is rejected")
    func otherBundle() async throws {
        let error = try #require(try await failure(VerifyReceiptStandIn.valid(bundleId: "com.other", transactions: [("t", "p", Self.purchase)])))
        #expect(error.code == "wrong-bundle-id" && !error.isRetryable)
    }

    @Test("every status of 21000–21010 and 21100–21199 has a meaning; the retryable ones never fail an order")
    func statusTable() {
        let retryable = [21000, 21001, 21002, 21004, 21005, 21009] + Array(21100...21199)
        for status in retryable {
            guard case .retryLater = VerifyReceiptStatus.meaning(of: status) else {
                Issue.record("\(status) should be retry-later")
                continue
            }
        }
        for status in [21003, 21010] {
            guard case .rejected = VerifyReceiptStatus.meaning(of: status) else {
                Issue.record("\(status) should be rejected")
                continue
            }
        }
        #expect(VerifyReceiptStatus.meaning(of: 0) == .valid)
        #expect(VerifyReceiptStatus.meaning(of: 21006) == .valid)
        #expect(VerifyReceiptStatus.meaning(of: 21007) == .useSandbox)
        #expect(VerifyReceiptStatus.meaning(of: 21008) == .useProduction)
    }
}
