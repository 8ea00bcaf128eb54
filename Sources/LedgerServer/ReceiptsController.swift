import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// `POST /v1/receipts`: a client's proof of purchase, verified, then tied to its order or put in
/// the pool. Every outcome is a 200 whose body says what happened and whether the client may
/// finish the StoreKit transaction; `retry-later` also carries `Retry-After`.
struct ReceiptsController {
    let receipts: ReceiptLedger
    let verifier: AppleProofVerifier
    let metrics: LedgerMetrics

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/receipts") { request, context in try await receive(request, context) }
    }

    func receive(_ request: Request, _ context: LedgerRequestContext) async throws -> Response {
        let body = try await JSONBody.read(request, context: context)
        let userID = try body.string("userId").map { text throws(LedgerInputError) in try UserID(text) }
        let orderID = try body.string("orderId").map { text throws(LedgerInputError) in try OrderID(text) }
        let claimedID = try body.string("transactionId").map { text throws(LedgerInputError) in try TransactionID(text) }
        let signed = try body.string("signedTransaction")
        let receiptData = try body.string("receiptData")
        let claim = ReceiptLedger.Claim(userId: userID, orderId: orderID)
        let metadata = LedgerServer.metadata(context)

        switch (signed, receiptData) {
        case (let jws?, nil):
            do {
                let transaction = try await verifier.transaction(signed: jws)
                let answer = try await receipts.apply(transaction, claim: claim, metadata: metadata)
                metrics.receiptAnswered(answer.outcome.rawValue)
                return Self.response(answer)
            } catch let error as AppleVerificationError {
                return try await refuse(error, format: .jws, proof: jws, claim: claim, transactionId: claimedID, metadata: metadata)
            }
        case (nil, let receipt?):
            do {
                let transactions = try await verifier.transactions(receipt: receipt)
                let answers = try await applyReceipt(transactions, claim: claim, claimedID: claimedID, metadata: metadata)
                guard let primary = answers.primary else {
                    throw AppleVerificationError(
                        code: claimedID == nil ? "receipt-empty" : "transaction-not-in-receipt",
                        message: claimedID.map { "transaction \($0) is not in the receipt's in_app or latest_receipt_info" }
                            ?? "the receipt holds no transaction")
                }
                metrics.receiptAnswered(primary.outcome.rawValue)
                return Self.response(primary, transactions: answers.all)
            } catch let error as AppleVerificationError {
                return try await refuse(error, format: .receipt, proof: receipt, claim: claim, transactionId: claimedID, metadata: metadata)
            }
        case (nil, nil):
            throw LedgerInputError(field: "signedTransaction", problem: "is missing: send signedTransaction (StoreKit 2) or receiptData (a legacy receipt)")
        case (_?, _?):
            throw LedgerInputError(field: "receiptData", problem: "cannot come with signedTransaction: send one proof per request")
        }
    }

    /// A legacy receipt's transactions: the claimed one only, or else every one; the claimed
    /// order takes the transaction it already holds, or the first new one of its product.
    private func applyReceipt(
        _ transactions: [AppleTransaction], claim: ReceiptLedger.Claim, claimedID: TransactionID?, metadata: Data
    ) async throws -> (primary: ReceiptLedger.Answer?, all: [ReceiptLedger.Answer]) {
        if let claimedID {
            guard let transaction = transactions.first(where: { $0.transactionId == claimedID }) else { return (nil, []) }
            let answer = try await receipts.apply(transaction, claim: claim, metadata: metadata)
            return (answer, [answer])
        }
        var forOrder: TransactionID?
        if let orderID = claim.orderId {
            let holders = try await receipts.holders(of: transactions.map(\.transactionId))
            let product = try await receipts.orders.order(orderID)?.productId
            forOrder = transactions.first(where: { holders[$0.transactionId] == .some(orderID) })?.transactionId
                ?? transactions.first(where: { holders[$0.transactionId] == nil && $0.productId == product })?.transactionId
        }
        var all: [ReceiptLedger.Answer] = []
        for transaction in transactions {
            let mine = transaction.transactionId == forOrder
            let answer = try await receipts.apply(
                transaction, claim: .init(userId: claim.userId, orderId: mine ? claim.orderId : nil), metadata: metadata)
            all.append(answer)
        }
        let primary = all.first { $0.transactionId == forOrder } ?? all.first
        return (primary, all)
    }

    /// A proof that did not verify: `retry-later` when it may yet (Apple unavailable, no roots
    /// configured), else `rejected`, recorded for audit. No order changes either way.
    private func refuse(
        _ error: AppleVerificationError, format: ReceiptFormat, proof: String, claim: ReceiptLedger.Claim,
        transactionId: TransactionID?, metadata: Data
    ) async throws -> Response {
        var json: [String: Any] = [
            "outcome": error.isRetryable ? ReceiptOutcome.retryLater.rawValue : ReceiptOutcome.rejected.rawValue,
            "reason": error.code, "message": error.message,
            // A proof the receipt does not contain may appear once the client refreshes its receipt.
            "finishTransaction": !error.isRetryable && error.code != "transaction-not-in-receipt",
        ]
        if let status = error.appleStatus { json["appleStatus"] = status }
        if let orderId = claim.orderId { json["orderId"] = orderId.rawValue }
        if let transactionId { json["transactionId"] = transactionId.rawValue }
        metrics.receiptAnswered(json["outcome"] as! String)
        if error.isRetryable {
            var response = Rendering.response(.ok, json)
            response.headers[.retryAfter] = "60"
            return response
        }
        try await receipts.recordRejection(
            .init(reason: error.code, message: error.message, format: format, receiptSha256: AppleProofVerifier.sha256(proof),
                  orderId: claim.orderId, userId: claim.userId, transactionId: transactionId),
            metadata: metadata)
        return Rendering.response(.ok, json)
    }

    /// The answer's JSON; for a legacy receipt, with each of its transactions' answers.
    static func response(_ answer: ReceiptLedger.Answer, transactions: [ReceiptLedger.Answer]? = nil) -> Response {
        var json = text(answer)
        if let transactions {
            json.add("transactions", raw: "[" + transactions.map { text($0).result }.joined(separator: ",") + "]")
        }
        return Response(status: .ok, headers: [.contentType: "application/json; charset=utf-8"], body: .init(byteBuffer: ByteBuffer(string: json.result)))
    }

    static func text(_ answer: ReceiptLedger.Answer) -> JSONText {
        var json = JSONText()
        json.add("outcome", answer.outcome.rawValue)
        json.add("transactionId", answer.transactionId.rawValue)
        json.add("orderId", answer.orderId?.rawValue)
        json.add("state", answer.state?.rawValue)
        json.add("finishTransaction", answer.finishTransaction)
        if let reason = answer.reason { json.add("reason", reason) }
        return json
    }
}
