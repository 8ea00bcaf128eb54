import Synchronization

/// Group commit: work that arrives while a batch is being written waits, and goes with the others
/// that arrived meanwhile into the next batch: one database transaction and a few round trips for
/// many callers, each still answered on its own.
///
/// No background task: the caller that finds a writer slot free writes everything pending, then
/// keeps writing what arrived meanwhile; the others wait for their answer.
public final class GroupCommit<Work: Sendable, Answer: Sendable>: Sendable {
    /// One piece of work waiting for its answer.
    public struct Pending: Sendable {
        public let work: Work
        public let continuation: Waiter
    }

    /// A caller's wait, resumed once: by its batch's answer, or with `CancellationError` when the
    /// caller is cancelled first (a request answered 503 while the database is away). The
    /// batch's answer for it is then dropped; a write that commits after all is safe, since
    /// clients retry with the same ids.
    public final class Waiter: Sendable {
        private enum State {
            case starting
            case waiting(CheckedContinuation<Answer, any Error>)
            case done
        }

        private let state = Mutex(State.starting)

        /// Keeps `continuation`; false (and resumed with `CancellationError`) when cancelled already.
        fileprivate func wait(_ continuation: CheckedContinuation<Answer, any Error>) -> Bool {
            let waiting = state.withLock { state in
                guard case .starting = state else { return false }
                state = .waiting(continuation)
                return true
            }
            if !waiting { continuation.resume(throwing: CancellationError()) }
            return waiting
        }

        public func resume(with result: Result<Answer, any Error>) {
            let continuation: CheckedContinuation<Answer, any Error>? = state.withLock { state in
                defer { state = .done }
                guard case .waiting(let continuation) = state else { return nil }
                return continuation
            }
            continuation?.resume(with: result)
        }
    }

    /// How much batching has happened (for tests and the benchmark).
    public struct Statistics: Sendable, Equatable {
        public var batches = 0
        public var items = 0
        /// Work waiting for a batch now.
        public var waiting = 0
    }

    /// Which of the pending work (oldest first) the next batch takes, as indices in increasing
    /// order; at least the first. What it leaves waits for a later batch, in order.
    public typealias Select = @Sendable ([Work]) -> [Int]
    /// Writes one batch and resumes every continuation in it.
    public typealias Execute = @Sendable ([Pending]) async -> Void
    /// Runs a writer's batches (`body`, until none is pending) inside a resource held for all of
    /// them (a leased connection); answers false when it could not run `body` at all.
    public typealias Session = @Sendable (_ body: @Sendable () async -> Void) async -> Bool

    private struct State: ~Copyable {
        var pending: [Pending] = []
        var writers = 0
        var statistics = Statistics()
    }

    private let state = Mutex(State())
    private let select: Select
    private let execute: Execute
    private let session: Session?

    /// One writer at a time: a second made smaller batches, each as long, and fewer events per second.
    private let maximumWriters = 1
    /// How often the writer yields, at most, for the callers it just answered to submit again, so
    /// that the next batch carries them all instead of a few.
    private let yieldsBetweenBatches = 16

    /// Where the writer task runs (nil: the global executor).
    private let executor: (any TaskExecutor)?

    public init(executor: (any TaskExecutor)? = nil, session: Session? = nil, select: @escaping Select, execute: @escaping Execute) {
        self.executor = executor
        self.session = session
        self.select = select
        self.execute = execute
    }

    public var statistics: Statistics {
        state.withLock { state in
            var statistics = state.statistics
            statistics.waiting = state.pending.count
            return statistics
        }
    }

    /// Waits for `work` to be written in some batch and answers what that batch said of it.
    /// Cancelled, it throws `CancellationError` at once, and its work is dropped if no batch has
    /// taken it yet.
    public func submit(_ work: Work) async throws -> Answer {
        let waiter = Waiter()
        return try await withTaskCancellationHandler {
            try await enqueue(work, waiter)
        } onCancel: {
            state.withLock { $0.pending.removeAll { $0.continuation === waiter } }
            waiter.resume(with: .failure(CancellationError()))
        }
    }

    private func enqueue(_ work: Work, _ waiter: Waiter) async throws -> Answer {
        try await withCheckedThrowingContinuation { continuation in
            guard waiter.wait(continuation) else { return }
            let batch: [Pending]? = state.withLock { state in
                state.pending.append(Pending(work: work, continuation: waiter))
                guard state.writers < maximumWriters else { return nil }
                state.writers += 1
                return take(&state)
            }
            if let batch {
                // High priority: callers that do much work of their own between submissions (HTTP
                // requests) would otherwise keep the writer waiting behind it all.
                Task(executorPreference: executor, priority: .high) { await self.write(startingWith: batch) }
            }
        }
    }

    private func write(startingWith first: [Pending]) async {
        if let session, await session({ await self.writeBatches(startingWith: first) }) { return }
        await writeBatches(startingWith: first)
    }

    private func take(_ state: inout State) -> [Pending] {
        let chosen = select(state.pending.map(\.work))
        let batch = chosen.map { state.pending[$0] }
        for index in chosen.reversed() { state.pending.remove(at: index) }
        state.statistics.batches += 1
        state.statistics.items += batch.count
        return batch
    }

    private func writeBatches(startingWith first: [Pending]) async {
        var batch = first
        while true {
            await execute(batch)
            for _ in 0..<yieldsBetweenBatches where state.withLock({ $0.pending.count < batch.count }) {
                await Task.yield()
            }
            let next: [Pending]? = state.withLock { state in
                if state.pending.isEmpty {
                    state.writers -= 1
                    return nil
                }
                return take(&state)
            }
            guard let next else { return }
            batch = next
        }
    }
}
