import Foundation
import LedgerCore
import LedgerJSON
import Logging
import PostgresNIO

/// Finance's reconciliation report: per day (UTC), product, currency and App Store environment,
/// what happened to orders, the revenue it means, how transactions were paired; and the pool as
/// it stands.
///
/// An order's environment is its Apple transaction's (`apple_transactions.environment`, as Apple
/// signed it); after its pairing was undone, its last transaction's; an order that never had one
/// (not paid yet, or paid by a client's own `verified`) counts as `Production`: it has no Apple
/// revenue to mislead (the view `order_environments`, sql/migrations/012_environments.sql). Every
/// row of an order follows that environment as it is now, so a sandbox order's creation,
/// verification and refunds land in the same `Sandbox` row, and `totals` never holds them.
///
/// Every billed period of an auto-renewable subscription counts once, in a row of its `kind`: the
/// first is its order's (the order its start transaction verified: that order's rows are
/// `subscription-start`), each later one a `subscription-renewal` row of its own, dated by its
/// purchase date, with Apple's price; a refund of one period takes back that period's share only.
/// A family member's shared subscription is never revenue (docs/reconciliation.md, "Subscriptions").
public struct ReconciliationReport: Sendable, Codable, Equatable {
    /// The key a row is kept under while a report is made (and sorted by): its day, app, product,
    /// currency, environment and kind.
    static func rowKey(_ day: String, _ product: String, _ currency: String?, _ environment: String, _ bundle: String?, _ kind: Row.Kind) -> String {
        "\(day)\u{1F}\(bundle ?? "")\u{1F}\(product)\u{1F}\(currency ?? "")\u{1F}\(environment)\u{1F}\(kind.rawValue)"
    }

    /// One day, product, currency, environment and kind.
    public struct Row: Sendable, Codable, Equatable {
        public var day: String
        public var productId: String
        public var currency: String?
        /// `Production`, or `Sandbox` for App Review's and testers' purchases (kept apart).
        public var environment: String
        /// What was billed: `purchase` (orders), `subscription-start` (orders paid by the
        /// transaction that started a subscription), `subscription-renewal` (a subscription's
        /// later periods, which pay no order); `total` in the totals.
        public var kind = Kind.purchase
        /// Billed periods of a subscription that began in the day (purchase date, UTC): in a
        /// `subscription-start` row the subscriptions started (their money is their orders'
        /// `verified`, on the day each was verified), in a `subscription-renewal` row the renewals,
        /// whose prices are its revenue.
        public var periods = 0
        public var ordersCreated = 0
        public var verified = 0
        public var delivered = 0
        public var finished = 0
        public var failed = 0
        public var failedByReason: [String: Int] = [:]
        /// Orders refunded; in a `subscription-renewal` row, periods refunded (each alone).
        public var refunded = 0
        /// What the refunds took back, as a decimal string: of each refunded order's price ×
        /// quantity, the share Apple refunded (`revocationPercentage` of a `REFUND_PRORATED`; all
        /// of it for a full refund, or one recorded before the ledger read Apple's type).
        /// In the totals, only when every row with money has one currency (then `currency`):
        /// amounts of several currencies are never added up (`refundedAmountByCurrency`).
        public var refundedAmount: String? = "0"
        /// Verified minus what refunds took back, from the orders' prices (price × quantity), as
        /// a decimal string; in a `subscription-renewal` row, the periods' prices (Apple's)
        /// minus what their refunds took back. In the totals, only when every row with money
        /// has one currency (`revenueByCurrency`).
        public var revenue: String? = "0"
        /// The totals' money per currency (absent in the rows, each of one currency).
        public var revenueByCurrency: [String: String]?
        public var refundedAmountByCurrency: [String: String]?
        public var pairingsByRule: [String: Int] = [:]
        public var ambiguousPairings = 0
        public var supportPairings = 0
        /// Pairings support undid (`POST /v1/transactions/{id}/unmatch`).
        public var undonePairings = 0
        /// Answers to Apple's consumption requests: taken by Apple, refused by it, not sent within
        /// the 12 hours Apple waits.
        public var consumptionAnswered = 0
        public var consumptionFailed = 0
        public var consumptionTooLate = 0
        /// Refunds the ledger learnt of from Apple's refund history, not from a notification
        /// (also counted in `refunded`).
        public var refundsCaughtUp = 0

        /// The app of the row's orders and transactions (product ids are per app); absent in a
        /// ledger that holds no app, and in the totals.
        public var bundleId: String?

