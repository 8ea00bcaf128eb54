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
        services: ServiceAssembly(database: database, purchaseAllowance: configuration.reconciler.clockSkew), migrator: migrator, apple: apple,
        appStoreServerAPI: LazyAppStoreServerAPI(
            catalog: AppCatalog(database: database), hosts: configuration.apple.appStoreServerAPIHosts(), logger: database.logger,
            skipped: metrics.appleAppSkipped),
        configuration: configuration, health: health, metrics: metrics)
}

/// The router. `services`: the one assembly every route and service of this server shares (one
/// writer, so that their events share transactions), on a database whose appends `metrics`
/// already counts; `appStoreServerAPI`: the apps' clients of the API they share;
/// `subscriptionRefresh`: the catch-up `GET /v1/subscriptions/{id}?refresh=true` asks Apple with.
func buildRouter(
    services: ServiceAssembly, migrator: Migrator, apple: AppleProofVerifier, appStoreServerAPI: LazyAppStoreServerAPI,
    configuration: LedgerConfiguration, health: DatabaseHealth?, metrics: LedgerMetrics, apps: AppDirectory? = nil,
    subscriptionRefresh: SubscriptionRefresh? = nil
) -> Router<LedgerRequestContext> {
    let database = services.database
    // HEAD is answered wherever GET is (RFC 9110 §9.3.2): uptime monitors probe with it.
    let router = Router(context: LedgerRequestContext.self, options: .autoGenerateHeadEndpoints)
    router.add(middleware: MetricsMiddleware(metrics: metrics))
    let routes = RouteTable()
    router.add(middleware: RequestIDMiddleware(routes: routes))
    if let health { router.add(middleware: DatabaseGateMiddleware(health: health)) }
    router.add(middleware: AuthMiddleware(keys: services.keys))
    router.add(middleware: QueryParameterMiddleware(routes: routes))
    HealthController(database: database, migrator: migrator, health: health).addRoutes(to: router)
    OrdersController(ledger: services.orders, events: services.events, catalog: AppCatalog(database: database)).addRoutes(to: router)
    ReceiptsController(
        receipts: services.receipts, orders: services.orders, pool: services.pool, notifications: services.notifications, verifier: apple,
        metrics: metrics)
        .addRoutes(to: router)
    NotificationsController(notifications: services.notifications, verifier: apple, metrics: metrics).addRoutes(to: router)
    ReconcileController(pass: configuration.reconcilerPass(services)).addRoutes(to: router)
    ProductsController(catalog: services.catalog).addRoutes(to: router)
    SubscriptionsController(
        store: services.subscriptionStore, entitlements: EntitlementStore(database: database), apps: services.orders.apps,
        catalog: AppCatalog(database: database), refresh: subscriptionRefresh ?? subscriptionCatchUp(services, appStoreServerAPI, apple)
    ).addRoutes(to: router)
    AppsController(catalog: AppCatalog(database: database), directory: services.orders.apps, changed: { apps?.invalidate() }).addRoutes(to: router)
    ReportsController(database: database).addRoutes(to: router)
    ImportsController(history: HistoryImport(orders: services.orders)).addRoutes(to: router)
    TransactionsController(pool: services.pool, desk: services.support, orders: services.orders, catalog: AppCatalog(database: database))
        .addRoutes(to: router)
    AppleAccountsController(links: services.accounts, verifier: apple).addRoutes(to: router)
    AppleLookupController(
        lookup: services.orderLookup(api: appStoreServerAPI, verifier: apple), api: appStoreServerAPI, apps: AppCatalog(database: database)
    ).addRoutes(to: router)
    RecoverController(
        sweep: configuration.historySweep(services, api: appStoreServerAPI, verifier: apple), api: appStoreServerAPI,
        apps: services.orders.apps, catalog: AppCatalog(database: database)
    ).addRoutes(to: router)
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
    let database = Database(client: client, logger: logger, writerExecutor: writerExecutor, direct: probing).observingAppends(metrics.eventsAppended)
    let migrator = Migrator(logger: logger)
    let health = DatabaseHealth(probing: probing, answers: database.answers, logger: logger)
    // The configured app's key is checked now (a bad one stops the start); every app's key is
    // read from the apps' catalog where it is used, so a key set later is taken without a restart.
    let apiSettings = try configuration.apple.appStoreServerAPI()
    let hosts = configuration.apple.appStoreServerAPIHosts()
    let appStoreServerAPI = LazyAppStoreServerAPI(
        catalog: AppCatalog(database: database), hosts: hosts, logger: logger, skipped: metrics.appleAppSkipped)
    logger.notice("App Store Server API: each app's key, by the environment of the transaction at its host", metadata: [
        "apple.api_url": "\(hosts.productionURL)", "apple.api_sandbox_url": "\(hosts.sandboxURL)",
        "apple.api_rate": "\(configuration.apple.apiRequestsPerSecond)", "apple.configured_key": "\(apiSettings != nil)"])
    // Each proof is checked against the app the ledger holds for the bundle id Apple signed.
    // Read once the configured app is recorded (below): background work may verify before.
    let appDirectory = AppDirectory(
        catalog: AppCatalog(database: database), maximumAge: .seconds(configuration.appsMaximumAge), logger: logger, open: false)
    let verifier = try configuration.apple.verifier(logger: logger).choosingApps(from: appDirectory)
    // One assembly (one writer) for every route and service, so that their events share transactions.
    let services = ServiceAssembly(database: database, purchaseAllowance: configuration.reconciler.clockSkew)
    let connections = ConnectionLimitHandler.Count(
        limit: configuration.maximumConnections ?? ConnectionLimitHandler.Count.defaultLimit(), logger: logger)
    let readTimeout = configuration.requestReadTimeout
    var application = Application(
        router: buildRouter(
            services: services, migrator: migrator, apple: verifier,
            appStoreServerAPI: appStoreServerAPI, configuration: configuration, health: health, metrics: metrics, apps: appDirectory),
        server: .http1(configuration: .init(
            additionalChannelHandlers: [
                ConnectionLimitHandler(count: connections), RequestDeadlineHandler(seconds: readTimeout), ContinueHandler(), ConnectionCloseHandler(),
            ], idleTimeout: .seconds(Int64(configuration.connectionIdleTimeout)))),
        configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "order-ledger"),
        services: [client, health],
        logger: logger
    )
    // Said once the schema is current and the configured app recorded: every background service
    // waits for it before its first run (a migration may take longer than an interval).
    let started = StartSignal()
    if configuration.reconcileInterval > 0 {
        let pass = configuration.reconcilerPass(services)
        application.addServices(PeriodicService(
            name: "reconciler pass", interval: .seconds(configuration.reconcileInterval), logger: logger, ready: started.wait
        ) {
            let summary = try await pass.run()
            if summary.paired > 0 || summary.lostRaces > 0 {
                logger.info("reconciler pass", metadata: [
                    "reconcile.paired": "\(summary.paired)", "reconcile.ambiguous": "\(summary.ambiguous)",
                    "reconcile.considered": "\(summary.considered)", "reconcile.lost_races": "\(summary.lostRaces)",
                ])
            }
        })
    }
    if configuration.recoveryInterval > 0 {
        let sweep = configuration.historySweep(services, api: appStoreServerAPI, verifier: verifier)
        application.addServices(PeriodicService(
            name: "history sweep", interval: .seconds(configuration.recoveryInterval), logger: logger, ready: started.wait
        ) {
            // No app has a key: nothing to ask Apple.
            guard try await appStoreServerAPI.anyKey() else { return }
            _ = try await sweep.run()
        })
    }
    for service in appleServices(
        api: appStoreServerAPI, verifier: verifier, services: services, configuration: configuration, metrics: metrics, started: started,
        logger: logger
    ) {
        application.addServices(service)
    }
    if let calls = appleCallsService(
        api: appStoreServerAPI, services: services, configuration: configuration, metrics: metrics, started: started, logger: logger
    ) {
        application.addServices(calls)
    }
    // The app the LEDGER_APPLE_* settings describe is created or updated once the schema is
    // current, before the server answers (checked here, so that a bad one stops the start).
    let configuredApp = try configuration.apple.configuredApp()
    let apps = AppCatalog(database: database)
    application.beforeServerStarts {
        defer { appDirectory.open() }
        if migrate { try await migrator.migrate(client) }
        if let configuredApp { try await configuredApp.record(in: apps, logger: logger) }
        started.open()
    }
    return application
}

