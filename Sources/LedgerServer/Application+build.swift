// LedgerServer: HTTP only (routes, middleware, the health gate) and the application's assembly.

import AppleReceipts
import Hummingbird
import LedgerCore
import LedgerServices
import LedgerStore
import Logging
import PostgresNIO
import ServiceLifecycle

/// Builds the router of every ledger route.
public func buildRouter(
    database: Database, migrator: Migrator, apple: AppleProofVerifier, configuration: LedgerConfiguration = .init(),
    health: DatabaseHealth? = nil
) -> Router<LedgerRequestContext> {
    let metrics = LedgerMetrics()
    let database = database.observingAppends(metrics.eventsAppended)
    return buildRouter(
        services: ServiceAssembly(database: database), migrator: migrator, apple: apple,
        appStoreServerAPI: (try? configuration.apple.appStoreServerAPI()).flatMap { $0 }.map { LazyAppStoreServerAPI(settings: $0, logger: database.logger) },
        configuration: configuration, health: health, metrics: metrics)
}

/// The router. `services`: the one assembly every route and service of this server shares (one
/// writer, so that their events share transactions), on a database whose appends `metrics`
/// already counts; `appStoreServerAPI`: the one client of the API they share (nil: no key).
func buildRouter(
    services: ServiceAssembly, migrator: Migrator, apple: AppleProofVerifier, appStoreServerAPI: LazyAppStoreServerAPI?,
    configuration: LedgerConfiguration, health: DatabaseHealth?, metrics: LedgerMetrics
) -> Router<LedgerRequestContext> {
    let database = services.database
    let router = Router(context: LedgerRequestContext.self)
    router.add(middleware: MetricsMiddleware(metrics: metrics))
    let routes = RouteTable()
    router.add(middleware: RequestIDMiddleware(routes: routes))
    if let health { router.add(middleware: DatabaseGateMiddleware(health: health)) }
    router.add(middleware: AuthMiddleware(keys: services.keys))
    HealthController(database: database, migrator: migrator, health: health).addRoutes(to: router)
    OrdersController(ledger: services.orders, events: services.events).addRoutes(to: router)
    ReceiptsController(receipts: services.receipts, orders: services.orders, pool: services.pool, verifier: apple, metrics: metrics)
        .addRoutes(to: router)
    NotificationsController(notifications: services.notifications, verifier: apple, metrics: metrics).addRoutes(to: router)
    ReconcileController(pass: configuration.reconcilerPass(services)).addRoutes(to: router)
    ProductsController(catalog: services.catalog).addRoutes(to: router)
    AppsController(catalog: AppCatalog(database: database), directory: services.orders.apps).addRoutes(to: router)
    ReportsController(database: database).addRoutes(to: router)
    TransactionsController(pool: services.pool, desk: services.support, orders: services.orders).addRoutes(to: router)
    AppleAccountsController(links: services.accounts, verifier: apple).addRoutes(to: router)
    AppleLookupController(lookup: appStoreServerAPI.map { services.orderLookup(api: $0, verifier: apple) }).addRoutes(to: router)
    RecoverController(sweep: appStoreServerAPI.map { configuration.historySweep(services, api: $0, verifier: apple) }).addRoutes(to: router)
    router.get("/metrics") { _, _ in
        Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                 body: .init(byteBuffer: ByteBuffer(string: metrics.registry.emitToString())))
    }
    EventsController(store: services.events, orders: services.orders).addRoutes(to: router)
    routes.set(router.routes.map { ("\($0.method)", "\($0.path)") })
    return router
}

