import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerServices
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

    func look(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<AppleOrderLookup.Found> {
        let orderID = try pathParameter(context, "appleOrderId")
        guard !orderID.isEmpty, orderID.count <= 64, orderID.unicodeScalars.allSatisfy({ $0.isASCII && $0.properties.isAlphabetic || ("0"..."9").contains($0) })
        else { throw LedgerInputError(field: "appleOrderId", problem: "must be the letters and digits of an Apple order id, such as MQ1N2CD3EF") }
        let userID = try await OptionalUserBody.user(of: request, context)
        guard let lookup else { throw APIError.appleAPINotConfigured }
        do {
            return Answer(try await lookup.look(up: orderID, user: userID, metadata: context.eventMetadata))
        } catch let error as AppStoreServerAPIError {
            throw APIError.from(error)
        }
    }
}
