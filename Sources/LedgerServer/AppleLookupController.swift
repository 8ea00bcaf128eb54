import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerStore
import Logging

/// `POST /v1/apple-orders/{appleOrderId}/lookup` (admin): support's lookup of the order id on a
/// customer's Apple receipt e-mail. Apple's Look Up Order ID names the purchases; each signed
/// transaction is checked as a client's proof is and taken through the same intake (tied by its
/// `appAccountToken`, else into the pool with the user given), and the answer says what became
/// of each.
struct AppleLookupController {
    let lookup: AppleOrderLookup?

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/apple-orders/:appleOrderId/lookup") { request, context in try await look(request, context) }
    }

    func look(_ request: Request, _ context: LedgerRequestContext) async throws -> AppleOrderLookup.Found {
        let orderID = try pathParameter(context, "appleOrderId")
        guard !orderID.isEmpty, orderID.count <= 64, orderID.unicodeScalars.allSatisfy({ $0.isASCII && $0.properties.isAlphabetic || ("0"..."9").contains($0) })
        else { throw LedgerInputError(field: "appleOrderId", problem: "must be the letters and digits of an Apple order id, such as MQ1N2CD3EF") }
        let userID = try await OptionalUserBody.user(of: request, context)
        guard let lookup else { throw APIError.appleAPINotConfigured }
        return try await lookup.look(up: orderID, user: userID, metadata: context.eventMetadata)
    }
}

/// Looks up an Apple order id and takes each of its purchases through the receipts' intake.
public struct AppleOrderLookup: Sendable {
    let api: LazyAppStoreServerAPI
    let verifier: AppleProofVerifier
    let receipts: ReceiptLedger

    public init(api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, receipts: ReceiptLedger) {
        self.api = api
        self.verifier = verifier
        self.receipts = receipts
    }

    /// What became of each purchase of one Apple order.
    public struct Found: ResponseEncodable, Sendable {
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
        }
    }

    public func look(up orderID: String, user: UserID?, metadata: Data) async throws -> Found {
        let signed: [String]
        do {
            signed = try await api.client().lookUpOrder(orderID)
        } catch {
            throw APIError.from(error)
        }
        var entries: [Found.Entry] = []
        for jws in signed {
            do {
                let transaction = try await verifier.verifiedPurchase(signed: jws)
                // The purchase's token decides its order; the user given is for the pool.
                let answer = try await receipts.apply(transaction, claim: .init(userId: nil, orderId: nil, poolUserId: user), metadata: metadata)
                entries.append(.init(
                    transactionId: answer.transactionId.rawValue, outcome: answer.outcome.rawValue, orderId: answer.orderId?.rawValue,
                    state: answer.state?.rawValue, reason: answer.reason))
            } catch let error as AppleVerificationError {
                receipts.orders.database.logger.warning(
                    "a signed transaction from Look Up Order ID was refused", metadata: ["apple.order": "\(orderID)", "error": "\(error.code)"])
                entries.append(.init(transactionId: nil, outcome: ReceiptOutcome.rejected.rawValue, orderId: nil, state: nil, reason: error.code))
            }
        }
        return Found(appleOrderId: orderID, transactions: entries)
    }
}
