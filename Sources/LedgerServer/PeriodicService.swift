import Logging
import ServiceLifecycle

/// Work inside `ledger serve` every `interval` until shutdown (the reconciler's passes, the
/// history sweeps, the calls to Apple): a failed run is logged and the next one comes on time.
struct PeriodicService: Service {
    let name: String
    let interval: Duration
    let logger: Logger
    let work: @Sendable () async throws -> Void

    func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                // Shutdown cancels the wait: the service then ends normally, not with an error.
                do { try await Task.sleep(for: interval) } catch { return }
                do {
                    try await work()
                } catch is CancellationError {
                    return
                } catch {
                    logger.error("\(name) failed", metadata: ["error": "\(String(reflecting: error))"])
                }
            }
        }
    }
}
