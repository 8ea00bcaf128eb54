import Foundation
import LedgerCore
import Synchronization

/// Which app a new order belongs to (`POST /v1/orders`'s `bundleId`, issue 39): the app named,
/// in the spelling the ledger holds it; with none named, the ledger's only app, or none while it
/// holds none; several apps and none named is `bundle-id-required`.
///
/// It reads the apps from a copy at most `maximumAge` old, so that creating an order costs no
/// query: the apps change seldom, and `append_events` checks every new order's app again in the
/// database transaction (an app added or retired meanwhile by another server is refused there).
/// What the copy can miss: a second app added elsewhere within `maximumAge`, in which time an
/// order that names none still goes to the first, which the ledger held.
public final class OrderApps: Sendable {
    public let catalog: AppCatalog
    public let maximumAge: Duration
    private let known = Mutex<(apps: [App], read: ContinuousClock.Instant)?>(nil)

    public init(catalog: AppCatalog, maximumAge: Duration = .seconds(1)) {
        self.catalog = catalog
        self.maximumAge = maximumAge
    }

    /// The app of a new order that names `given` (nil: none).
    public func app(of given: BundleID?) async throws -> App? {
        var apps = try await self.apps(fresh: false)
        if let given {
            var found = Self.find(given, in: apps)
            if found == nil {
                // Added since the copy was read, perhaps by another server.
                apps = try await self.apps(fresh: true)
                found = Self.find(given, in: apps)
            }
            guard let app = found else { throw OrderLedgerError.unknownApp(given) }
            guard !app.retired else { throw OrderLedgerError.appRetired(app.bundleId) }
            return app
        }
        if apps.count > 1 { throw OrderLedgerError.bundleIDRequired }
        return apps.first
    }

    /// The app an existing order of `bundle` belongs to (nil: the ledger's only app, as for an
    /// order made before it held apps), retired or not; nil when the ledger holds no such app.
    public func app(ofOrder bundle: BundleID?) async throws -> App? {
        var apps = try await self.apps(fresh: false)
        guard let bundle else { return apps.count == 1 ? apps.first : nil }
        if Self.find(bundle, in: apps) == nil { apps = try await self.apps(fresh: true) }
        return Self.find(bundle, in: apps)
    }

    /// Whether an app the ledger holds does not take `environment` (from the copy).
    public func anyRefuses(_ environment: App.Environment) async throws -> Bool {
        try await apps(fresh: false).contains { !$0.environments.contains(environment) }
    }

    /// Forgets the copy: the apps changed (`POST /v1/apps`, `PATCH /v1/apps/{bundleId}`).
    public func forget() {
        known.withLock { $0 = nil }
    }

    private func apps(fresh: Bool) async throws -> [App] {
        let now = ContinuousClock.now
        if !fresh, let copy = known.withLock({ $0 }), now - copy.read < maximumAge { return copy.apps }
        let apps = try await catalog.list()
        known.withLock { $0 = (apps, now) }
        return apps
    }

    /// Apple holds bundle ids without regard to case, and so does the ledger.
    private static func find(_ id: BundleID, in apps: [App]) -> App? {
        let wanted = id.rawValue.lowercased()
        return apps.first { $0.bundleId.rawValue.lowercased() == wanted }
    }
}
