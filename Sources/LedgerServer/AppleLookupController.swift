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

    /// The body, which may be empty.
    struct Lookup: Decodable {
        let userId: UserID?
    }

    func look(_ request: Request, _ context: LedgerRequestContext) async throws -> AppleOrderLookup.Found {
        let orderID = try pathParameter(context, "appleOrderId")
        guard !orderID.isEmpty, orderID.count <= 64, orderID.unicodeScalars.allSatisfy({ $0.isASCII && $0.properties.isAlphabetic || ("0"..."9").contains($0) })
        else { throw LedgerInputError(field: "appleOrderId", problem: "must be the letters and digits of an Apple order id, such as MQ1N2CD3EF") }
        var request = request
        let body = try await request.collectBody(upTo: context.maxUploadSize)
        let userID = body.readableBytes == 0 ? nil : try await request.decode(as: Lookup.self, context: context).userId
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

/// The App Store Server API client, made on first use from settings checked at start.
public actor LazyAppStoreServerAPI {
    let settings: AppStoreServerAPI.Settings
    let logger: Logger
    private var made: AppStoreServerAPI?

    public init(settings: AppStoreServerAPI.Settings, logger: Logger) {
        self.settings = settings
        self.logger = logger
    }

    public func client() async throws(AppStoreServerAPIError) -> AppStoreServerAPI {
        if let made { return made }
        let client = try await AppStoreServerAPI(settings: settings, logger: logger)
        made = client
        return client
    }
}

extension APIError {
    /// An App Store Server API failure as the ledger's answer: Apple's "no such order" a 404,
    /// Apple busy or away a 503, anything else Apple refused a 502; the code is the client's.
    static func from(_ error: AppStoreServerAPIError) -> APIError {
        let status: HTTPResponse.Status = switch error.code {
        case "apple-order-not-found", "apple-api-not-found": .notFound
        case "apple-api-rate-limited", "apple-api-unavailable", "apple-api-timeout", "apple-api-unreachable": .serviceUnavailable
        default: .badGateway
        }
        return APIError(status, code: error.code, message: error.description)
    }
}
