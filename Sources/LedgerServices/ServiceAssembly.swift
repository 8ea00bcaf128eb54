// LedgerServices: the ledger's work with Apple and with the pool; neither HTTP nor SQL.

import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging

/// The ledger's store and services on one database, each service handed what it uses: where
/// `ledger serve`, the commands, the benchmarks and the tests put the ledger together. Every
/// service shares one writer, so that their events share transactions (group commit).
public struct ServiceAssembly: Sendable {
    public let database: Database
    public let writer: LedgerWriter
    public let events: EventStore
    public let orders: OrderLedger
    public let pool: TransactionPool
    public let catalog: ProductCatalog
    public let keys: APIKeyStore
    public let leases: Leases
    public let callQueue: AppleCallQueue
    public let receipts: ReceiptLedger
    public let notifications: NotificationLedger
    public let accounts: AppleAccountLinks
    public let support: SupportDesk
    /// Auto-renewable subscriptions: their projection, and the recording of their streams.
    public let subscriptionStore: SubscriptionStore
    public let subscriptions: SubscriptionLedger
    var logger: Logger { database.logger }

    /// Everything on `database`, with a writer of its own: events share transactions only with
    /// what uses this assembly (a server uses one). `purchaseAllowance`: how much earlier than its
    /// order a purchase that pays it may be (the reconciler's clock skew).
    public init(database: Database, purchaseAllowance: TimeInterval = Reconciler.Settings().clockSkew) {
        let writer = LedgerWriter(database: database)
        let events = EventStore(database: database)
        let orders = OrderLedger(writer: writer, purchaseAllowance: purchaseAllowance)
        let leases = Leases(database: database)
        let catalog = ProductCatalog(database: database, keepingTypesFor: .seconds(1))
        let subscriptionStore = SubscriptionStore(database: database)
        let subscriptions = SubscriptionLedger(writer: writer, events: events, store: subscriptionStore)
        let receipts = ReceiptLedger(
            database: database, writer: writer, orders: orders, catalog: catalog, subscriptions: subscriptions, purchaseAllowance: purchaseAllowance)
        self.database = database
        self.writer = writer
        self.events = events
        self.orders = orders
        self.pool = TransactionPool(database: database)
        self.catalog = catalog
        self.keys = APIKeyStore(database: database)
        self.leases = leases
        self.callQueue = AppleCallQueue(orders: orders, leases: leases)
        self.receipts = receipts
        self.notifications = NotificationLedger(
            database: database, writer: writer, events: events, receipts: receipts, subscriptions: subscriptions)
        self.accounts = AppleAccountLinks(database: database, writer: writer, events: events)
        self.support = SupportDesk(database: database, writer: writer, receipts: receipts)
        self.subscriptionStore = subscriptionStore
        self.subscriptions = subscriptions
    }

    /// A reconciler pass with these settings.
    public func reconcilerPass(settings: Reconciler.Settings = .init(), recoveryOrders: Bool = false) -> ReconcilerPass {
        var pass = ReconcilerPass(
            database: database, writer: writer, pool: pool, catalog: catalog, subscriptions: subscriptions, settings: settings)
        pass.recoveryOrders = recoveryOrders
        pass.receipts = receipts
        return pass
    }

    /// A history sweep asking Apple through `api`.
    public func historySweep(api: LazyAppStoreServerAPI, verifier: AppleProofVerifier) -> HistorySweep {
        HistorySweep(
            api: api, verifier: verifier, receipts: receipts, pool: pool, cursors: HistoryCursors(database: database), leases: leases,
            logger: logger)
    }

    /// A refund catch-up asking Apple through `api`.
    public func refundCatchUp(api: LazyAppStoreServerAPI, verifier: AppleProofVerifier) -> RefundCatchUp {
        RefundCatchUp(
            api: api, verifier: verifier, notifications: notifications, pool: pool, cursors: RefundCursors(database: database),
            leases: leases, logger: logger)
    }

    /// The catch-up of single subscriptions from Apple, asking through `api`.
    public func subscriptionCatchUp(api: LazyAppStoreServerAPI, verifier: AppleProofVerifier) -> SubscriptionCatchUp {
        SubscriptionCatchUp(
            api: api, verifier: verifier, database: database, receipts: receipts, pool: pool, subscriptions: subscriptions,
            notifications: notifications, logger: logger)
    }

    /// A notification backfill of `app` (nil: `api`'s one app, else the ledger's first) asking
    /// Apple through `api`, in `environment` (nil: `api`'s, by its base URL, else its settings'
    /// `environment`; see `NotificationBackfill.environment(baseURL:configured:)`).
    public func notificationBackfill(
        api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, app: BundleID? = nil, environment: AppleEnvironment? = nil
    ) -> NotificationBackfill {
        NotificationBackfill(
            api: api, verifier: verifier, notifications: notifications, state: NotificationBackfillState(database: database),
            leases: leases, logger: logger, app: app, environment: environment)
    }

    /// A notification backfill for each app with a key, in each environment it accepts (apps
    /// without a key are skipped).
    public func notificationBackfills(api: LazyAppStoreServerAPI, verifier: AppleProofVerifier) async throws -> [NotificationBackfill] {
        try await api.apps().flatMap { app in
            app.environments.map { notificationBackfill(api: api, verifier: verifier, app: app.bundleId, environment: $0) }
        }
    }

    /// The calls to Apple the log calls for under `switches`, made through `api`.
    public func appleCalls(api: LazyAppStoreServerAPI, switches: AppleCallQueue.Switches) -> AppleCalls {
        AppleCalls(api: api, queue: callQueue, switches: switches, logger: logger)
    }

    /// Support's lookup of Apple order ids through `api`.
    public func orderLookup(api: LazyAppStoreServerAPI, verifier: AppleProofVerifier) -> AppleOrderLookup {
        AppleOrderLookup(api: api, verifier: verifier, receipts: receipts, notifications: notifications, logger: logger)
    }
}
