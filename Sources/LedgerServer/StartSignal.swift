import Synchronization

/// Said once the schema is current and the configured app recorded (the application's
/// `beforeServerStarts`): background work that reads the apps waits for it, so that a pass at
/// start does not find the ledger without its app.
final class StartSignal: Sendable {
    private let opened = Mutex(false)

    func open() { opened.withLock { $0 = true } }

    /// Until `open()`; throws `CancellationError` when the server stops first.
    func wait() async throws {
        while !opened.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(50)) }
    }
}
