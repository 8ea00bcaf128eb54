import Synchronization

/// A wait that a signal ends early: the health loop's pause between probes.
final class Wakeup: Sendable {
    private struct State {
        var signalled = false
        var waiter: CheckedContinuation<Void, Never>?
        var generation = 0
    }

    private let state = Mutex(State())

    /// Ends the current wait, or the next one at once.
    func signal() {
        let waiter: CheckedContinuation<Void, Never>? = state.withLock { state in
            guard let waiter = state.waiter else {
                state.signalled = true
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.resume()
    }

    /// Until a signal, `limit`, or cancellation.
    func wait(atMost limit: Duration) async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let generation: Int? = state.withLock { state in
                    guard !state.signalled, !Task.isCancelled else {
                        state.signalled = false
                        return nil
                    }
                    state.waiter = continuation
                    state.generation += 1
                    return state.generation
                }
                guard let generation else { return continuation.resume() }
                Task {
                    try? await Task.sleep(for: limit)
                    let expired: CheckedContinuation<Void, Never>? = self.state.withLock { $0.generation == generation ? $0.waiter.take() : nil }
                    expired?.resume()
                }
            }
        } onCancel: {
            signal()
        }
    }
}
