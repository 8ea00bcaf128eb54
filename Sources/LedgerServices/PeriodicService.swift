import Logging
import ServiceLifecycle

/// Work inside `ledger serve` every `interval` until shutdown (the reconciler's passes, the
/// history sweeps, the calls to Apple): a failed run is logged and the next one comes on time.
public struct PeriodicService: Service {
    let name: String
    let interval: Duration
    let logger: Logger
    /// The wait before the first run (nil: `interval`).
    var firstWait: Duration? = nil
    /// False: runs until one succeeds (a pass at start; a failed one, say before the migrations
    /// are done or while Apple is away, is tried again `interval` later).
    var repeats = true
    /// Waited for before the first run: the server's start (its migrations done, its configured
    /// app recorded), so that no run meets a schema older than its code.
    let ready: (@Sendable () async throws -> Void)?
    let work: @Sendable () async throws -> Void

    public init(
        name: String, interval: Duration, logger: Logger, firstWait: Duration? = nil, repeats: Bool = true,
        ready: (@Sendable () async throws -> Void)? = nil, work: @escaping @Sendable () async throws -> Void
    ) {
        self.name = name
        self.interval = interval
        self.logger = logger
        self.firstWait = firstWait
        self.repeats = repeats
        self.ready = ready
        self.work = work
    }

    public func run() async throws {
        await cancelWhenGracefulShutdown {
            var wait = firstWait ?? interval
            if let ready {
                // Shutdown before the start: nothing ran, nothing to end.
                do { try await ready() } catch { return }
            }
            while !Task.isCancelled {
                // Shutdown cancels the wait: the service then ends normally, not with an error.
                do { try await Task.sleep(for: wait) } catch { return }
                wait = interval
                var succeeded = false
                do {
                    try await work()
                    succeeded = true
                } catch where error is CancellationError || Task.isCancelled {
                    // Shutdown: a statement cut short by it fails with the connection closed.
                    return
                } catch {
                    logger.error("\(name) failed", metadata: ["error": "\(String(reflecting: error))"])
                }
                if !repeats, succeeded {
                    // A service that ends would end the server: this one waits for shutdown.
                    try? await gracefulShutdown()
                    return
                }
            }
        }
    }
}
