import Synchronization

/// How many times PostgreSQL answered the ledger's own work on its pool (a lease's statements
/// returned, or PostgreSQL refused one with an error of its own). The health's probe reads it:
/// a probe left unanswered while PostgreSQL answered the pool is a slow database, not a silent one.
public final class DatabaseAnswers: Sendable {
    private let count = Atomic<Int>(0)

    public init() {}

    /// The answers so far; only its changes mean anything.
    public var total: Int { count.load(ordering: .relaxed) }

    func note() {
        count.add(1, ordering: .relaxed)
    }
}