        init(day: String, productId: String, currency: String?, environment: String, bundleId: String? = nil, kind: Kind = .purchase) {
            self.day = day
            self.productId = productId
            self.currency = currency
            self.environment = environment
            self.bundleId = bundleId
            self.kind = kind
        }

        /// What a row's money was billed as.
        public enum Kind: String, Sendable, Codable, Equatable {
            case purchase
            case subscriptionStart = "subscription-start"
            case subscriptionRenewal = "subscription-renewal"
            case total
        }
    }

    /// The unmatched pool now.
    public struct Pool: Sendable, Codable, Equatable {
        public var count = 0
        public var oldestAgeSeconds: Double?
        /// By age since received: `under-1h`, `1h-1d`, `1d-7d`, `over-7d`.
        public var byAge: [String: Int] = ["under-1h": 0, "1h-1d": 0, "1d-7d": 0, "over-7d": 0]
        /// By the environment Apple signed each transaction in.
        public var byEnvironment: [String: Int] = [:]
    }

    public var from: String
    public var to: String
    public var rows: [Row]
    /// The `Production` rows summed (day and product "total"): the revenue.
    public var totals: Row
    /// The rows of every other environment summed, apart from `totals` (environment `Sandbox`).
    public var sandboxTotals: Row
    public var unmatched: Pool

