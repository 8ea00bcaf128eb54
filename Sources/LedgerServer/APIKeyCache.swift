import LedgerStore
import Synchronization

/// Keys found recently, so a busy client's every request does not cost a database round trip.
/// Only found keys are kept, for `ttl`: a revoked key stops working within that time (5 s by
/// default; docs/operations.md says so), a new key works at once.
final class APIKeyCache: Sendable {
    let keys: APIKeyStore
    let ttl: Duration
    private let found = Mutex<[String: (APIKey, ContinuousClock.Instant)]>([:])
    static let maximumEntries = 10_000

    init(keys: APIKeyStore, ttl: Duration = .seconds(5)) {
        self.keys = keys
        self.ttl = ttl
    }

    func find(key: String) async throws -> APIKey? {
        let now = ContinuousClock.now
        if let (record, expires) = found.withLock({ $0[key] }), now < expires { return record }
        guard let record = try await keys.find(key: key) else {
            found.withLock { _ = $0.removeValue(forKey: key) }
            return nil
        }
        found.withLock { cache in
            if cache.count >= Self.maximumEntries { cache.removeAll() }
            cache[key] = (record, now + ttl)
        }
        return record
    }
}
