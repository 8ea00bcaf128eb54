import Hummingbird
import LedgerStore

/// `GET /healthz` (the process answers) and `GET /readyz` (the database is reachable and migrated).
struct HealthController {
    let database: Database
    let migrator: Migrator
    /// Whether PostgreSQL answers (nil: a router without it; readiness then asks and waits).
    let health: DatabaseHealth?

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/healthz") { _, _ in
            Answer(["status": "ok"])
        }
        router.get("/readyz") { _, _ in
            await readiness()
        }
    }

    /// Not ready while the health has the database down; else the migrations' status, however
    /// long a busy database takes to tell it (a slow answer is not an unreachable database; the
    /// health's probe decides that, and then readiness answers at once).
    func readiness() async -> Answer<[String: String]> {
        let unreachable = Answer(.serviceUnavailable, ["status": "not-ready", "reason": "the database is unreachable"])
        let status: MigrationStatus
        do {
            if let health {
                guard await health.availability() else { return unreachable }
                status = try await health.unlessUnavailable { [migrator, database] in try await migrator.status(database) }
            } else {
                status = try await migrator.status(database)
            }
        } catch {
            return unreachable
        }
        guard status == .current else {
            return Answer(.serviceUnavailable, ["status": "not-ready", "reason": MigrationError(status: status).description])
        }
        return Answer(["status": "ready"])
    }
}
