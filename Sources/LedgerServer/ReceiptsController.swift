import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerServices
import LedgerStore

/// `POST /v1/receipts`: a client's proof of purchase, verified, then tied to its order or put in
/// the pool. Every outcome is a 200 whose body says what happened and whether the client may
/// finish the StoreKit transaction; `retry-later` also carries `Retry-After`.
struct ReceiptsController {
    let receipts: ReceiptLedger
    let orders: OrderLedger
    let pool: TransactionPool
    /// Where a refund Apple signed in a proof is recorded, as the refund catch-up records one.
    let notifications: NotificationLedger
    let verifier: AppleProofVerifier
    let metrics: LedgerMetrics

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/receipts") { request, context in try await receive(request, context) }
    }

    /// The body of `POST /v1/receipts`.
    struct Proof: ClosedBody {
        let userId: UserID?
        let orderId: OrderID?
        let transactionId: TransactionID?
        let signedTransaction: String?
        let receiptData: String?

        enum CodingKeys: String, CodingKey, CaseIterable { case userId, orderId, transactionId, signedTransaction, receiptData }
    }

    /// The largest proof body: a legacy receipt grows with every purchase and renewal the Apple
    /// account made in the app, past the API's 256 KiB for a long subscriber's.
    static let maximumProofBytes = 1024 * 1024

    func receive(_ request: Request, _ context: LedgerRequestContext) async throws -> Response {
        let body = try LedgerRequestDecoder.decode(
            Proof.self, from: try await LedgerRequestDecoder.body(of: request, context: context, limit: Self.maximumProofBytes))
        // The user a proof claims becomes its transaction's in the pool: one no order can have is refused.
        try body.userId?.checkGiven()
        let claimedID = body.transactionId
        let claim = ReceiptLedger.Claim(userId: body.userId, orderId: body.orderId, apps: context.keyApps)
        let metadata = context.eventMetadata
        // A key limited to apps sends proofs of its apps alone: another's is refused before its
        // app is looked at (held or not, the answer is the same), and nothing of it is stored.
        let verifier = verifier.reaching(context.keyApps?.map(\.rawValue))

        switch (body.signedTransaction, body.receiptData) {
        case (let jws?, nil):
            do {
                let (transaction, revocation) = try await verifier.transactionAndRevocation(signed: jws)
                if let revocation {
                    // Never granted; a backend's unverified claim of it is taken back first.
                    _ = try await receipts.takeBackClaim(of: transaction, claim: claim, refunded: true, metadata: metadata)
                    // Granted or pooled before Apple took it back: its refund is recorded.
                    _ = try await notifications.applyRefundSeen(transaction, revocation, metadata: metadata)
                    throw AppleProofVerifier.revoked(transaction, revocation)
                }
                let answer = try await receipts.apply(transaction, claim: claim, metadata: metadata)
                metrics.receiptAnswered(answer.outcome.rawValue, app: transaction.bundleId)
                return try Self.response(
                    answer, environments: [transaction.transactionId: transaction.environment],
                    bundles: [transaction.transactionId: transaction.bundleId], request, context)
            } catch let error as AppleVerificationError where error.isNotReached {
                throw context.notReached(error.bundleId ?? "")
            } catch let error as AppleVerificationError {
                return try await refuse(error, format: .jws, proof: jws, claim: claim, transactionId: claimedID, metadata: metadata, request, context)
            }
        case (nil, let given?):
            // Apple's answer to text that is no base64 at all is 21002, which may also mean a
            // passing fault of Apple's (retry-later): refused here, it is never sent.
            // Line breaks of an encoder that wraps are no part of the receipt, and verifyReceipt
            // refuses them (21002): sent, and hashed, without them.
            guard let receipt = Self.base64Receipt(given) else {
                throw LedgerInputError(field: "receiptData", problem: "is not a base64 app receipt (StoreKit's appStoreReceiptURL data, base64-encoded)")
            }
            do {
                let verified = try await verifier.transactionsAndRevocations(receipt: receipt)
                // Those it applies (the claimed one, else all): one the ledger cannot take refuses
                // the receipt before any is applied.
                try await receipts.checkRoles(of: verified.map(\.0).filter { claimedID == nil || $0.transactionId == claimedID })
                // A transaction Apple refunded or revoked is never granted (as a signed one is
                // not); a backend's unverified claim of it is taken back. The claimed one refused
                // so is the answer; without a claim, the rest of the receipt is applied.
                var revoked: (AppleTransaction, Revocation)?
                for case let (transaction, revocation?) in verified where claimedID == nil || transaction.transactionId == claimedID {
                    _ = try await receipts.takeBackClaim(of: transaction, claim: claim, refunded: true, metadata: metadata)
                    revoked = revoked ?? (transaction, revocation)
                }
                // Any the ledger granted or pooled before Apple took it back: its refund is recorded.
                for case let (transaction, revocation?) in verified {
                    _ = try await notifications.applyRefundSeen(transaction, revocation, metadata: metadata)
                }
                let transactions = verified.filter { $0.revocation == nil }.map(\.transaction)
                let answers = try await applyReceipt(transactions, claim: claim, claimedID: claimedID, metadata: metadata)
                if let unpaid = answers.unpaid {
                    // The order the proof names: Apple took back its product's purchase in the
                    // receipt (and the receipt holds no other of it), or the receipt holds none
                    // that no other order holds (the others applied all the same; another order
                    // took the one it held meanwhile). Never answered with another order's match.
                    // One bought before the order was created is not its purchase (a non-consumable
                    // refunded and bought again: Apple keeps the cancelled one in every receipt), and
                    // the order's own may yet come: not-in-receipt, which says not to finish.
                    let product = unpaid.held?.productId
                    for case let (transaction, revocation?) in verified
                    where transaction.productId == product && !transactions.contains(where: { $0.productId == product })
                        && !(unpaid.held.map { receipts.purchased(transaction, before: $0) } ?? false) {
                        throw Self.refusal(transaction, revocation)
                    }
                    throw AppleVerificationError(
                        code: "transaction-not-in-receipt",
                        message: "the receipt holds no purchase for order \(unpaid.order) that no other order holds")
                }
                // The claimed transaction, or the receipt's only ones, Apple took back.
                if answers.primary == nil, claimedID != nil || transactions.isEmpty, let (transaction, revocation) = revoked {
                    throw Self.refusal(transaction, revocation)
                }
                guard let primary = answers.primary else {
                    throw AppleVerificationError(
                        code: claimedID == nil ? "receipt-empty" : "transaction-not-in-receipt",
                        message: claimedID.map { "transaction \($0) is not in the receipt's in_app or latest_receipt_info" }
                            ?? "the receipt holds no transaction")
                }
                metrics.receiptAnswered(primary.outcome.rawValue, app: transactions.first?.bundleId)
                let environments = Dictionary(transactions.map { ($0.transactionId, $0.environment) }) { first, _ in first }
                let bundles = Dictionary(transactions.map { ($0.transactionId, $0.bundleId) }) { first, _ in first }
                return try Self.response(primary, transactions: answers.all, environments: environments, bundles: bundles, request, context)
            } catch let error as AppleVerificationError where error.isNotReached {
                throw context.notReached(error.bundleId ?? "")
            } catch let error as AppleVerificationError {
                return try await refuse(error, format: .receipt, proof: receipt, claim: claim, transactionId: claimedID, metadata: metadata, request, context)
            }
        case (nil, nil):
            throw LedgerInputError(field: "signedTransaction", problem: "is missing: send signedTransaction (StoreKit 2) or receiptData (a legacy receipt)")
        case (_?, _?):
            throw LedgerInputError(field: "receiptData", problem: "cannot come with signedTransaction: send one proof per request")
        }
    }

    /// The refusal of a legacy receipt's transaction Apple refunded or revoked.
    static func refusal(_ transaction: AppleTransaction, _ revocation: Revocation) -> AppleVerificationError {
        var refusal = AppleProofVerifier.revoked(transaction, revocation)
        refusal.transactionId = transaction.transactionId.rawValue
        return refusal
    }

    /// A legacy receipt's transactions: the claimed one only, or else every one; the claimed
    /// order takes the transaction it already holds, or the first new one of its product.
    /// `unpaid`: the order the proof names (and the order as read, when the key reaches it), when the
    /// receipt holds nothing for it (no primary then).
    private func applyReceipt(
        _ transactions: [AppleTransaction], claim: ReceiptLedger.Claim, claimedID: TransactionID?, metadata: Data
    ) async throws -> (primary: ReceiptLedger.Answer?, all: [ReceiptLedger.Answer], unpaid: (order: OrderID, held: Order?)?) {
        if let claimedID {
            guard let transaction = transactions.first(where: { $0.transactionId == claimedID }) else { return (nil, [], nil) }
            let answer = try await receipts.apply(transaction, claim: claim, metadata: metadata)
            return (answer, [answer], nil)
        }
        var forOrder: TransactionID?
        // An order unknown, or another app's the key does not reach, is named all the same: the
        // answer is about it, never another order's.
        var named: (order: OrderID, held: Order?)? = claim.orderId.map { ($0, nil) }
        // An order the key does not reach is as one that does not exist (docs/apps.md).
        if let orderID = claim.orderId, let order = try await orders.order(orderID).flatMap({ claim.reaches($0) ? $0 : nil }) {
            named = (orderID, order)
            let holders = try await pool.holders(of: transactions.map(\.transactionId))
            let new = transactions.filter { (holders[$0.transactionId] ?? nil) == nil && $0.productId == order.productId }
            // The order's own purchase is the earliest bought after it was created that can pay
            // it (never a family member's share, nor a later transaction of an earlier purchase: a
            // restore, a renewal), of the order's quantity if one is: an older purchase of the
            // product on the same receipt (the purchase-date guard refuses it) leaves it, and a
            // later one waits for the next order. With none, the answer is about what there is
            // (a restore is answered `recorded`).
            let bought = new.filter { !receipts.purchased($0, before: order) }
            let paying = bought.filter {
                $0.inAppOwnershipType != "FAMILY_SHARED" && ($0.originalTransactionId ?? $0.transactionId.rawValue) == $0.transactionId.rawValue
            }
            let earliest = { (list: [AppleTransaction]) in list.min(by: { $0.purchaseDate < $1.purchaseDate })?.transactionId }
            // A purchase of another quantity that another open order of the user takes (of its
            // product, app and that quantity) is that order's, never taken for this one by the
            // ledger: a receipt sent before this order's own purchase is in it would fail it as
            // `quantity-mismatch` while its own purchase is yet to come. With no such order, it is
            // taken as before, and a real mismatch fails the order for good.
            var otherQuantity = Set<TransactionID>()
            let others = paying.filter { $0.quantity != order.quantity }
            if !others.isEmpty, !paying.contains(where: { $0.quantity == order.quantity }) {
                let open = try await pool.database.transaction { tx in try await pool.openOrders(of: [order.userId], in: tx) }
                let taken = Set(open.filter { $0.orderId != orderID && $0.productId == order.productId && $0.bundleId == order.bundleId }.map(\.quantity))
                otherQuantity = Set(others.filter { taken.contains($0.quantity) }.map(\.transactionId))
            }
            let rest = { (list: [AppleTransaction]) in list.filter { !otherQuantity.contains($0.transactionId) } }
            forOrder = transactions.first(where: { holders[$0.transactionId] == .some(orderID) })?.transactionId
                ?? earliest(paying.filter { $0.quantity == order.quantity }) ?? earliest(rest(paying)) ?? earliest(rest(bought))
                ?? rest(new).first?.transactionId
        }
        var all: [ReceiptLedger.Answer] = []
        for transaction in transactions {
            let mine = transaction.transactionId == forOrder
            let answer = try await receipts.apply(
                transaction,
                claim: .init(userId: claim.userId, orderId: mine ? claim.orderId : nil, poolUserId: claim.poolUserId, apps: claim.apps, chosenByLedger: mine),
                metadata: metadata)
            all.append(answer)
            // Another order took it since it was read here (the same receipt uploaded for two
            // orders at once): nothing in this receipt is the named order's.
            if mine, answer.outcome == .duplicate { forOrder = nil }
        }
        guard named == nil || forOrder != nil else { return (nil, all, named) }
        let primary = all.first { $0.transactionId == forOrder } ?? all.first
        return (primary, all, nil)
    }

    /// A proof that did not verify: `retry-later` when it may yet (Apple unavailable, no roots
    /// configured), else `rejected`, recorded for audit. No order changes either way. A proof of
    /// an app the ledger does not hold (`unknown-app`) is not recorded (the ledger keeps nothing
    /// of other apps), only logged and counted, and the client keeps its transaction: the money
    /// was taken, and the app may yet be added.
    private func refuse(
        _ error: AppleVerificationError, format: ReceiptFormat, proof: String, claim: ReceiptLedger.Claim,
        transactionId: TransactionID?, metadata: Data, _ request: Request, _ context: LedgerRequestContext
    ) async throws -> Response {
        let outcome = error.isRetryable ? ReceiptOutcome.retryLater : .rejected
        // What the client named, else what Apple signed when its signature verified.
        let transactionId = transactionId ?? error.transactionId.flatMap { try? TransactionID($0) }
        let refusal = Refusal(
            outcome: outcome, reason: error.code, message: error.message,
            // A proof the receipt does not contain may appear once the client refreshes its receipt.
            finishTransaction: !error.isRetryable && error.code != "transaction-not-in-receipt" && error.code != "unknown-app",
            appleStatus: error.appleStatus, orderId: claim.orderId, transactionId: transactionId)
        // The app when the refusal is of a held app's own rules (`AppleVerificationError.bundleId`).
        metrics.receiptAnswered(outcome.rawValue, app: error.bundleId)
        if error.isRetryable {
            var response = try EventCoding.encoder.encode(refusal, from: request, context: context)
            response.headers[.retryAfter] = "60"
            return response
        }
        if error.code == "unknown-app" {
            metrics.unknownApp(format == .jws ? "transaction" : "receipt")
            context.logger.warning("proof refused: unknown-app", metadata: [
                "proof.format": "\(format.rawValue)", "proof.sha256": "\(AppleProofVerifier.sha256(proof))", "error.message": "\(error.message)",
            ])
            return try EventCoding.encoder.encode(refusal, from: request, context: context)
        }
        try await receipts.recordRejection(
            .init(reason: error.code, message: error.message, format: format, receiptSha256: AppleProofVerifier.sha256(proof),
                  orderId: claim.orderId, userId: claim.userId, transactionId: transactionId),
            metadata: metadata)
        return try EventCoding.encoder.encode(refusal, from: request, context: context)
    }

    /// The answer to a proof that did not verify.
    struct Refusal: Encodable {
        let outcome: ReceiptOutcome
        let reason: String
        let message: String
        let finishTransaction: Bool
        let appleStatus: Int?
        let orderId: OrderID?
        let transactionId: TransactionID?
    }

    /// The answer to one transaction: its outcome, the order, whether the client may finish, and
    /// the environment Apple signed it in (`Sandbox` for App Review's purchases).
    struct TransactionAnswer: Encodable {
        let answer: ReceiptLedger.Answer
        let environment: String?
        /// The app Apple signed the transaction for.
        var bundleId: String? = nil

        enum CodingKeys: String, CodingKey { case outcome, transactionId, orderId, state, finishTransaction, reason, environment, bundleId }

        func encode(to encoder: any Encoder) throws {
            var json = encoder.container(keyedBy: CodingKeys.self)
            try json.encode(answer.outcome, forKey: .outcome)
            try json.encode(answer.transactionId, forKey: .transactionId)
            try json.encode(answer.orderId, forKey: .orderId)
            try json.encode(answer.state, forKey: .state)
            try json.encode(answer.finishTransaction, forKey: .finishTransaction)
            try json.encodeIfPresent(answer.reason, forKey: .reason)
            try json.encodeIfPresent(environment, forKey: .environment)
            try json.encodeIfPresent(bundleId, forKey: .bundleId)
        }
    }

    /// The answer's JSON; for a legacy receipt, with each of its transactions' answers.
    static func response(
        _ answer: ReceiptLedger.Answer, transactions: [ReceiptLedger.Answer]? = nil, environments: [TransactionID: String],
        bundles: [TransactionID: String] = [:], _ request: Request, _ context: LedgerRequestContext
    ) throws -> Response {
        func transactionAnswer(_ answer: ReceiptLedger.Answer) -> TransactionAnswer {
            TransactionAnswer(answer: answer, environment: environments[answer.transactionId], bundleId: bundles[answer.transactionId])
        }
        struct Body: Encodable {
            let answer: TransactionAnswer
            let transactions: [TransactionAnswer]?

            func encode(to encoder: any Encoder) throws {
                try answer.encode(to: encoder)
                var json = encoder.container(keyedBy: CodingKeys.self)
                try json.encodeIfPresent(transactions, forKey: .transactions)
            }

            enum CodingKeys: String, CodingKey { case transactions }
        }
        return try EventCoding.encoder.encode(
            Body(answer: transactionAnswer(answer), transactions: transactions?.map(transactionAnswer)), from: request, context: context)
    }
}

extension ReceiptsController {
    /// `text` without its white space (line breaks of encoders that wrap) when it may be a base64
    /// receipt: not empty, of base64's characters (its standard alphabet and padding) and white
    /// space alone; else nil.
    static func base64Receipt(_ text: String) -> String? {
        var kept: [UInt8] = []
        kept.reserveCapacity(text.utf8.count)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "+"), UInt8(ascii: "/"), UInt8(ascii: "="):
                kept.append(byte)
            case UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\r"), UInt8(ascii: "\t"):
                continue
            default:
                return nil
            }
        }
        // Padding alone is no receipt.
        guard kept.contains(where: { $0 != UInt8(ascii: "=") }) else { return nil }
        return kept.count == text.utf8.count ? text : String(decoding: kept, as: UTF8.self)
    }
}
