import AppleReceipts
import LedgerCore
import LedgerStore
import Logging
import Synchronization

/// The apps the ledger holds, as the verifier of proofs finds them by the bundle id Apple signed,
/// kept in memory so that a proof costs no database round trip: read again when
/// `invalidate()` says this server changed them, when an app is not found (an app another server
/// or `ledger apps add` added a moment ago is found at once), and when the copy is older than
/// `maximumAge` (what another server or command changed of an app this one knows is taken
/// within that). Concurrent readings are one: every lookup that needs a fresher copy than the
/// one held waits for the same statement.
public final class AppDirectory: AppleAppDirectory {
    /// One reading of the apps: by bundle id in lower case.
    struct Copy: Sendable {
        let number: Int
        let readAt: ContinuousClock.Instant
        let apps: [String: AppleProofVerifier.App]
        let sharedSecrets: [String: String]
    }

    private struct State {
        var copy: Copy?
        var reading: (number: Int, task: Task<Copy, any Error>)?
        /// Readings started so far; a copy numbered below `required` is not used.
        var started = 0
        var required = 0
    }

    let catalog: AppCatalog
    let maximumAge: Duration
    let logger: Logger
    private let state = Mutex(State())
    /// Whether the apps may be read yet, and the readings waiting until they may.
    private let gate: Mutex<(open: Bool, waiting: [CheckedContinuation<Void, Never>])>

    /// `open`: false when the apps are not all recorded yet (`ledger serve` records the
    /// configured app before it answers, while its background work may already verify): no
    /// reading is made until `open()`.
    public init(catalog: AppCatalog, maximumAge: Duration = .seconds(10), logger: Logger, open: Bool = true) {
        self.catalog = catalog
        self.maximumAge = maximumAge
        self.logger = logger
        gate = Mutex((open, []))
    }

    /// The apps may be read from now on.
    public func open() {
        let waiting = gate.withLock { gate in
            gate.open = true
            defer { gate.waiting = [] }
            return gate.waiting
        }
        for reading in waiting { reading.resume() }
    }

    private func opened() async {
        await withCheckedContinuation { (reading: CheckedContinuation<Void, Never>) in
            let open = gate.withLock { gate in
                if !gate.open { gate.waiting.append(reading) }
                return gate.open
            }
            if open { reading.resume() }
        }
    }

    /// This server changed an app: the next lookup reads them again.
    public func invalidate() {
        state.withLock { $0.required = $0.started + 1 }
    }

    public func app(bundleId: String) async throws(AppleVerificationError) -> AppleProofVerifier.App? {
        let key = bundleId.lowercased()
        let asked = state.withLock { $0.started + 1 }
        if let app = try await current().apps[key] { return app }
        // Not found: read once more, unless a reading that started since the question was asked
        // said so already.
        return try await copy(atLeast: asked).apps[key]
    }

    public func sharedSecrets() async throws(AppleVerificationError) -> [String: String] {
        try await current().sharedSecrets
    }

    /// The copy to use now: the one held, unless this server changed the apps since or it is
    /// older than `maximumAge`.
    private func current() async throws(AppleVerificationError) -> Copy {
        let now = ContinuousClock.now
        let needed = state.withLock { state -> Int in
            guard let copy = state.copy, now - copy.readAt > maximumAge else { return state.required }
            // Stale: a reading under way is fresher; else a new one.
            return max(state.required, state.reading?.number ?? state.started + 1)
        }
        return try await copy(atLeast: needed)
    }

    /// A copy numbered `number` or later: the one held, the reading under way, or a new reading.
    private func copy(atLeast number: Int) async throws(AppleVerificationError) -> Copy {
        enum Next { case held(Copy), wait(Task<Copy, any Error>) }
        let next = state.withLock { state -> Next in
            if let copy = state.copy, copy.number >= number { return .held(copy) }
            if let reading = state.reading, reading.number >= number { return .wait(reading.task) }
            state.started += 1
            let started = state.started
            let reader = self.catalog
            let task = Task {
                await self.opened()
                return try await Self.read(reader, number: started)
            }
            state.reading = (started, task)
            return .wait(task)
        }
        switch next {
        case .held(let copy): return copy
        case .wait(let task):
            do {
                let copy = try await task.value
                state.withLock { state in
                    if (state.copy?.number ?? 0) < copy.number { state.copy = copy }
                    if state.reading?.number == copy.number { state.reading = nil }
                }
                return copy
            } catch {
                state.withLock { state in
                    if state.reading?.task == task { state.reading = nil }
                }
                logger.warning("the apps could not be read", metadata: ["error": "\(String(reflecting: error))"])
                throw AppleVerificationError(
                    code: "apps-unavailable", message: "the ledger could not read its apps to check the proof against", isRetryable: true)
            }
        }
    }

    private static func read(_ catalog: AppCatalog, number: Int) async throws -> Copy {
        let readAt = ContinuousClock.now
        let apps = try await catalog.list()
        let secrets = try await catalog.sharedSecrets()
        return Copy(
            number: number, readAt: readAt,
            apps: Dictionary(apps.map { app in
                (app.bundleId.rawValue.lowercased(), AppleProofVerifier.App(
                    bundleId: app.bundleId.rawValue, appAppleId: app.appAppleId,
                    environments: Set(app.environments.compactMap { AppleEnvironment(rawValue: $0.rawValue) })))
            }) { first, _ in first },
            sharedSecrets: Dictionary(secrets.map { ($0.key.rawValue.lowercased(), $0.value) }) { first, _ in first })
    }
}