    /// The report for events recorded from `from` (inclusive) to `to` (exclusive).
    /// `apps` (an API key's): the rows and the pool of these apps alone; nil: every app's.
    public static func make(database: Database, from: Date, to: Date, apps: [BundleID]? = nil) async throws -> ReconciliationReport {
        let apps = apps?.map(\.rawValue)
        var rows: [String: Row] = [:]
        var revenue: [String: Decimal] = [:]
        var refundedAmount: [String: Decimal] = [:]
        /// The row of these parts so far (a new one if none), and the key it is kept under.
        func existing(
            _ day: String, _ product: String, _ currency: String?, _ environment: String, _ bundle: String?, _ kind: Row.Kind
        ) -> (key: String, row: Row) {
            let k = Self.rowKey(day, product, currency, environment, bundle, kind)
            return (k, rows[k] ?? Row(day: day, productId: product, currency: currency, environment: environment, bundleId: bundle, kind: kind))
        }

        // A refund's amount is its share of the order's (sql/migrations/010_prorated_refunds.sql
        // states the same rule for dashboards.daily_orders): a prorated refund's percentage (in
        // thousandths), a family revocation none, any other (a full refund, or one stored when
        // `revocationType` held the notification's type) all. An order paid by a subscription's
        // free start (a trial: Apple's price 0) has no money (039_free_starts_bill_nothing.sql).
        let orderRows = try await database.query(
            """
            SELECT to_char(event_time(e.recorded_at, e.metadata) AT TIME ZONE 'UTC', 'YYYY-MM-DD'), o.product_id, o.currency,
                   oe.environment, e.type,
                   CASE e.type WHEN 'failed' THEN coalesce(e.data->>'reason', '') WHEN 'pairing-undone' THEN coalesce(e.data->>'fromState', '')
                               WHEN 'consumption-answer' THEN coalesce(e.data->>'outcome', '')
                               WHEN 'refunded' THEN CASE WHEN e.metadata ? 'refundCatchUp' THEN 'caught-up' ELSE '' END ELSE '' END,
                   count(*)::int,
                   trim_scale(coalesce(sum(o.price * o.quantity * order_billed_share(k.kind, k.price) * CASE
                       WHEN e.type <> 'refunded' THEN 1 ELSE refund_share(coalesce(latest.refund, e.data)) END), 0))::text,
                   o.bundle_id, coalesce(k.kind, 'purchase')
            FROM events e JOIN orders o ON o.order_id = substr(e.stream_id, 7)
            JOIN order_environments oe ON oe.order_id = o.order_id
            LEFT JOIN subscription_periods k ON k.transaction_id = o.transaction_id
            -- The share a `refunded` takes back is that of Apple's latest refund of the order, by
            -- revocation date, among its `refunded` events and the refunds its state did not take,
            -- kept on their `notification-received` (a full refund after a prorated one), as
            -- dashboards.daily_orders (048) and ledger_apple_sales (047) read them.
            LEFT JOIN LATERAL (
                SELECT x.refund FROM (
                    SELECT r.stream_version, r.recorded_at, CASE r.type WHEN 'refunded' THEN r.data ELSE r.data->'refund' END AS refund
                      FROM events r
                     WHERE e.type = 'refunded' AND r.stream_id = e.stream_id
                       AND (r.type = 'refunded'
                            OR r.type = 'notification-received' AND r.data ? 'refund'
                               AND NOT coalesce((r.data->>'reversedBefore')::boolean, false))) x
                 ORDER BY coalesce((x.refund->>'revocationDate')::timestamptz, x.recorded_at) DESC, x.stream_version
                 LIMIT 1) latest ON true
            WHERE e.stream_id LIKE 'order-%' AND event_time(e.recorded_at, e.metadata) >= \(from)
              AND event_time(e.recorded_at, e.metadata) < \(to)
              AND e.type IN ('created', 'verified', 'delivered', 'finished', 'failed', 'refunded', 'pairing-undone', 'consumption-answer')
              AND (\(apps)::text[] IS NULL OR o.bundle_id = ANY(\(apps)::text[]))
              -- An order counts one refund at most, Apple's latest (by revocation date; of copies of it,
              -- the first recorded): a refund Apple reversed and then made again takes the money back
              -- once, not twice, and by the share of the refund that stands.
              AND (e.type <> 'refunded' OR NOT EXISTS (
                   SELECT FROM events r WHERE r.stream_id = e.stream_id AND r.type = 'refunded' AND r.stream_version <> e.stream_version
                      AND (coalesce((r.data->>'revocationDate')::timestamptz, r.recorded_at) > coalesce((e.data->>'revocationDate')::timestamptz, e.recorded_at)
                           OR (coalesce((r.data->>'revocationDate')::timestamptz, r.recorded_at) = coalesce((e.data->>'revocationDate')::timestamptz, e.recorded_at) AND r.stream_version < e.stream_version))))
            GROUP BY 1, 2, 3, 4, 5, 6, o.bundle_id, k.kind
            """)
        for try await (day, product, currency, environment, type, reason, count, amount, bundle, kind)
            in orderRows.decode((String, String, String?, String, String, String, Int, String, String?, String).self) {
            let (k, found) = existing(day, product, currency, environment, bundle, Row.Kind(rawValue: kind) ?? .purchase)
            var row = found
            switch type {
            case "created": row.ordersCreated += count
            case "verified":
                row.verified += count
                revenue[k, default: 0] += Decimal(string: amount) ?? 0
            case "delivered": row.delivered += count
            case "finished": row.finished += count
            case "failed":
                row.failed += count
                row.failedByReason[reason.isEmpty ? "unknown" : reason, default: 0] += count
            case "refunded":
                row.refunded += count
                if reason == "caught-up" { row.refundsCaughtUp += count }
                revenue[k, default: 0] -= Decimal(string: amount) ?? 0
                refundedAmount[k, default: 0] += Decimal(string: amount) ?? 0
            case "pairing-undone":
                row.undonePairings += count
                // A verified order's revenue, and its count as verified, go with its pairing (both
                // count again when it is paired anew): one purchase is one verified sale.
                if reason == OrderState.verified.rawValue {
                    row.verified -= count
                    revenue[k, default: 0] -= Decimal(string: amount) ?? 0
                }
            case "consumption-answer":
                row.countConsumptionAnswer(reason, count)
            default: break
            }
            rows[k] = row
        }

        // Consumption answers about pooled transactions (no order, so no currency).
        let pooledAnswers = try await database.query(
            """
            SELECT to_char(e.recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD'), t.product_id, coalesce(t.environment, 'Production'),
                   coalesce(e.data->>'outcome', ''), count(*)::int, t.bundle_id, coalesce(k.kind, 'purchase')
            FROM events e JOIN apple_transactions t ON t.transaction_id = substr(e.stream_id, 13)
            LEFT JOIN subscription_periods k ON k.transaction_id = t.transaction_id
            WHERE e.stream_id LIKE 'transaction-%' AND e.type = 'consumption-answer' AND e.recorded_at >= \(from) AND e.recorded_at < \(to)
              AND (\(apps)::text[] IS NULL OR t.bundle_id = ANY(\(apps)::text[]))
            GROUP BY 1, 2, 3, 4, t.bundle_id, k.kind
            """)
        for try await (day, product, environment, outcome, count, bundle, kind)
            in pooledAnswers.decode((String, String, String, String, Int, String?, String).self) {
            let (k, found) = existing(day, product, nil, environment, bundle, Row.Kind(rawValue: kind) ?? .purchase)
            var row = found
            row.countConsumptionAnswer(outcome, count)
            rows[k] = row
        }

        let pairingRows = try await database.query(
            """
            SELECT to_char(e.recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD'), o.product_id, o.currency, oe.environment,
                   coalesce(e.data->>'rule', e.data->>'matchedBy'), e.data->>'matchedBy',
                   count(*)::int, count(*) FILTER (WHERE (e.data->>'candidates')::int > 1)::int, o.bundle_id, coalesce(k.kind, 'purchase')
            FROM events e JOIN orders o ON o.order_id = e.data->>'orderId'
            JOIN order_environments oe ON oe.order_id = o.order_id
            LEFT JOIN subscription_periods k ON k.transaction_id = o.transaction_id
            WHERE e.type = 'transaction-matched' AND e.recorded_at >= \(from) AND e.recorded_at < \(to)
              AND (\(apps)::text[] IS NULL OR o.bundle_id = ANY(\(apps)::text[]))
            GROUP BY 1, 2, 3, 4, 5, 6, o.bundle_id, k.kind
            """)
        for try await (day, product, currency, environment, rule, matchedBy, count, ambiguous, bundle, kind)
            in pairingRows.decode((String, String, String?, String, String, String, Int, Int, String?, String).self) {
            let (k, found) = existing(day, product, currency, environment, bundle, Row.Kind(rawValue: kind) ?? .purchase)
            var row = found
            // Support's forced pairings carry their reason in the rule: counted under "support".
            row.pairingsByRule[matchedBy == "support" ? "support" : rule, default: 0] += count
            row.ambiguousPairings += ambiguous
            if matchedBy == "support" { row.supportPairings += count }
            rows[k] = row
        }

        // Subscriptions' periods: a start period's money is its order's (above), a renewal's its own.
        for count in try await periodCounts(database: database, from: from, to: to, apps: apps) {
            let (k, found) = existing(count.day, count.productId, count.currency, count.environment, count.bundleId, count.kind)
            var changed = found
            changed.periods += count.billed
            if count.kind == .subscriptionRenewal {
                changed.refunded += count.refunded
                revenue[k, default: 0] += count.amount - count.refundedAmount
                refundedAmount[k, default: 0] += count.refundedAmount
            }
            rows[k] = changed
        }

        let sorted = rows.sorted { $0.key < $1.key }.map { entry -> Row in
            var row = entry.value
            row.revenue = "\(revenue[entry.key] ?? 0)"
            row.refundedAmount = "\(refundedAmount[entry.key] ?? 0)"
            return row
        }
        // Production's revenue never holds the sandbox's: each environment sums apart.
        let totals = Row.sum(sorted.filter { $0.environment == "Production" }, environment: "Production")
        let sandboxTotals = Row.sum(sorted.filter { $0.environment != "Production" }, environment: "Sandbox")

        var pool = Pool()
        let poolRows = try await database.query(
            """
            SELECT count(*)::int, extract(epoch FROM now() - min(received_at))::float8,
                   count(*) FILTER (WHERE now() - received_at < interval '1 hour')::int,
                   count(*) FILTER (WHERE now() - received_at >= interval '1 hour' AND now() - received_at < interval '1 day')::int,
                   count(*) FILTER (WHERE now() - received_at >= interval '1 day' AND now() - received_at < interval '7 days')::int,
                   count(*) FILTER (WHERE now() - received_at >= interval '7 days')::int
            FROM unmatched_transactions
            WHERE \(apps)::text[] IS NULL OR bundle_id = ANY(\(apps)::text[])
            """)
        for try await (count, oldest, hour, day, week, older) in poolRows.decode((Int, Double?, Int, Int, Int, Int).self) {
            pool.count = count
            pool.oldestAgeSeconds = oldest
            pool.byAge = ["under-1h": hour, "1h-1d": day, "1d-7d": week, "over-7d": older]
        }
        let poolEnvironments = try await database.query(
            """
            SELECT coalesce(environment, 'Production'), count(*)::int FROM unmatched_transactions
             WHERE \(apps)::text[] IS NULL OR bundle_id = ANY(\(apps)::text[]) GROUP BY 1
            """)
        for try await (environment, count) in poolEnvironments.decode((String, Int).self) { pool.byEnvironment[environment] = count }
        return ReconciliationReport(
            from: EventCoding.formatDate(from), to: EventCoding.formatDate(to), rows: sorted, totals: totals, sandboxTotals: sandboxTotals,
            unmatched: pool)
    }

