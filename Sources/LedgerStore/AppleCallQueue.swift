import Foundation
import LedgerCore
import LedgerJSON
import Logging
import PostgresNIO

/// The calls to Apple that events call for (`apple_calls`, migration 007): answering a
/// `CONSUMPTION_REQUEST`, finishing a delivered order's transaction, setting an order's token on
/// a transaction the reconciler or support paired with it. They are queued by reading the log
/// past a position (`feed`), never by the write path of an order event; servers take due calls
/// under a lease each (`claim`), and `settle` records each outcome as an event and deletes the call.
public struct AppleCallQueue: Sendable {
    public let orders: OrderLedger
    public let leases: Leases
    var writer: LedgerWriter { orders.writer }
    var database: Database { writer.database }
    var logger: Logger { database.logger }

    public init(orders: OrderLedger, leases: Leases) {
        self.orders = orders
        self.leases = leases
    }

    /// Which calls the feed queues (the operator's settings).
    public struct Switches: Sendable, Equatable {
        /// Answer consumption requests (the operator says the app's terms obtain the customer's consent).
        public var consumption = false
        public var finishAfterDelivery = false
        public var setTokenAfterPairing = false
        public init(consumption: Bool = false, finishAfterDelivery: Bool = false, setTokenAfterPairing: Bool = false) {
            self.consumption = consumption
            self.finishAfterDelivery = finishAfterDelivery
            self.setTokenAfterPairing = setTokenAfterPairing
        }
        public var any: Bool { consumption || finishAfterDelivery || setTokenAfterPairing }
    }

    /// What one feed step did; nil when another server was reading the feed.
    public struct Fed: Sendable, Equatable {
        public var events: Int
        public var queued: Int
    }

    /// Reads up to `limit` events past the feed's position (never past the gap-safe position, so
    /// no event committed later is passed over), queues the calls they call for under `switches`,
    /// and moves the position past them, in one statement: a server that stops halfway has done
    /// nothing. A call already queued is not queued twice.
    public func feed(_ switches: Switches, limit: Int = 5000) async throws -> Fed? {
        let rows = try await database.query(
            """
            WITH feed AS (
                SELECT read_to FROM apple_call_feed FOR UPDATE SKIP LOCKED),
            span AS (
                SELECT coalesce(max(global_position), (SELECT read_to FROM feed)) AS upto, count(*) AS events
                  FROM (SELECT global_position FROM events
                         WHERE global_position > (SELECT read_to FROM feed) AND global_position <= (SELECT events_safe_position())
                         ORDER BY global_position LIMIT \(limit)) w),
            read AS (
                SELECT global_position, stream_id, type, data FROM events
                 WHERE \(switches.any) AND global_position > (SELECT read_to FROM feed) AND global_position <= (SELECT upto FROM span)
                   AND type IN ('notification-received', 'delivered', 'receipt-received')),
            consumption AS (
                INSERT INTO apple_calls (call_id, kind, transaction_id, stream_id, order_id, notification_uuid, deadline, bundle_id, environment)
                SELECT 'consumption:' || (r.data->>'notificationUUID'), 'consumption', r.data->>'transactionId', r.stream_id,
                       CASE WHEN r.stream_id LIKE 'order-%' THEN substr(r.stream_id, 7) END,
                       (r.data->>'notificationUUID')::uuid, (r.data->>'signedDate')::timestamptz + interval '12 hours',
                       t.bundle_id, coalesce(r.data->>'environment', t.environment)
                  FROM read r LEFT JOIN apple_transactions t ON t.transaction_id = r.data->>'transactionId'
                 WHERE \(switches.consumption) AND r.type = 'notification-received'
                   AND r.data->>'notificationType' = 'CONSUMPTION_REQUEST' AND r.data->>'transactionId' IS NOT NULL
                ON CONFLICT (call_id) DO NOTHING RETURNING 1),
            finish AS (
                INSERT INTO apple_calls (call_id, kind, transaction_id, stream_id, order_id, bundle_id, environment)
                SELECT 'finish:' || o.transaction_id, 'finish', o.transaction_id, r.stream_id, o.order_id, coalesce(t.bundle_id, o.bundle_id), t.environment
                  FROM read r JOIN orders o ON o.order_id = substr(r.stream_id, 7)
                  LEFT JOIN apple_transactions t ON t.transaction_id = o.transaction_id
                 WHERE \(switches.finishAfterDelivery) AND r.type = 'delivered' AND r.stream_id LIKE 'order-%'
                   AND o.transaction_id IS NOT NULL
                ON CONFLICT (call_id) DO NOTHING RETURNING 1),
            token AS (
                INSERT INTO apple_calls (call_id, kind, transaction_id, stream_id, order_id, bundle_id, environment)
                SELECT 'set-token:' || (r.data->>'transactionId') || ':' || r.global_position, 'set-token', r.data->>'transactionId', r.stream_id,
                       substr(r.stream_id, 7), coalesce(t.bundle_id, r.data->>'bundleId'), coalesce(t.environment, r.data->>'environment')
                  FROM read r LEFT JOIN apple_transactions t ON t.transaction_id = r.data->>'transactionId'
                 WHERE \(switches.setTokenAfterPairing) AND r.type = 'receipt-received' AND r.stream_id LIKE 'order-%'
                   AND r.data->>'matchedBy' IN ('reconciler', 'support')
                ON CONFLICT (call_id) DO NOTHING RETURNING 1),
            moved AS (
                UPDATE apple_call_feed SET read_to = (SELECT upto FROM span)
                 WHERE EXISTS (SELECT FROM feed) AND (SELECT events FROM span) > 0 RETURNING 1)
            SELECT (SELECT count(*) FROM feed)::int, (SELECT events FROM span)::int,
                   ((SELECT count(*) FROM consumption) + (SELECT count(*) FROM finish) + (SELECT count(*) FROM token))::int,
                   (SELECT count(*) FROM moved)::int
            """)
        for try await (held, events, queued, _) in rows.decode((Int, Int, Int, Int).self) {
            return held == 0 ? nil : Fed(events: events, queued: queued)
        }
        return nil
    }

