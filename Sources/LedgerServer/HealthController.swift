import Hummingbird
import LedgerStore

/// `GET /healthz` (the process answers) and `GET /readyz` (the database is reachable and migrated).
struct HealthController {
    let database: Database
    let migrator: Migrator

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.get("/healthz") { _, _ in
            try jsonResponse(.ok, ["status": "ok"])
        }
        router.get("/readyz") { _, _ in
            try await readiness()
        }
    }

    func readiness() async throws -> Response {
        let status: MigrationStatus
        do {
            status = try await migrator.status(database.client)
        } catch {
            return try jsonResponse(.serviceUnavailable, ["status": "not-ready", "reason": "the database is unreachable"])
        }
        guard status == .current else {
            return try jsonResponse(.serviceUnavailable, ["status": "not-ready", "reason": MigrationError(status: status).description])
        }
        return try jsonResponse(.ok, ["status": "ready"])
    }
}