    /// The report as CSV: one line per row, then production's totals line and the sandbox's;
    /// maps as `key=count` lists. Columns are only ever added at the end.
    public var csv: String {
        var lines = ["day,product_id,currency,orders_created,verified,delivered,finished,failed,failed_by_reason,refunded,revenue,pairings_by_rule,ambiguous_pairings,support_pairings,undone_pairings,consumption_answered,consumption_failed,consumption_too_late,refunds_caught_up,refunded_amount,environment,bundle_id,kind,periods,revenue_by_currency,refunded_amount_by_currency"]
        let (text, value, map) = (CSVField.text, CSVField.value, { (values: [String: Int]) in CSVField.text(CSVField.map(values)) })
        let money = { (values: [String: String]?) in values.map { CSVField.text(CSVField.map($0)) } ?? "" }
        for row in rows + [totals, sandboxTotals] {
            let orders: [String] = [
                value(row.day), text(row.productId), text(row.currency ?? ""), String(row.ordersCreated), String(row.verified), String(row.delivered),
                String(row.finished), String(row.failed), map(row.failedByReason), String(row.refunded), value(row.revenue ?? ""),
            ]
            let pairings: [String] = [map(row.pairingsByRule), String(row.ambiguousPairings), String(row.supportPairings), String(row.undonePairings)]
            let apple: [Int] = [row.consumptionAnswered, row.consumptionFailed, row.consumptionTooLate, row.refundsCaughtUp]
            let rest = [value(row.refundedAmount ?? ""), text(row.environment), text(row.bundleId ?? ""), value(row.kind.rawValue), String(row.periods)]
            lines.append((orders + pairings + apple.map(String.init) + rest + [money(row.revenueByCurrency), money(row.refundedAmountByCurrency)])
                .joined(separator: ","))
        }
        lines.append("")
        lines.append("unmatched_count,oldest_age_seconds,under_1h,1h_1d,1d_7d,over_7d")
        lines.append([
            String(unmatched.count), unmatched.oldestAgeSeconds.map { String(format: "%.0f", $0) } ?? "",
            String(unmatched.byAge["under-1h"] ?? 0), String(unmatched.byAge["1h-1d"] ?? 0),
            String(unmatched.byAge["1d-7d"] ?? 0), String(unmatched.byAge["over-7d"] ?? 0),
        ].joined(separator: ","))
        return lines.joined(separator: "\n") + "\n"
    }
}

