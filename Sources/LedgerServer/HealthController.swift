import Hummingbird
import LedgerStore

/// `GET /healthz` (the process answers) and `GET /readyz` (the database is reachable and migrated).
struct HealthController {
    let database: Database
    let migrator: Migrator

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/healthz") { _, _ in
            Answer(["status": "ok"])
        }
        router.get("/readyz") { _, _ in
            await readiness()
        }
    }

    /// How long readiness waits for the database before answering 503.
    static let databaseTimeout = Duration.seconds(2)

    func readiness() async -> Answer<[String: String]> {
        let status: MigrationStatus
        do {
            status = try await withThrowingTaskGroup(of: MigrationStatus.self) { group in
                group.addTask { try await migrator.status(database.client) }
                group.addTask {
                    try await Task.sleep(for: Self.databaseTimeout)
                    throw CancellationError()
                }
                defer { group.cancelAll() }
                return try await group.next()!
            }
        } catch {
            return Answer(.serviceUnavailable, ["status": "not-ready", "reason": "the database is unreachable"])
        }
        guard status == .current else {
            return Answer(.serviceUnavailable, ["status": "not-ready", "reason": MigrationError(status: status).description])
        }
        return Answer(["status": "ready"])
    }
}
