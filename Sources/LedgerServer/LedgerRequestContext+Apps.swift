import AppleReceipts
import Hummingbird
import LedgerCore
import LedgerStore

/// What the request's key may reach (issue 39, "Keys are scoped to apps"; docs/apps.md).
extension LedgerRequestContext {
    /// Whether the key reaches rows of `app`: a key of every app reaches every row, those of no
    /// app too; a key limited to apps reaches only its apps' rows (a row of no app is none of them).
    func reaches(_ app: BundleID?) -> Bool {
        guard let keyApps else { return true }
        guard let app else { return false }
        return keyApps.contains(app)
    }

    /// Refuses, with 403 `app-not-allowed`, what names an app the key does not reach: an order to
    /// create for it, a proof Apple signed for it. Nothing is hidden here, as the caller named the
    /// app (or sent what names it); an unknown app is answered the same way, so the answer says
    /// nothing of which apps the ledger holds.
    func requireReach(bundleId: String) throws {
        guard let keyApps else { return }
        // Apple holds bundle ids case-insensitive, and so does the apps table.
        let folded = bundleId.lowercased()
        guard !keyApps.contains(where: { $0.rawValue.lowercased() == folded }) else { return }
        throw notReached(bundleId)
    }

    /// The 403 `app-not-allowed` of `requireReach`.
    func notReached(_ bundleId: String) -> APIError {
        APIError(.forbidden, code: AppleVerificationError.notReachedCode,
                 message: "the key \(apiKeyName ?? "") does not reach the app \(bundleId); it reaches \((keyApps ?? []).map(\.rawValue).joined(separator: ", "))",
                 details: ["bundleId": .string(bundleId), "apps": .strings((keyApps ?? []).map(\.rawValue))])
    }

    /// The app a request names (`?bundleId=`), as the ledger holds it: one the key reaches (403
    /// `app-not-allowed` otherwise) and the ledger holds (400 `unknown-app`: a misspelt app's
    /// empty list would read as an app with nothing). A retired app's rows are read as any app's.
    func namedApp(_ given: Substring?, catalog: AppCatalog) async throws -> BundleID? {
        guard let given else { return nil }
        let id = try BundleID(String(given))
        try requireReach(bundleId: id.rawValue)
        guard let app = try await catalog.app(id) else {
            throw APIError(.badRequest, code: "unknown-app", message: "the ledger holds no app \(id)", details: ["field": .string("bundleId")])
        }
        return app.bundleId
    }

    /// The apps a user's rows are read from (or swept for). User ids are per app, so a request
    /// names its app (`bundleId`, `given`) unless only one can be meant: the key's one app, or the
    /// ledger's only app (400 `bundle-id-required` otherwise). Nil: every app (a ledger of at most one).
    func userApps(named given: Substring?, apps: OrderApps, catalog: AppCatalog) async throws -> [BundleID]? {
        if let app = try await namedApp(given, catalog: catalog) { return [app] }
        if let keyApps {
            guard keyApps.count == 1 else {
                throw APIError(.badRequest, code: "bundle-id-required",
                               message: "bundleId is missing: the key reaches several apps (\(keyApps.map(\.rawValue).joined(separator: ", "))) and user ids are per app; name one",
                               details: ["field": .string("bundleId")])
            }
            return keyApps
        }
        _ = try await apps.app(of: nil)
        return nil
    }
}
