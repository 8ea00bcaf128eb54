import Hummingbird
import LedgerCore
import LedgerServices
import LedgerStore

/// `POST /v1/recover?bundleId=` (admin) `{userId?}`: one history sweep, of every due account or of
/// one user's, each with its app's key (accounts of an app without one are skipped), answered
/// with its counts; 503 while no app has a key. It sweeps every app (an all-apps key's route), or
/// the one `bundleId` names; user ids are per app, so one user's sweep names its app once the
/// ledger holds several (400 `bundle-id-required`).
struct RecoverController {
    let sweep: HistorySweep
    let api: LazyAppStoreServerAPI
    let apps: OrderApps
    let catalog: AppCatalog

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/recover") { request, context in try await recover(request, context) }
    }

    func recover(_ request: Request, _ context: LedgerRequestContext) async throws -> Answer<HistorySweep.Summary> {
        let user = try await OptionalUserBody.user(of: request, context)
        let given = request.uri.queryParameters["bundleId"]
        let scope = user != nil || given != nil ? try await context.userApps(named: given, apps: apps, catalog: catalog) : nil
        guard try await api.anyKey() else { throw APIError.appleAPINotConfigured }
        return Answer(try await sweep.run(user: user, apps: scope, metadata: context.eventMetadata))
    }
}
