import Foundation
import Hummingbird
import LedgerCore
import LedgerStore

/// `POST /v1/recover` (admin) `{userId?}`: one history sweep, of every due account or of one
/// user's, answered with its counts.
struct RecoverController {
    let sweep: HistorySweep?

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/recover") { request, context in try await recover(request, context) }
    }

    struct Recover: Decodable {
        let userId: UserID?
    }

    func recover(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<HistorySweep.Summary> {
        var request = request
        let body = try await request.collectBody(upTo: context.maxUploadSize)
        let user = body.readableBytes == 0 ? nil : try await request.decode(as: Recover.self, context: context).userId
        guard let sweep else { throw APIError.appleAPINotConfigured }
        return Answer(try await sweep.run(user: user, metadata: context.eventMetadata))
    }
}

extension APIError {
    /// The answer of a route that asks Apple when no In-App Purchase key is configured.
    static let appleAPINotConfigured = APIError(
        .serviceUnavailable, code: "apple-api-not-configured",
        message: "the App Store Server API is not configured (LEDGER_APPLE_API_KEY_ID, LEDGER_APPLE_API_ISSUER_ID, LEDGER_APPLE_API_PRIVATE_KEY)")
}
