import AppleReceipts
import Foundation
import LedgerCore
import Logging

/// Looks up an Apple order id and takes each of its purchases through the receipts' intake.
public struct AppleOrderLookup: Sendable {
    let api: LazyAppStoreServerAPI
    let verifier: AppleProofVerifier
    let receipts: ReceiptLedger
    /// Where a refund Apple signed in the order's transactions is recorded, as for a client's proof.
    let notifications: NotificationLedger
    let logger: Logger

    public init(api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, receipts: ReceiptLedger, notifications: NotificationLedger, logger: Logger) {
        self.api = api
        self.verifier = verifier
        self.receipts = receipts
        self.notifications = notifications
        self.logger = logger
    }

    /// What became of each purchase of one Apple order.
    public struct Found: Codable, Sendable {
        public var appleOrderId: String
        public var transactions: [Entry]

        public struct Entry: Codable, Sendable {
            public var transactionId: String?
            /// `matched`, `unmatched` (in the pool), `duplicate`, `rejected`, `retry-later`, as
            /// `POST /v1/receipts` answers.
            public var outcome: String
            public var orderId: String?
            public var state: String?
            public var reason: String?
            /// The environment and the app Apple signed the transaction for (absent when it did not verify).
            public var environment: String? = nil
            public var bundleId: String? = nil
        }
    }

    /// Refuses what is no Apple order id (the letters and digits of a receipt e-mail's, up to
    /// 64): Apple would be asked in vain.
    public static func check(_ orderID: String) throws(LedgerInputError) {
        guard !orderID.isEmpty, orderID.count <= 64,
              orderID.unicodeScalars.allSatisfy({ $0.isASCII && $0.properties.isAlphabetic || ("0"..."9").contains($0) }) else {
            throw LedgerInputError(field: "appleOrderId", problem: "must be the letters and digits of an Apple order id, such as MQ1N2CD3EF")
        }
    }

    /// Asks with `app`'s key (nil: the ledger's first app) at its production host (the
    /// sandbox's for an app that accepts only the sandbox): order ids are on the receipt e-mails
    /// of real purchases. Throws `AppStoreServerAPIError` when Apple cannot be asked or refuses
    /// (`apple-api-no-key` for an app without a key).
    public func look(up orderID: String, user: UserID?, app: BundleID? = nil, metadata: Data) async throws -> Found {
        try Self.check(orderID)
        let signed = try await api.client(for: app).lookUpOrder(orderID)
        var entries: [Found.Entry] = []
        for jws in signed {
            // The transaction, once its signature verified: named in the entry whatever became of it.
            var seen: String?
            do {
                let (transaction, revocation) = try await verifier.transactionAndRevocation(signed: jws)
                seen = transaction.transactionId.rawValue
                if let revocation {
                    // Never granted; one the ledger granted or pooled has its refund recorded.
                    _ = try await notifications.applyRefundSeen(transaction, revocation, metadata: metadata)
                    throw AppleProofVerifier.revoked(transaction, revocation)
                }
                // The purchase's token decides its order; the user given is for the pool.
                let answer = try await receipts.apply(transaction, claim: .init(userId: nil, orderId: nil, poolUserId: user), metadata: metadata)
                entries.append(.init(
                    transactionId: answer.transactionId.rawValue, outcome: answer.outcome.rawValue, orderId: answer.orderId?.rawValue,
                    state: answer.state?.rawValue, reason: answer.reason, environment: transaction.environment, bundleId: transaction.bundleId))
            } catch let error as AppleVerificationError {
                let id = seen ?? error.transactionId
                logger.warning("a signed transaction from Look Up Order ID was refused", metadata: [
                    "apple.order": "\(orderID)", "apple.transaction": "\(id ?? "")", "error": "\(error.code)"])
                // As POST /v1/receipts answers it: one that may yet verify (no roots, Apple's
                // certificate check away) is to be looked up again, not a refusal.
                let outcome = error.isRetryable ? ReceiptOutcome.retryLater : .rejected
                entries.append(.init(transactionId: id, outcome: outcome.rawValue, orderId: nil, state: nil, reason: error.code))
            } catch let error as LedgerInputError {
                // A subscription's transaction the catalog or its group refuses: nothing of it is recorded.
                logger.warning("a signed transaction from Look Up Order ID was refused", metadata: [
                    "apple.order": "\(orderID)", "apple.transaction": "\(seen ?? "")", "error": "\(error)"])
                entries.append(.init(transactionId: seen, outcome: ReceiptOutcome.rejected.rawValue, orderId: nil, state: nil, reason: error.code))
            }
        }
        return Found(appleOrderId: orderID, transactions: entries)
    }
}
