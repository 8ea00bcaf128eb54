import AppleReceipts
import Hummingbird
import LedgerCore
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
        receipts: ReceiptLedger(database: database), migrator: migrator, apple: apple,
        appStoreServerAPI: (try? configuration.apple.appStoreServerAPI()).flatMap { $0 }.map { LazyAppStoreServerAPI(settings: $0, logger: database.logger) },
        configuration: configuration, health: health, metrics: metrics)
}

/// The router. `receipts`: on the one writer every route and service of this server shares, so
/// that their events share transactions, on a database whose appends `metrics` already counts;
/// `appStoreServerAPI`: the one client of the API they share (nil: no key).
func buildRouter(
    receipts: ReceiptLedger, migrator: Migrator, apple: AppleProofVerifier, appStoreServerAPI: LazyAppStoreServerAPI?,
    configuration: LedgerConfiguration, health: DatabaseHealth?, metrics: LedgerMetrics
) -> Router<LedgerRequestContext> {
    let orders = receipts.orders
    let database = orders.database
    let router = Router(context: LedgerRequestContext.self)
    router.add(middleware: MetricsMiddleware(metrics: metrics))
    let routes = RouteTable()
    router.add(middleware: RequestIDMiddleware(routes: routes))
    if let health { router.add(middleware: DatabaseGateMiddleware(health: health)) }
    router.add(middleware: AuthMiddleware(keys: APIKeyStore(database: database)))
    HealthController(database: database, migrator: migrator, health: health).addRoutes(to: router)
    OrdersController(ledger: orders).addRoutes(to: router)
    ReceiptsController(receipts: receipts, verifier: apple, metrics: metrics).addRoutes(to: router)
    NotificationsController(notifications: NotificationLedger(receipts: receipts), verifier: apple, metrics: metrics).addRoutes(to: router)
    ReconcileController(pass: configuration.reconcilerPass(receipts)).addRoutes(to: router)
    ProductsController(catalog: ProductCatalog(database: database)).addRoutes(to: router)
    ReportsController(database: database).addRoutes(to: router)
    TransactionsController(desk: SupportDesk(receipts: receipts)).addRoutes(to: router)
    AppleAccountsController(links: AppleAccountLinks(writer: orders.writer), verifier: apple).addRoutes(to: router)
    AppleLookupController(lookup: appStoreServerAPI.map { AppleOrderLookup(api: $0, verifier: apple, receipts: receipts) }).addRoutes(to: router)
    RecoverController(sweep: appStoreServerAPI.map { configuration.historySweep(api: $0, verifier: apple, receipts: receipts) }).addRoutes(to: router)
    router.get("/metrics") { _, _ in
        Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                 body: .init(byteBuffer: ByteBuffer(string: metrics.registry.emitToString())))
    }
    EventsController(store: orders.store).addRoutes(to: router)
    routes.set(router.routes.map { ("\($0.method)", "\($0.path)") })
    return router
}

/// Builds the HTTP application: the PostgreSQL client runs as a service, migrations run before
/// the server accepts connections. `probing`: the configuration `client` was made with (the
/// health probe connects there on a connection of its own). Throws when the Apple root
/// certificates cannot be read.
public func buildApplication(
    configuration: LedgerConfiguration, client: PostgresClient, probing: PostgresClient.Configuration, logger: Logger,
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
        logger.notice("App Store Server API on", metadata: ["apple.api_url": "\(api.baseURL)", "apple.api_rate": "\(api.requestsPerSecond)"])
    } else {
        logger.notice("App Store Server API off: set LEDGER_APPLE_API_KEY_ID, LEDGER_APPLE_API_ISSUER_ID and LEDGER_APPLE_API_PRIVATE_KEY to turn it on")
    }
    let verifier = try configuration.apple.verifier(logger: logger)
    // One writer for every route and service, so that their events share transactions.
    let receipts = ReceiptLedger(database: database)
    var application = Application(
        router: buildRouter(
            receipts: receipts, migrator: migrator, apple: verifier,
            appStoreServerAPI: appStoreServerAPI, configuration: configuration, health: health, metrics: metrics),
        configuration: .init(address: .hostname(configuration.host, port: configuration.port), serverName: "order-ledger"),
        services: [client, health],
        logger: logger
    )
    if configuration.reconcileInterval > 0 {
        let pass = configuration.reconcilerPass(receipts)
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
        let sweep = configuration.historySweep(api: appStoreServerAPI, verifier: verifier, receipts: receipts)
        application.addServices(PeriodicService(name: "history sweep", interval: .seconds(configuration.recoveryInterval), logger: logger) {
            _ = try await sweep.run()
        })
    }
    if let appStoreServerAPI {
        for service in appleServices(api: appStoreServerAPI, verifier: verifier, receipts: receipts, configuration: configuration, logger: logger) {
            application.addServices(service)
        }
    } else if configuration.appleCalls.any {
        logger.warning("LEDGER_APPLE_CONSUMPTION_CONSENT, LEDGER_APPLE_FINISH_AFTER_DELIVERY and LEDGER_APPLE_SET_TOKEN_AFTER_PAIRING need the App Store Server API key: no calls to Apple are made")
    }
    if let calls = appleCallsService(api: appStoreServerAPI, receipts: receipts, configuration: configuration, metrics: metrics, logger: logger) {
        application.addServices(calls)
    }
    if migrate {
        application.beforeServerStarts {
            try await migrator.migrate(client)
        }
    }
    return application
}

/// The calls to Apple that events call for, made every `appleCallsInterval` seconds. With no
/// switch on, or no key, none is made, but the feed still moves past what it reads, so that a
/// switch turned on later applies from then on, not to every event since.
func appleCallsService(
    api: LazyAppStoreServerAPI?, receipts: ReceiptLedger, configuration: LedgerConfiguration, metrics: LedgerMetrics, logger: Logger
) -> (any Service)? {
    guard configuration.appleCallsInterval > 0 else { return nil }
    let interval = Duration.seconds(configuration.appleCallsInterval)
    guard let api, configuration.appleCalls.any else {
        let queue = AppleCallQueue(orders: receipts.orders)
        return PeriodicService(name: "calls to Apple", interval: interval, logger: logger) {
            _ = try await queue.catchUp(.init())
        }
    }
    let calls = configuration.appleCalls(api: api, receipts: receipts)
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
    api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, receipts: ReceiptLedger, configuration: LedgerConfiguration,
    logger: Logger
) -> [any Service] {
    var services: [any Service] = []
    if configuration.backfillNotificationsAtStart {
        let backfill = NotificationBackfill(api: api, verifier: verifier, notifications: NotificationLedger(receipts: receipts))
        services.append(PeriodicService(name: "notification backfill", interval: .seconds(60), logger: logger, firstWait: .seconds(1), repeats: false) {
            _ = try await backfill.run()
        })
    }
    if configuration.refundCatchUpInterval > 0 {
        let catchUp = configuration.refundCatchUp(api: api, verifier: verifier, receipts: receipts)
        services.append(PeriodicService(
            name: "refund catch-up", interval: .seconds(configuration.refundCatchUpInterval), logger: logger, firstWait: .seconds(60)
        ) {
            _ = try await catchUp.run()
        })
    }
    return services
}
