import AppleReceipts
import Foundation
import Hummingbird
import LedgerCore
import LedgerServices
import LedgerStore

/// `POST /v1/users/{userId}/app-transaction` (append): the app, at login, sends the signed
/// `AppTransaction` StoreKit gave it; once verified, the user owns that Apple account, and
/// purchases of it that reach the ledger without a user are this user's.
struct AppleAccountsController {
    let links: AppleAccountLinks
    let verifier: AppleProofVerifier

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/users/:userId/app-transaction") { request, context in try await link(request, context) }
    }

    struct Claim: ClosedBody {
        let signedAppTransaction: String

        enum CodingKeys: String, CodingKey, CaseIterable { case signedAppTransaction }
    }

    /// What the claim did: `linked`, `already-linked`, or `conflict` (another user owns the
    /// account; recorded for support, the account stays that user's).
    struct Linked: Encodable, Sendable {
        let outcome: AppleAccountLinks.Outcome
        let appTransactionId: AppTransactionID
        let userId: UserID
        let ownerUserId: UserID?
    }

    func link(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<Linked> {
        // The account's purchases resolve to this user: one no order can have is refused.
        let user = try UserID(given: try pathParameter(context, "userId"))
        let claim = try await request.decode(as: Claim.self, context: context)
        let account: AppleAccount
        do {
            // A key limited to apps links accounts of its apps alone, refused before the app is looked at.
            account = try await verifier.reaching(context.keyApps?.map(\.rawValue)).appTransaction(signed: claim.signedAppTransaction)
        } catch where error.isNotReached {
            throw context.notReached(error.bundleId ?? "")
        } catch {
            if error.isRetryable { throw APIError(.serviceUnavailable, code: error.code, message: error.message) }
            throw APIError(.unprocessableContent, code: error.code, message: "signedAppTransaction was refused: \(error.message)")
        }
        let answer = try await links.link(account, to: user, metadata: context.eventMetadata)
        return Answer(Linked(outcome: answer.outcome, appTransactionId: answer.appTransactionId, userId: answer.userId, ownerUserId: answer.ownerUserId))
    }
}
