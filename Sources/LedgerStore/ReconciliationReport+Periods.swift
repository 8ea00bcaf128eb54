import Foundation
import LedgerCore
import PostgresNIO

extension ReconciliationReport {
    /// A subscription's periods billed, and its periods' refunds, in one day, product, currency,
    /// environment, app and kind.
    struct PeriodCount: Sendable {
        var day: String
        var productId: String
        var currency: String?
        var environment: String
        var bundleId: String?
        var kind: Row.Kind
        /// Periods whose purchase date is in the day.
        var billed = 0
        /// Their prices, as Apple signed them.
        var amount: Decimal = 0
        /// Renewal periods whose refund was recorded in the day, and the share of their prices
        /// the refunds took back.
        var refunded = 0
        var refundedAmount: Decimal = 0
    }

    /// The periods of the subscriptions (never a family member's shared one) billed from `from`
    /// to `to` (purchase date), and the refunds of renewal periods recorded then: a start period's
    /// refund is its order's `refunded`, counted with the order. A renewal an order holds and
    /// verified (an imported history's, a backend's own claim) bills nothing here: that
    /// `verified` has its money; its refund, recorded on the period, counts here unless that order
    /// has a `refunded` (Apple's refund refunds the order holding it too, which counts it). A refund's share is
    /// `refund_share`'s of its `subscription-period-refunded` event, the rule of orders' refunds.
    /// A period counts one refund at most, Apple's latest (by revocation date), as an order does;
    /// of copies of one refund (the refund catch-up of earlier versions recorded a refund that came
    /// by notification again), the first recorded.
    static func periodCounts(database: Database, from: Date, to: Date, apps: [String]?) async throws -> [PeriodCount] {
        var counts: [String: PeriodCount] = [:]
        func add(_ day: String, _ product: String, _ currency: String?, _ environment: String, _ bundle: String?, _ kind: String,
                 _ change: (inout PeriodCount) -> Void) {
            let kind = Row.Kind(rawValue: kind) ?? .subscriptionRenewal
            let k = rowKey(day, product, currency, environment, bundle, kind)
            var count = counts[k] ?? PeriodCount(day: day, productId: product, currency: currency, environment: environment, bundleId: bundle, kind: kind)
            change(&count)
            counts[k] = count
        }
        let billed = try await database.query(
            """
            SELECT to_char(p.purchase_date AT TIME ZONE 'UTC', 'YYYY-MM-DD'), p.product_id, p.currency, s.environment, s.bundle_id,
                   p.kind, count(*)::int,
                   trim_scale(coalesce(sum(p.price) FILTER (WHERE NOT EXISTS (
                       SELECT 1 FROM apple_transactions h JOIN events v ON v.stream_id = 'order-' || h.order_id AND v.type = 'verified'
                        WHERE h.transaction_id = p.transaction_id AND h.order_id IS NOT NULL)), 0))::text
              FROM subscription_periods p JOIN subscriptions s ON s.original_transaction_id = p.original_transaction_id
             WHERE NOT s.family_shared AND p.purchase_date >= \(from) AND p.purchase_date < \(to)
               AND (\(apps)::text[] IS NULL OR s.bundle_id = ANY(\(apps)::text[]))
             GROUP BY 1, 2, 3, 4, 5, 6
            """)
        for try await (day, product, currency, environment, bundle, kind, count, amount)
            in billed.decode((String, String, String?, String, String?, String, Int, String).self) {
            add(day, product, currency, environment, bundle, kind) {
                $0.billed += count
                $0.amount += Decimal(string: amount) ?? 0
            }
        }
        let refunds = try await database.query(
            """
            SELECT to_char(e.recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD'), p.product_id, p.currency, s.environment, s.bundle_id,
                   p.kind, count(*)::int, trim_scale(coalesce(sum(p.price * refund_share(e.data)), 0))::text
              FROM events e
              JOIN subscription_periods p ON p.original_transaction_id = substr(e.stream_id, 14) AND p.period_key = e.data->>'periodKey'
              JOIN subscriptions s ON s.original_transaction_id = p.original_transaction_id
             WHERE e.stream_id LIKE 'subscription-%' AND e.type = 'subscription-period-refunded'
               AND e.recorded_at >= \(from) AND e.recorded_at < \(to)
               AND p.kind = 'subscription-renewal' AND NOT s.family_shared
               AND (\(apps)::text[] IS NULL OR s.bundle_id = ANY(\(apps)::text[]))
               AND NOT EXISTS (SELECT 1 FROM events f
                                WHERE f.stream_id = e.stream_id AND f.type = 'subscription-period-refunded'
                                  AND f.data->>'periodKey' = e.data->>'periodKey' AND f.stream_version <> e.stream_version
                                  AND (coalesce((f.data->>'revocationDate')::timestamptz, f.recorded_at) > coalesce((e.data->>'revocationDate')::timestamptz, e.recorded_at)
                                       OR (coalesce((f.data->>'revocationDate')::timestamptz, f.recorded_at) = coalesce((e.data->>'revocationDate')::timestamptz, e.recorded_at)
                                           AND f.stream_version < e.stream_version)))
               -- Held by an order Apple's refund refunded too: the money went back with the order's
               -- `refunded`, which counts here even once reversed (as this period's would).
               AND NOT EXISTS (SELECT 1 FROM apple_transactions h JOIN events v ON v.stream_id = 'order-' || h.order_id AND v.type = 'refunded'
                                WHERE h.transaction_id = p.transaction_id)
             GROUP BY 1, 2, 3, 4, 5, 6
            """)
        for try await (day, product, currency, environment, bundle, kind, count, amount)
            in refunds.decode((String, String, String?, String, String?, String, Int, String).self) {
            add(day, product, currency, environment, bundle, kind) {
                $0.refunded += count
                $0.refundedAmount += Decimal(string: amount) ?? 0
            }
        }
        return Array(counts.values)
    }
}
