import Hummingbird
import LedgerServices

/// `POST /v1/recover` (admin) `{userId?}`: one history sweep, of every due account or of one
/// user's, each with its app's key (accounts of an app without one are skipped), answered with
/// its counts; 503 while no app has a key.
struct RecoverController {
    let sweep: HistorySweep
    let api: LazyAppStoreServerAPI

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/recover") { request, context in try await recover(request, context) }
    }

    func recover(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<HistorySweep.Summary> {
        let user = try await OptionalUserBody.user(of: request, context)
        guard try await api.anyKey() else { throw APIError.appleAPINotConfigured }
        return Answer(try await sweep.run(user: user, metadata: context.eventMetadata))
    }
}
