import AppStoreStandIn
import AppleReceipts
import Foundation
import Hummingbird
import JWTKit
import Logging
import NIOCore
import PrivatePostgres

/// A throwaway "Apple" for tests: a signing chain whose root is written to a file the ledger is
/// configured to trust (removed when the last reference goes), and helpers that sign
/// transactions and notifications with it.
public final class TestApple: Sendable {
    public static let bundleId = "com.example.ledger-tests"
    public static let appAppleId: Int64 = 1_234_567_890

    public let chain: ThrowawaySigningChain
    /// A PEM file holding the chain's root.
    public let rootFile: String

    public init(options: ThrowawaySigningChain.Options = .init()) throws {
        chain = try ThrowawaySigningChain(name: "Test Apple", options: options)
        rootFile = NSTemporaryDirectory() + "ledger-test-root-\(UUID().uuidString).pem"
        try chain.rootPEM().write(toFile: rootFile, atomically: true, encoding: .utf8)
    }

    deinit {
        try? FileManager.default.removeItem(atPath: rootFile)
    }

    /// A transaction payload with sensible values; override what a test is about.
    public static func transaction(
        _ id: String, product: String = "gems.100", environment: String = "Sandbox", bundleId: String = TestApple.bundleId,
        appAccountToken: UUID? = nil, purchaseDate: Date = Date(timeIntervalSinceNow: -60), signedDate: Date = Date()
    ) -> SignedTransactionPayload {
        SignedTransactionPayload(
            transactionId: id, originalTransactionId: id, bundleId: bundleId, productId: product,
            purchaseDate: purchaseDate.millisecondsSince1970, signedDate: signedDate.millisecondsSince1970,
            environment: environment, appAccountToken: appAccountToken?.uuidString.lowercased(),
            appTransactionId: "app-tx-\(id)", price: 990, currency: "USD")
    }

    /// The signed AppTransaction StoreKit gives an app of `appTransactionId`'s Apple account.
    public static func appTransaction(
        _ appTransactionId: String?, environment: String = "Sandbox", bundleId: String = TestApple.bundleId, signedDate: Date = Date()
    ) -> SignedAppTransactionPayload {
        SignedAppTransactionPayload(
            appTransactionId: appTransactionId, bundleId: bundleId, receiptType: environment,
            receiptCreationDate: signedDate.millisecondsSince1970, appAppleId: appAppleId,
            originalPurchaseDate: Date(timeIntervalSinceNow: -86_400 * 30).millisecondsSince1970)
    }

    /// A subscription's renewal info payload (Apple's JWSRenewalInfoDecodedPayload), renewing
    /// `product` by default; override what a test is about, then `sign` it.
    public static func renewalInfo(
        _ originalTransactionId: String, product: String = "pro.monthly", environment: String = "Sandbox", autoRenew: Bool = true,
        signedDate: Date = Date()
    ) -> SignedRenewalInfoPayload {
        SignedRenewalInfoPayload(
            originalTransactionId: originalTransactionId, autoRenewProductId: product, productId: product, autoRenewStatus: autoRenew ? 1 : 0,
            environment: environment, signedDate: signedDate.millisecondsSince1970)
    }

    public func sign(_ payload: some Encodable) async throws -> String {
        try chain.sign(payload)
    }

    /// A signed notification about `transaction` (signed too, as Apple nests it).
    public func notification(
        _ type: String, subtype: String? = nil, uuid: UUID = UUID(), transaction: SignedTransactionPayload?,
        environment: String = "Sandbox", signedDate: Date = Date(), consumptionRequestReason: String? = nil,
        renewalInfo: SignedRenewalInfoPayload? = nil
    ) async throws -> String {
        let signedTransaction: String? = if let transaction { try await sign(transaction) } else { nil }
        let signedRenewalInfo: String? = if let renewalInfo { try await sign(renewalInfo) } else { nil }
        let payload = SignedNotificationPayload(
            notificationType: type, subtype: subtype, notificationUUID: uuid.uuidString.lowercased(),
            signedDate: signedDate.millisecondsSince1970,
            data: .init(bundleId: Self.bundleId, appAppleId: Self.appAppleId, environment: environment, signedTransactionInfo: signedTransaction,
                        signedRenewalInfo: signedRenewalInfo, consumptionRequestReason: consumptionRequestReason))
        return try await sign(payload)
    }
}

