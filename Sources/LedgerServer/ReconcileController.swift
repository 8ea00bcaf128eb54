import Foundation
import Hummingbird
import LedgerCore
import LedgerServices
import LedgerStore

/// `POST /v1/reconcile` (admin): one reconciler pass, answered with its counts.
struct ReconcileController {
    let pass: ReconcilerPass

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/reconcile") { _, context in
            Answer(try await pass.run(metadata: context.eventMetadata))
        }
    }
}
