import AsyncHTTPClient
import Foundation
import LedgerCore
import Logging
import NIOCore
import NIOFoundationCompat

/// Apple's legacy verifyReceipt: production first, then the sandbox on 21007 (and back on
/// 21008), with the shared secret and a time-out per call. Transport failures, time-outs and
/// malformed answers are `retry-later`: the proof may be fine, Apple's answer was not usable.
public struct VerifyReceiptClient: Sendable {
    public struct Settings: Sendable {
        public var productionURL: String
        public var sandboxURL: String
        public var sharedSecret: String?
        public var timeout: TimeAmount

        public init(
            productionURL: String = "https://buy.itunes.apple.com/verifyReceipt",
            sandboxURL: String = "https://sandbox.itunes.apple.com/verifyReceipt",
            sharedSecret: String? = nil, timeout: TimeAmount = .seconds(10)
        ) {
            self.productionURL = productionURL
            self.sandboxURL = sandboxURL
            self.sharedSecret = sharedSecret
            self.timeout = timeout
        }
    }

    public let settings: Settings
    let httpClient: HTTPClient
    let logger: Logger

    public init(settings: Settings, httpClient: HTTPClient = .apple, logger: Logger) {
        self.settings = settings
        self.httpClient = httpClient
        self.logger = logger
    }

    /// Apple's answer for a receipt once it is valid (status 0 or 21006).
    public func verify(receiptData: String) async throws(AppleVerificationError) -> VerifyReceiptResponse {
        try await verify(receiptData: receiptData, sharedSecret: settings.sharedSecret)
    }

    /// `verify(receiptData:)` with `sharedSecret` as the password (nil: none) instead of the settings'.
    public func verify(receiptData: String, sharedSecret: String?) async throws(AppleVerificationError) -> VerifyReceiptResponse {
        var url = settings.productionURL
        // At most one hop each way: production → sandbox (21007) or sandbox → production (21008).
        for _ in 0..<2 {
            let response = try await post(receiptData, to: url, sharedSecret: sharedSecret)
            switch VerifyReceiptStatus.meaning(of: response.status) {
            case .valid:
                // A valid receipt's answer carries the receipt: without, it is no answer Apple
                // documents (an iOS 6 style receipt's names its app `bid`, not `bundle_id`, and is
                // refused as of no app the ledger holds).
                guard response.receipt != nil else {
                    throw AppleVerificationError(
                        code: "apple-answer-malformed", message: "verifyReceipt's answer with status \(response.status) names no receipt",
                        isRetryable: true, appleStatus: response.status)
                }
                // The environment is the one that answered when Apple's answer leaves it out: a
                // sandbox receipt is never taken for production money.
                var answered = response
                if answered.environment == nil { answered.environment = url == settings.sandboxURL ? "Sandbox" : "Production" }
                return answered
            case .useSandbox: url = settings.sandboxURL
            case .useProduction: url = settings.productionURL
            case .retryLater(let code, let message):
                throw AppleVerificationError(code: code, message: message, isRetryable: true, appleStatus: response.status)
            case .rejected(let code, let message):
                throw AppleVerificationError(code: code, message: message, appleStatus: response.status)
            }
        }
        throw AppleVerificationError(code: "apple-environment-loop", message: "verifyReceipt sent the receipt back and forth between production and sandbox", isRetryable: true)
    }