    /// Feeds until the feed has read up to the gap-safe position (or another server holds it);
    /// answers the calls queued.
    public func catchUp(_ switches: Switches) async throws -> Int {
        guard switches.any else {
            // Nothing to queue: the position jumps to the gap-safe one without reading the log
            // (reading it cost PostgreSQL a third more CPU per order event under load).
            try await database.query(
                "UPDATE apple_call_feed SET read_to = greatest(read_to, events_safe_position())")
            return 0
        }
        var queued = 0
        while let fed = try await feed(switches), fed.events > 0 {
            queued += fed.queued
            try Task.checkCancellation()
        }
        return queued
    }

    /// A queued call.
    public struct Call: Sendable, Equatable {
        public enum Kind: String, Sendable, CaseIterable {
            case consumption, finish
            case setToken = "set-token"
        }

        public var id: String
        public var kind: Kind
        public var transactionId: TransactionID
        /// Where the event that called for it is (a consumption answer is recorded there).
        public var streamId: StreamID
        public var orderId: OrderID?
        public var notificationUUID: UUID?
        public var deadline: Date?
        /// The transaction's app (nil: the ledger's first app) and environment (`Production`,
        /// `Sandbox`), whose key and host the call goes with.
        public var bundleId: BundleID? = nil
        public var environment: String? = nil
        /// This one included.
        public var attempts: Int
        /// This server's lease on it: no other server makes the call while it holds it.
        public var lease: Lease
    }

    /// The lease of a call.
    static func leaseName(_ callID: String) -> String { "apple-call/" + callID }