extension ReconciliationReport.Row {
    /// `rows` summed into one (day and product "total").
    static func sum(_ rows: [Self], environment: String) -> Self {
        var totals = Self(day: "total", productId: "total", currency: nil, environment: environment, kind: .total)
        var revenue: [String: Decimal] = [:]
        var refunded: [String: Decimal] = [:]
        for row in rows {
            totals.ordersCreated += row.ordersCreated
            totals.verified += row.verified
            totals.delivered += row.delivered
            totals.finished += row.finished
            totals.failed += row.failed
            totals.failedByReason.merge(row.failedByReason, uniquingKeysWith: +)
            totals.refunded += row.refunded
            totals.pairingsByRule.merge(row.pairingsByRule, uniquingKeysWith: +)
            totals.ambiguousPairings += row.ambiguousPairings
            totals.supportPairings += row.supportPairings
            totals.undonePairings += row.undonePairings
            totals.consumptionAnswered += row.consumptionAnswered
            totals.consumptionFailed += row.consumptionFailed
            totals.consumptionTooLate += row.consumptionTooLate
            totals.refundsCaughtUp += row.refundsCaughtUp
            totals.periods += row.periods
            // Orders created with a price and no currency have money of none named: kept under
            // "". A row with no currency and no money (consumption answers about pooled
            // transactions) adds nothing.
            let (rowRevenue, rowRefunded) = (row.revenue.flatMap { Decimal(string: $0) } ?? 0, row.refundedAmount.flatMap { Decimal(string: $0) } ?? 0)
            guard row.currency != nil || rowRevenue != 0 || rowRefunded != 0 else { continue }
            let currency = row.currency ?? ""
            revenue[currency, default: 0] += rowRevenue
            refunded[currency, default: 0] += rowRefunded
        }
        totals.revenueByCurrency = revenue.mapValues { "\($0)" }
        totals.refundedAmountByCurrency = refunded.mapValues { "\($0)" }
        // One currency (or none): its sums. Several: no sum, which would add up unlike money.
        switch revenue.count {
        case 0:
            (totals.revenue, totals.refundedAmount) = ("0", "0")
        case 1:
            totals.currency = revenue.keys.first.flatMap { $0.isEmpty ? nil : $0 }
            (totals.revenue, totals.refundedAmount) = ("\(revenue.values.first ?? 0)", "\(refunded.values.first ?? 0)")
        default:
            (totals.revenue, totals.refundedAmount) = (nil, nil)
        }
        return totals
    }

    mutating func countConsumptionAnswer(_ outcome: String, _ count: Int) {
        switch ConsumptionAnswer.Outcome(rawValue: outcome) {
        case .sent: consumptionAnswered += count
        case .refused: consumptionFailed += count
        case .tooLate: consumptionTooLate += count
        case nil: break
        }
    }
}