/// A stand-in for Apple's verifyReceipt on a local port: answers each receipt-data value with
/// the answer a test scripted for it, per environment, and counts the calls.
public final class VerifyReceiptStandIn: Sendable {
    /// What one environment answers for one receipt: a JSON object, raw text, or no answer in time.
    public enum Answer: Sendable {
        case json(String)
        case raw(String)
        case hang
        /// The head, with the whole text's length, and half the text; the rest is held back.
        case stalled(String)
    }

    private let answers: [String: Answer]
    private let calls = CallLog()

    /// `answers` keyed by "production:<receipt-data>" or "sandbox:<receipt-data>", or with the
    /// password sent ("production:<receipt-data>#<password>"; none: "…#") for that password alone.
    public init(answers: [String: Answer]) {
        self.answers = answers
    }

    /// How many requests came for `key` ("production:<receipt>", "sandbox:<receipt>", or
    /// "password:<shared secret sent>").
    public func calls(_ key: String) async -> Int { await calls.count(key) }

    /// Runs the stand-in for the duration of `body`, which gets its production and sandbox URLs.
    public func run<T: Sendable>(_ body: @Sendable (_ production: String, _ sandbox: String) async throws -> T) async throws -> T {
        let router = Router()
        for environment in ["production", "sandbox"] {
            router.post("/\(environment)/verifyReceipt") { request, context -> Response in
                let body = try await request.body.collect(upTo: 1 << 20)
                let object = (try? JSONSerialization.jsonObject(with: Data(buffer: body))) as? [String: Any] ?? [:]
                let receipt = object["receipt-data"] as? String ?? ""
                let key = "\(environment):\(receipt)"
                await self.calls.record(key)
                await self.calls.record("password:\(object["password"] as? String ?? "")")
                // An answer for the receipt with one password ("<key>#<password>") comes first.
                switch self.answers["\(key)#\(object["password"] as? String ?? "")"] ?? self.answers[key] ?? .json(#"{"status": 21002}"#) {
                case .json(let text), .raw(let text):
                    return Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: text)))
                case .hang:
                    try await Task.sleep(for: .seconds(30))
                    return Response(status: .ok)
                case .stalled(let text):
                    let bytes = Array(text.utf8)
                    return Response(
                        status: .ok, headers: [.contentType: "application/json"],
                        body: ResponseBody(contentLength: bytes.count) { writer in
                            try await writer.write(ByteBuffer(bytes: bytes[..<(bytes.count / 2)]))
                            try await Task.sleep(for: .seconds(30))
                            try await writer.finish(nil)
                        })
                }
            }
        }
        return try await serveStandIn(router) { bound in
            try await body("http://127.0.0.1:\(bound)/production/verifyReceipt", "http://127.0.0.1:\(bound)/sandbox/verifyReceipt")
        }
    }


    /// A verifyReceipt answer with status 0 holding `transactions` (id, product, purchase ms).
    public static func valid(bundleId: String = TestApple.bundleId, environment: String = "Production", transactions: [(String, String, Int64)]) -> Answer {
        let items = transactions.map { id, product, millis in
            #"{"transaction_id": "\#(id)", "original_transaction_id": "\#(id)", "product_id": "\#(product)", "purchase_date_ms": "\#(millis)", "quantity": "1"}"#
        }
        return .json(#"{"status": 0, "environment": "\#(environment)", "receipt": {"bundle_id": "\#(bundleId)", "in_app": [\#(items.joined(separator: ","))]}}"#)
    }
}

actor CallLog {
    var counts: [String: Int] = [:]
    func record(_ key: String) { counts[key, default: 0] += 1 }
    func count(_ key: String) -> Int { counts[key] ?? 0 }
}


/// A port of 127.0.0.1 bound and not listening, held while `body` runs: every connection to it
/// is refused (a host that is down, a proxy not started).
public func withRefusingPort<T>(_ body: (Int) async throws -> T) async throws -> T {
    let (descriptor, port) = try ProcessRunner.boundLocalPort()
    defer { close(descriptor) }
    return try await body(port)
}
