import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Where `ledger demo` is in its story. The story prints its summary only at its end; should a
/// step hang, standard error names the step (and what was printed so far is flushed) once a
/// minute, so a stuck demo says where it waits.
final class DemoProgress: Sendable {
    private let state = Mutex<(step: String?, since: ContinuousClock.Instant, told: Duration)>(("starting", .now, .zero))
    private let patience: Duration

    init(patience: Duration = .seconds(60)) {
        self.patience = patience
    }

    /// The step the demo starts now; nil while it waits for its user (`--explore`).
    func enter(_ step: String?) {
        state.withLock { $0 = (step, .now, .zero) }
    }

    /// Watches the steps until the task is cancelled.
    func watch() -> Task<Void, Never> {
        Task { [self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(5))
                let stuck: (String, Duration)? = state.withLock { state in
                    let waited = ContinuousClock.now - state.since
                    guard let step = state.step, waited >= state.told + patience else { return nil }
                    state.told = waited
                    return (step, waited)
                }
                if let (step, waited) = stuck {
                    fflush(nil)
                    FileHandle.standardError.write(Data("ledger demo: still \(step) after \(waited.components.seconds) s\n".utf8))
                }
            }
        }
    }
}