    /// Takes up to `batch` due calls under a lease of `lease` seconds each (another server takes
    /// one only once its lease is released or has expired), counting a try of each.
    public func claim(batch: Int, lease: TimeInterval) async throws -> [Call] {
        let due = try await database.query(
            """
            SELECT c.call_id FROM apple_calls c
             WHERE c.due_at <= now()
               AND NOT EXISTS (SELECT FROM leases l WHERE l.name = 'apple-call/' || c.call_id AND l.expires_at > now())
             ORDER BY c.due_at LIMIT \(batch)
            """)
        var names: [String] = []
        for try await id in due.decode(String.self) { names.append(Self.leaseName(id)) }
        let leases = try await self.leases.claim(names, for: lease)
        guard !leases.isEmpty else { return [] }
        let held = Dictionary(uniqueKeysWithValues: leases.map { ($0.name, $0) })
        let rows = try await database.query(
            """
            UPDATE apple_calls SET attempts = attempts + 1
             WHERE 'apple-call/' || call_id = ANY(\(leases.map(\.name)))
            RETURNING call_id, kind, transaction_id, stream_id, order_id, notification_uuid, deadline, attempts, bundle_id, environment
            """)
        var calls: [Call] = []
        for try await (id, kind, transaction, stream, order, notification, deadline, attempts, bundle, environment)
            in rows.decode((String, String, String, String, String?, UUID?, Date?, Int, String?, String?).self) {
            guard let lease = held[Self.leaseName(id)], let kind = Call.Kind(rawValue: kind) else { continue }
            calls.append(Call(
                id: id, kind: kind, transactionId: TransactionID(unchecked: transaction), streamId: StreamID(unchecked: stream),
                orderId: order.map(OrderID.init(unchecked:)), notificationUUID: notification, deadline: deadline,
                bundleId: bundle.map(BundleID.init(unchecked:)), environment: environment, attempts: attempts, lease: lease))
        }
        // A call settled by another server meanwhile, or of a kind this build does not make.
        let taken = Set(calls.map(\.lease.name))
        try await self.leases.release(leases.filter { !taken.contains($0.name) })
        // Oldest due first, as they were chosen.
        let rank = Dictionary(uniqueKeysWithValues: names.enumerated().map { ($1, $0) })
        return calls.sorted { rank[$0.lease.name, default: 0] < rank[$1.lease.name, default: 0] }
    }

    /// Puts `call` back for another try at `date`, with the last failure (`error`, and Apple's
    /// own `appleErrorCode` when its answer had one), and frees its lease.
    public func retry(_ call: Call, at date: Date, error: String, appleErrorCode: Int? = nil) async throws {
        try await database.query(
            """
            UPDATE apple_calls SET due_at = \(date), last_error = \(error), last_apple_error_code = \(appleErrorCode)
             WHERE call_id = \(call.id)
            """)
        try await leases.release(call.lease)
    }

    /// Records `call`'s outcome (`event`, on `stream`; nil: nothing to record) and deletes it. The
    /// event's id is named by the call, so a call made again after a lost lease is recorded once.
    public func settle(_ call: Call, event: NewEvent?, on stream: StreamID) async throws {
        if let event {
            do {
                _ = try await writer.append([event], to: stream)
            } catch AppendError.eventIDConflict {
                // Recorded before with another body (a try after a lost lease): the first stands.
            }
        }
        try await database.query("DELETE FROM apple_calls WHERE call_id = \(call.id)")
        try await leases.release(call.lease)
    }

    /// Records a consumption answer where its request was: on the order's stream, or the pooled
    /// transaction's.
    public func settle(_ call: Call, answer: ConsumptionAnswer, metadata: Data) async throws {
        let id = EventID.named("apple-call", call.id)
        if let order = call.orderId {
            do {
                _ = try await orders.append(order, event: .consumptionAnswer(answer), eventID: id, expected: nil, metadata: metadata)
            } catch AppendError.eventIDConflict {
                // Recorded before (a try after a lost lease): the first stands.
            }
            try await settle(call, event: nil, on: call.streamId)
        } else {
            try await settle(call, event: EventCoding.newEvent(TransactionEvent.consumptionAnswer(answer), id: id, metadata: metadata), on: call.streamId)
        }
    }

    /// What the ledger knows of a transaction, for a consumption answer.
    public struct ConsumptionFacts: Sendable, Equatable {
        /// The state of the order holding it (nil: none, it is in the pool).
        public var state: OrderState?
        /// Whether that order's stream has a `delivered` event.
        public var delivered: Bool
        public var failureReason: String?
        /// The last `delivered` event's `consumptionPercentage`.
        public var consumptionPercentage: Int?
        public var sampleContentProvided: Bool?
        public var refundPreference: RefundPreference?
        /// The transaction is an auto-renewable subscription's (a period of a subscription the
        /// ledger knows, a product the catalog or Apple's signed `type` says is one): no
        /// percentage is sent for it.
        public var autoRenewable = false