/// The calls to Apple that events call for, made every `appleCallsInterval` seconds. With no
/// switch on, none is made, but the feed still moves past what it reads, so that a switch turned
/// on later applies from then on, not to every event since. A call of an app without a key waits
/// for one (`AppleCalls.make`).
func appleCallsService(
    api: LazyAppStoreServerAPI, services: ServiceAssembly, configuration: LedgerConfiguration, metrics: LedgerMetrics, started: StartSignal,
    logger: Logger
) -> (any Service)? {
    guard configuration.appleCallsInterval > 0 else { return nil }
    let interval = Duration.seconds(configuration.appleCallsInterval)
    guard configuration.appleCalls.any else {
        let queue = services.callQueue
        return PeriodicService(name: "calls to Apple", interval: interval, logger: logger, ready: started.wait) {
            _ = try await queue.catchUp(.init())
        }
    }
    let calls = configuration.appleCalls(services, api: api)
    return PeriodicService(name: "calls to Apple", interval: interval, logger: logger, ready: started.wait) {
        let summary = try await calls.run()
        for (call, count) in summary.calls { metrics.appleCalled(call, times: count) }
        let pending = try await calls.queue.pendingConsumption()
        metrics.consumptionPending(count: pending.count, secondsLeft: pending.secondsLeft)
    }
}