    private func post(_ receiptData: String, to url: String, sharedSecret: String?) async throws(AppleVerificationError) -> VerifyReceiptResponse {
        var body: [String: String] = ["receipt-data": receiptData]
        if let secret = sharedSecret { body["password"] = secret }
        do {
            var request = HTTPClientRequest(url: url)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(data: try JSONEncoder().encode(body)))
            let answer = try await httpClient.answer(request, timeout: settings.timeout, limit: 8 * 1024 * 1024, logger: logger)
            guard answer.status == 200 else {
                throw AppleVerificationError(code: "apple-unavailable", message: "verifyReceipt answered HTTP \(answer.status)", isRetryable: true)
            }
            do {
                return try JSONDecoder().decode(VerifyReceiptResponse.self, from: answer.body)
            } catch {
                throw AppleVerificationError(code: "apple-answer-malformed", message: "verifyReceipt's answer is not the JSON it documents", isRetryable: true)
            }
        } catch let error as AppleVerificationError {
            throw error
        } catch is NIOTooManyBytesError {
            throw AppleVerificationError(code: "apple-answer-malformed", message: "verifyReceipt's answer is larger than 8 MiB", isRetryable: true)
        } catch let error as HTTPClientError where error == .connectTimeout {
            throw AppleVerificationError(code: "apple-unreachable", message: "verifyReceipt could not be connected to in 10 s", isRetryable: true)
        } catch let error as HTTPClientError where error == .deadlineExceeded || error == .readTimeout {
            throw AppleVerificationError(code: "apple-timeout", message: "verifyReceipt did not answer within \(settings.timeout.nanoseconds / 1_000_000) ms", isRetryable: true)
        } catch {
            throw AppleVerificationError(code: "apple-unreachable", message: "verifyReceipt could not be reached (\(SignedDataVerifier.reason(error)))", isRetryable: true)
        }
    }
}

/// The parts of verifyReceipt's answer the ledger reads.
public struct VerifyReceiptResponse: Decodable, Sendable {
    public var status: Int
    public var environment: String?
    public var receipt: Receipt?
    public var latestReceiptInfo: [InApp]?

    public struct Receipt: Decodable, Sendable {
        public var bundleId: String?
        public var inApp: [InApp]?
        enum CodingKeys: String, CodingKey {
            case bundleId = "bundle_id", inApp = "in_app"
        }
    }

    /// One transaction of the receipt. Apple sends its numbers as strings.
    public struct InApp: Decodable, Sendable {
        public var transactionId: String
        public var originalTransactionId: String?
        public var productId: String
        public var purchaseDateMs: String?
        public var quantity: String?
        public var inAppOwnershipType: String?
        public var appAccountToken: String?
        /// Auto-renewable subscriptions: the end of the period, and the period's id.
        public var expiresDateMs: String?
        public var webOrderLineItemId: String?
        public var subscriptionGroupIdentifier: String?
        /// `"true"` once the customer upgraded to another product of the group.
        public var isUpgraded: String?
        /// `"true"` for a subscription's free trial period: Apple billed nothing for it.
        public var isTrialPeriod: String?
        /// When Apple refunded or revoked the transaction (its support, or a family share ended),
        /// and why (`"1"`: an issue in the app, `"0"`: another reason).
        public var cancellationDateMs: String?
        public var cancellationReason: String?
        enum CodingKeys: String, CodingKey {
            case transactionId = "transaction_id", originalTransactionId = "original_transaction_id"
            case productId = "product_id", purchaseDateMs = "purchase_date_ms", quantity
            case inAppOwnershipType = "in_app_ownership_type", appAccountToken = "app_account_token"
            case expiresDateMs = "expires_date_ms", webOrderLineItemId = "web_order_line_item_id"
            case subscriptionGroupIdentifier = "subscription_group_identifier"
            case isUpgraded = "is_upgraded", isTrialPeriod = "is_trial_period"
            case cancellationDateMs = "cancellation_date_ms", cancellationReason = "cancellation_reason"
        }
    }

    enum CodingKeys: String, CodingKey {
        case status, environment, receipt
        case latestReceiptInfo = "latest_receipt_info"
    }

    /// Every transaction in `in_app` and `latest_receipt_info`, each once, in purchase order:
    /// `latest_receipt_info`'s copy where both list it, Apple's current word (a refund shows there
    /// while the receipt's `in_app`, as the device last got it, may not say it yet).
    public var transactions: [InApp] {
        var seen = Set<String>()
        let all = (latestReceiptInfo ?? []) + (receipt?.inApp ?? [])
        return all.filter { seen.insert($0.transactionId).inserted }
            .sorted { (Int64($0.purchaseDateMs ?? "") ?? 0, $0.transactionId) < (Int64($1.purchaseDateMs ?? "") ?? 0, $1.transactionId) }
    }
}
