import Hummingbird
import LedgerServices

/// `POST /v1/recover` (admin) `{userId?}`: one history sweep, of every due account or of one
/// user's, answered with its counts.
struct RecoverController {
    let sweep: HistorySweep?

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/recover") { request, context in try await recover(request, context) }
    }

    func recover(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<HistorySweep.Summary> {
        let user = try await OptionalUserBody.user(of: request, context)
        guard let sweep else { throw APIError.appleAPINotConfigured }
        return Answer(try await sweep.run(user: user, metadata: context.eventMetadata))
    }
}