        public var deliveryStatus: DeliveryStatus { .of(state: state, delivered: delivered, failureReason: failureReason) }
        /// What the answer sends: Apple's required fields, in combinations Apple takes.
        public var fields: ConsumptionFields {
            ConsumptionFields(
                deliveryStatus: deliveryStatus, consumed: consumptionPercentage, sampleContentProvided: sampleContentProvided,
                refundPreference: refundPreference, autoRenewable: autoRenewable)
        }
    }

    /// A subscription's renewal pays no order: its facts are those of the order its subscription's
    /// start paid (delivered once that order was). The refund preference is the product's, else
    /// its app's.
    public func consumptionFacts(_ transaction: TransactionID) async throws -> ConsumptionFacts {
        let rows = try await database.query(
            """
            SELECT o.state, o.failure_reason, d.percentage, d.stream_id IS NOT NULL, p.sample_content_provided,
                   coalesce(p.refund_preference, a.refund_preference),
                   sp.transaction_id IS NOT NULL OR coalesce(p.type = 'auto-renewable', false)
                       OR coalesce(t.verification->'transaction'->>'type' = 'Auto-Renewable Subscription', false)
              FROM (SELECT \(transaction.rawValue)::text AS transaction_id) x
              LEFT JOIN apple_transactions t ON t.transaction_id = x.transaction_id
              LEFT JOIN subscription_periods sp ON sp.transaction_id = x.transaction_id
              LEFT JOIN orders o ON o.order_id = coalesce(t.order_id,
                  (SELECT s.order_id FROM apple_transactions s WHERE s.transaction_id = sp.original_transaction_id))
              LEFT JOIN products p ON p.product_id = coalesce(o.product_id, t.product_id)
                                  AND p.bundle_id IS NOT DISTINCT FROM coalesce(o.bundle_id, t.bundle_id)
              -- The app's preference where the product has none.
              LEFT JOIN apps a ON a.bundle_id = coalesce(o.bundle_id, t.bundle_id)
              LEFT JOIN LATERAL (
                  -- A whole number, however the client wrote it (25000.0 is taken as 25000).
                  SELECT e.stream_id,
                         CASE WHEN jsonb_typeof(e.data->'consumptionPercentage') = 'number'
                              THEN round((e.data->'consumptionPercentage')::numeric)::int END AS percentage FROM events e
                   WHERE e.stream_id = 'order-' || o.order_id AND e.type = 'delivered'
                   ORDER BY e.stream_version DESC LIMIT 1) d ON true
            """)
        for try await (state, reason, percentage, delivered, sample, preference, autoRenewable)
            in rows.decode((String?, String?, Int?, Bool, Bool?, String?, Bool).self) {
            return ConsumptionFacts(
                state: state.flatMap(OrderState.init), delivered: delivered, failureReason: reason, consumptionPercentage: percentage,
                sampleContentProvided: sample, refundPreference: preference.flatMap(RefundPreference.init), autoRenewable: autoRenewable)
        }
        return ConsumptionFacts(state: nil, delivered: false)
    }

    /// The order now holding `transaction` and its token, with the transaction's original id:
    /// what Set App Account Token sends. Nil when no order holds it any more (support undid it).
    public func tokenTarget(_ transaction: TransactionID) async throws -> (order: OrderID, token: UUID, originalTransactionId: String)? {
        let rows = try await database.query(
            """
            SELECT o.order_id, o.app_account_token, coalesce(t.original_transaction_id, t.transaction_id)
              FROM apple_transactions t JOIN orders o ON o.order_id = t.order_id
             WHERE t.transaction_id = \(transaction.rawValue)
            """)
        for try await (order, token, original) in rows.decode((String, UUID, String).self) {
            return (OrderID(unchecked: order), token, original)
        }
        return nil
    }

    /// Consumption requests not yet answered: how many, and the least time left to answer one.
    public func pendingConsumption() async throws -> (count: Int, secondsLeft: Double?) {
        let rows = try await database.query(
            "SELECT count(*)::int, extract(epoch FROM min(deadline) - now())::float8 FROM apple_calls WHERE kind = 'consumption'")
        for try await (count, left) in rows.decode((Int, Double?).self) { return (count, left) }
        return (0, nil)
    }
}
