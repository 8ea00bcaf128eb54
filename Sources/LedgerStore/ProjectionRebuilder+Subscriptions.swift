import Foundation
import LedgerCore
import PostgresNIO

/// The subscriptions projection's part of a rebuild: the rows `Subscription.evolve` folded from
/// the `subscription-*` streams, written by binary `COPY` as the writer would have left them.
extension ProjectionRebuilder {
    static let subscriptionColumns = [
        "original_transaction_id", "bundle_id", "environment", "user_id", "product_id", "subscription_group", "family_shared",
        "started_at", "expires_at", "auto_renew", "auto_renew_product_id", "expiration_intent", "grace_period_expires_at",
        "in_billing_retry", "expired", "revoked_at", "version", "updated_at", "renewal_signed_at",
    ]
    static let periodColumns = [
        "original_transaction_id", "period_key", "transaction_id", "kind", "product_id", "purchase_date", "expires_at", "price",
        "currency", "refunded_at", "refund_percentage",
    ]

    /// Writes `subscriptions`, then their periods, into `schema`'s tables.
    func writeSubscriptions(_ subscriptions: some Collection<Subscription>, schema: String, on connection: PostgresConnection) async throws {
        guard !subscriptions.isEmpty else { return }
        let logger = database.logger
        try await connection.copyBinary(schema: schema, table: "subscriptions", columns: Self.subscriptionColumns, logger: logger) { writer in
            var copy = BinaryCopyRows()
            for subscription in subscriptions {
                copy.append(subscription)
                try await copy.flushIfFull(to: writer)
            }
            try await copy.finish(to: writer)
        }
        try await connection.copyBinary(schema: schema, table: "subscription_periods", columns: Self.periodColumns, logger: logger) { writer in
            var copy = BinaryCopyRows()
            for subscription in subscriptions {
                for period in subscription.periods {
                    copy.append(period, of: subscription.originalTransactionId)
                    try await copy.flushIfFull(to: writer)
                }
            }
            try await copy.finish(to: writer)
        }
    }
}

extension BinaryCopyRows {
    /// A `subscriptions` row, in `ProjectionRebuilder.subscriptionColumns`' order.
    mutating func append(_ s: Subscription) {
        row(columns: Int16(ProjectionRebuilder.subscriptionColumns.count))
        text(s.originalTransactionId)
        text(s.bundleId?.rawValue)
        text(s.environment)
        text(s.userId?.rawValue)
        text(s.productId.rawValue)
        text(s.subscriptionGroup)
        bool(s.familyShared)
        timestamp(s.startedAt)
        timestamp(s.expiresAt)
        bool(s.autoRenew)
        text(s.autoRenewProductId)
        integer(s.expirationIntent)
        timestamp(s.gracePeriodExpiresAt)
        bool(s.inBillingRetry)
        bool(s.expired)
        timestamp(s.revokedAt)
        int64(s.version)
        timestamp(s.updatedAt)
        timestamp(s.renewalSignedAt)
    }

    /// A `subscription_periods` row of subscription `id`, in `ProjectionRebuilder.periodColumns`' order.
    mutating func append(_ p: Subscription.Period, of id: String) {
        row(columns: Int16(ProjectionRebuilder.periodColumns.count))
        text(id)
        text(p.periodKey)
        text(p.transactionId.rawValue)
        text(p.kind.rawValue)
        text(p.productId.rawValue)
        timestamp(p.purchaseDate)
        timestamp(p.expiresAt)
        numeric(p.price)
        text(p.currency)
        timestamp(p.refundedAt)
        integer(p.refundPercentage)
    }
}