/// Builds the HTTP application: the PostgreSQL client runs as a service, migrations run before
/// the server accepts connections. `probing`: the configuration `client` was made with (the
/// health probe connects there on a connection of its own). Throws when the Apple root
/// certificates cannot be read.
public func buildApplication(
    configuration: LedgerConfiguration, client: PostgresClient, probing: PostgresConnection.Configuration, logger: Logger,
    migrate: Bool = true, writerExecutor: (any TaskExecutor)? = nil
) throws -> some ApplicationProtocol {
    // Every event the ledger appends is counted, whichever route or service appended it.
    let metrics = LedgerMetrics()
    let database = Database(client: client, logger: logger, writerExecutor: writerExecutor).observingAppends(metrics.eventsAppended)
    let migrator = Migrator(logger: logger)
    let health = DatabaseHealth(probing: probing, logger: logger)
    // Said once: whether the features that ask Apple's App Store Server API are on.
    let apiSettings = try configuration.apple.appStoreServerAPI()
    let appStoreServerAPI = apiSettings.map { LazyAppStoreServerAPI(settings: $0, logger: logger) }
    if let api = apiSettings {
        logger.notice("App Store Server API on", metadata: [
            "apple.api_url": "\(api.baseURL)", "apple.api_rate": "\(api.requestsPerSecond)", "apple.api_limits": "\(api.rateLimitEnvironment.rawValue)"])
    } else {
        logger.notice("App Store Server API off: set LEDGER_APPLE_API_KEY_ID, LEDGER_APPLE_API_ISSUER_ID and LEDGER_APPLE_API_PRIVATE_KEY to turn it on")
    }
    let verifier = try configuration.apple.verifier(logger: logger)
    // One assembly (one writer) for every route and service, so that their events share transactions.
    let services = ServiceAssembly(database: database)
    var application = Application(
        router: buildRouter(
            services: services, migrator: migrator, apple: verifier,
            appStoreServerAPI: appStoreServerAPI, configuration: configuration, health: health, metrics: metrics),
        configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "order-ledger"),
        services: [client, health],
        logger: logger
    )
    if configuration.reconcileInterval > 0 {
        let pass = configuration.reconcilerPass(services)
        application.addServices(PeriodicService(name: "reconciler pass", interval: .seconds(configuration.reconcileInterval), logger: logger) {
            let summary = try await pass.run()
            if summary.paired > 0 || summary.lostRaces > 0 {
                logger.info("reconciler pass", metadata: [
                    "reconcile.paired": "\(summary.paired)", "reconcile.ambiguous": "\(summary.ambiguous)",
                    "reconcile.considered": "\(summary.considered)", "reconcile.lost_races": "\(summary.lostRaces)",
                ])
            }
        })
    }
    if let appStoreServerAPI, configuration.recoveryInterval > 0 {
        let sweep = configuration.historySweep(services, api: appStoreServerAPI, verifier: verifier)
        application.addServices(PeriodicService(name: "history sweep", interval: .seconds(configuration.recoveryInterval), logger: logger) {
            _ = try await sweep.run()
        })
    }
    if let appStoreServerAPI {
        for service in appleServices(
            api: appStoreServerAPI, verifier: verifier, services: services, configuration: configuration, metrics: metrics, logger: logger
        ) {
            application.addServices(service)
        }
    } else if configuration.appleCalls.any {
        logger.warning("LEDGER_APPLE_CONSUMPTION_CONSENT, LEDGER_APPLE_FINISH_AFTER_DELIVERY and LEDGER_APPLE_SET_TOKEN_AFTER_PAIRING need the App Store Server API key: no calls to Apple are made")
    }
    if let calls = appleCallsService(api: appStoreServerAPI, services: services, configuration: configuration, metrics: metrics, logger: logger) {
        application.addServices(calls)
    }
    // The app the LEDGER_APPLE_* settings describe is created or updated once the schema is
    // current, before the server answers (checked here, so that a bad one stops the start).
    let configuredApp = try configuration.apple.configuredApp()
    let apps = AppCatalog(database: database)
    application.beforeServerStarts {
        if migrate { try await migrator.migrate(client) }
        if let configuredApp { try await configuredApp.record(in: apps, logger: logger) }
    }
    return application
}

/// The calls to Apple that events call for, made every `appleCallsInterval` seconds. With no
/// switch on, or no key, none is made, but the feed still moves past what it reads, so that a
/// switch turned on later applies from then on, not to every event since.
func appleCallsService(
    api: LazyAppStoreServerAPI?, services: ServiceAssembly, configuration: LedgerConfiguration, metrics: LedgerMetrics, logger: Logger
) -> (any Service)? {
    guard configuration.appleCallsInterval > 0 else { return nil }
    let interval = Duration.seconds(configuration.appleCallsInterval)
    guard let api, configuration.appleCalls.any else {
        let queue = services.callQueue
        return PeriodicService(name: "calls to Apple", interval: interval, logger: logger) {
            _ = try await queue.catchUp(.init())
        }
    }
    let calls = configuration.appleCalls(services, api: api)
    return PeriodicService(name: "calls to Apple", interval: interval, logger: logger) {
        let summary = try await calls.run()
        for (call, count) in summary.calls { metrics.appleCalled(call, times: count) }
        let pending = try await calls.queue.pendingConsumption()
        metrics.consumptionPending(count: pending.count, secondsLeft: pending.secondsLeft)
    }
}

/// The background work that asks Apple besides the sweeps and the calls: the notification
/// backfill at start, and the refund catch-up.
func appleServices(
    api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, services: ServiceAssembly, configuration: LedgerConfiguration,
    metrics: LedgerMetrics, logger: Logger
) -> [any Service] {
    var background: [any Service] = []
    if configuration.backfillNotificationsAtStart {
        // Its environment is the API client's (the configuration put it in `api`'s settings).
        var configured = services.notificationBackfill(api: api, verifier: verifier)
        configured.restarted = metrics.notificationBackfillRestarted
        let backfill = configured
        background.append(PeriodicService(name: "notification backfill", interval: .seconds(60), logger: logger, firstWait: .seconds(1), repeats: false) {
            _ = try await backfill.run()
        })
    }
    if configuration.refundCatchUpInterval > 0 {
        let catchUp = configuration.refundCatchUp(services, api: api, verifier: verifier)
        background.append(PeriodicService(
            name: "refund catch-up", interval: .seconds(configuration.refundCatchUpInterval), logger: logger, firstWait: .seconds(60)
        ) {
            _ = try await catchUp.run()
        })
    }
    return background
}
