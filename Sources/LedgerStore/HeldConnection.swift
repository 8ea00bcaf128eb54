import PostgresNIO

/// A group-commit writer keeps one leased connection while batches follow each other, instead of
/// leasing one per batch: each lease and release goes through the pool's state machine and its
/// idle and keep-alive timers, on other threads than the writer's.
extension Database {
    /// The connection the current group-commit writer holds; only its batch writers read it.
    @TaskLocal static var heldConnection: PostgresConnection?

    /// Runs `body` (a writer's batches until none is pending) with one connection leased for it.
    /// Answers false when no connection could be leased: `body` did not run.
    public func holdingConnection(_ body: @Sendable () async -> Void) async -> Bool {
        do {
            // Only the lease can throw: `body` cannot.
            try await withConnection { connection in await Self.$heldConnection.withValue(connection) { await body() } }
            return true
        } catch {
            logger.debug("a group-commit writer could not hold a connection", metadata: ["error": "\(String(reflecting: error))"])
            return false
        }
    }

    /// `body` on the held connection while it is open; else, or when `body`'s first statement
    /// (wrapped in `first`) finds it closed before sending anything, on a leased one.
    func withHeldConnection<Result: Sendable>(_ body: (PostgresConnection) async throws -> Result) async throws -> Result {
        if let held = Self.heldConnection, !held.isClosed {
            do {
                let result = try await body(held)
                noteAnswer()
                return result
            } catch is StaleConnection {
                logger.debug("the held connection closed; leasing another")
            } catch {
                noteAnswer(error)
                throw error
            }
        }
        return try await withConnection(body)
    }
}
