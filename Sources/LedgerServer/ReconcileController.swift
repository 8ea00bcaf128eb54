import Foundation
import Hummingbird
import LedgerCore
import LedgerStore
import Logging
import ServiceLifecycle

/// `POST /v1/reconcile` (admin): one reconciler pass, answered with its counts.
struct ReconcileController {
    let pass: ReconcilerPass

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/reconcile") { _, context in
            Answer(try await pass.run(metadata: context.eventMetadata))
        }
    }
}

/// The reconciler inside `ledger serve`: a pass every `interval`, until shutdown. A failed pass
/// is logged and the next one comes on time.
struct ReconcilerService: Service {
    let pass: ReconcilerPass
    let interval: Duration
    let logger: Logger

    func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                // Shutdown cancels the wait: the service then ends normally, not with an error.
                do { try await Task.sleep(for: interval) } catch { return }
                do {
                    let summary = try await pass.run()
                    if summary.paired > 0 || summary.lostRaces > 0 {
                        logger.info("reconciler pass", metadata: [
                            "reconcile.paired": "\(summary.paired)", "reconcile.ambiguous": "\(summary.ambiguous)",
                            "reconcile.considered": "\(summary.considered)", "reconcile.lost_races": "\(summary.lostRaces)",
                        ])
                    }
                } catch is CancellationError {
                    return
                } catch {
                    logger.error("reconciler pass failed", metadata: ["error": "\(String(reflecting: error))"])
                }
            }
        }
    }
}
