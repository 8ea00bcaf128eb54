import Hummingbird
import LedgerStore
import Synchronization

/// Answers 503 `database-unavailable` with `Retry-After` on every route that needs the database
/// while `DatabaseHealth` has it down, and answers a request in flight 503 as soon as it is marked
/// down. Health, readiness and metrics always answer.
struct DatabaseGateMiddleware: RouterMiddleware {
    typealias Context = LedgerRequestContext

    let health: DatabaseHealth

    static let ungated: Set<String> = ["/healthz", "/readyz", "/metrics"]

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard !Self.ungated.contains(request.uri.path) else { return try await next(request, context) }
        guard health.isAvailable else { throw APIError.databaseUnavailable }
        do {
            // A request waiting on the database while it is gone would wait until it is back:
            // once the database is marked down its handler is cancelled, and when the handler
            // has stopped it is answered 503. Every wait of a handler ends on cancellation (a
            // pool lease, the group commit, a statement: its connection is closed), so it stops
            // at once. Nothing is lost: a write either committed (and the client's retry with
            // the same ids answers it) or did not. The handler runs in a task of its own, which
            // the health cancels (a task group of the handler and a task waiting for the health
            // cost 2% of the server's CPU and two more task switches a request).
            return try await withoutActuallyEscaping(next) { next in
                let handler = UncheckedSendable(next)
                let task = Task { try await handler.value(request, context) }
                guard let registered = health.whenUnavailable({ task.cancel() }) else {
                    task.cancel()
                    _ = try? await task.value
                    throw APIError.databaseUnavailable
                }
                let outcome: Result<Response, any Error>
                do {
                    outcome = .success(try await withTaskCancellationHandler { try await task.value } onCancel: { task.cancel() })
                } catch {
                    outcome = .failure(error)
                }
                // Marked down meanwhile: 503, whatever the cancelled handler ended with.
                guard health.remove(registered) else { throw APIError.databaseUnavailable }
                return try outcome.get()
            }
        } catch where isConnectionFailure(error) {
            // Answered 503 (RequestIDMiddleware); whether the database is down, the probe decides.
            health.suspect()
            throw error
        }
    }
}

/// The middleware's `next`, run by a task that ends before `withoutActuallyEscaping` returns (its
/// value is awaited); the caller does nothing with it meanwhile.
private struct UncheckedSendable<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

extension DatabaseHealth {
    /// `body`'s result; `APIError.databaseUnavailable` at once when the database is or is marked
    /// down meanwhile (`body` is then cancelled and left to end by itself): for answers that
    /// must not wait for the database to come back.
    func unlessUnavailable<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let answer = FirstAnswer<T>()
        return try await withCheckedThrowingContinuation { continuation in
            answer.set(continuation)
            let task = Task {
                do { answer.resume(with: .success(try await body())) } catch { answer.resume(with: .failure(error)) }
            }
            guard let registered = whenUnavailable({
                task.cancel()
                answer.resume(with: .failure(APIError.databaseUnavailable))
            }) else {
                task.cancel()
                return answer.resume(with: .failure(APIError.databaseUnavailable))
            }
            Task {
                _ = await task.result
                _ = self.remove(registered)
            }
        }
    }
}

/// A continuation resumed by the first of several answers.
private final class FirstAnswer<T: Sendable>: Sendable {
    private let continuation = Mutex<CheckedContinuation<T, any Error>?>(nil)
    func set(_ continuation: CheckedContinuation<T, any Error>) { self.continuation.withLock { $0 = continuation } }
    func resume(with result: Result<T, any Error>) { continuation.withLock { $0.take() }?.resume(with: result) }
}

extension APIError {
    /// The answer while PostgreSQL cannot be reached: retry shortly, the same request again.
    static var databaseUnavailable: APIError {
        APIError(.serviceUnavailable, code: "database-unavailable", message: "the database is unavailable; retry later with the same request",
                 headers: [.retryAfter: "2"])
    }
}