/// The background work that asks Apple besides the sweeps and the calls: the notification
/// backfill at start, the refund catch-up and the sales reports, each once `started` says the
/// schema is current and the apps are recorded.
func appleServices(
    api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, services: ServiceAssembly, configuration: LedgerConfiguration,
    metrics: LedgerMetrics, started: StartSignal, logger: Logger
) -> [any Service] {
    var background: [any Service] = []
    if configuration.backfillNotificationsAtStart {
        // One per app with a key and environment it accepts, each from its own position. One's
        // failure leaves the others to run; the pass then fails, and is run again a minute later
        // (each backfill resumes where it stopped).
        background.append(PeriodicService(
            name: "notification backfill", interval: .seconds(60), logger: logger, firstWait: .seconds(1), repeats: false, ready: started.wait
        ) {
            var failure: (any Error)?
            for var backfill in try await services.notificationBackfills(api: api, verifier: verifier) {
                backfill.restarted = metrics.notificationBackfillRestarted
                do {
                    _ = try await backfill.run()
                } catch is CancellationError {
                    throw CancellationError()
                } catch {
                    logger.warning("a notification backfill failed; it is tried again a minute later", metadata: [
                        "app.bundle_id": "\(backfill.app?.rawValue ?? "")", "apple.environment": "\(backfill.environment.rawValue)",
                        "error": "\(String(describing: error))"])
                    failure = failure ?? error
                }
            }
            if let failure { throw failure }
        })
    }
    if configuration.refundCatchUpInterval > 0 {
        let catchUp = configuration.refundCatchUp(services, api: api, verifier: verifier)
        background.append(PeriodicService(
            name: "refund catch-up", interval: .seconds(configuration.refundCatchUpInterval), logger: logger, firstWait: .seconds(60),
            ready: started.wait
        ) {
            guard try await api.anyKey() else { return }
            _ = try await catchUp.run()
        })
    }
    if configuration.salesFetchInterval > 0, configuration.appStoreConnect != nil {
        background.append(PeriodicService(
            name: "sales reports", interval: .seconds(configuration.salesFetchInterval), logger: logger,
            firstWait: .seconds(min(90, configuration.salesFetchInterval)), ready: started.wait
        ) {
            _ = try await fetchSalesReports(api: api, verifier: verifier, services: services, configuration: configuration, logger: logger)
        })
    }
    return background
}

/// One background fetch of App Store Connect's sales reports (the days not stored yet), then
/// the sweeps where a day stored now counted more purchases than the ledger saw. One server at
/// a time (a lease); nil when another server holds it.
func fetchSalesReports(
    api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, services: ServiceAssembly, configuration: LedgerConfiguration, logger: Logger
) async throws -> SalesReportFetch.Summary? {
    guard let fetch = try await configuration.salesReportFetch(services, logger: logger) else { return nil }
    let leases = Leases(database: services.database)
    guard let lease = try await leases.claim("sales-reports", for: 3600) else { return nil }
    do {
        let summary = try await fetch.run()
        let changed = summary.new + summary.restated
        if !changed.isEmpty, try await api.anyKey() {
            _ = try await configuration.salesShortfallSweep(services, api: api, verifier: verifier, logger: logger).run(days: changed)
        }
        try await leases.release(lease)
        return summary
    } catch {
        try? await leases.release(lease)
        throw error
    }
}

/// The refresh `GET /v1/subscriptions/{id}?refresh=true` runs: the subscription catch-up, asking
/// Apple with the app's key in the subscription's environment.
func subscriptionCatchUp(_ services: ServiceAssembly, _ api: LazyAppStoreServerAPI, _ apple: AppleProofVerifier) -> SubscriptionRefresh {
    let catchUp = services.subscriptionCatchUp(api: api, verifier: apple)
    return { id, bundleId, environment in
        _ = try await catchUp.refresh(
            originalTransactionId: id, bundleId: bundleId, environment: environment.flatMap(AppleEnvironment.init(name:)))
    }
}
