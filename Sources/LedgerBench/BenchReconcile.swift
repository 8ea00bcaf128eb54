import ArgumentParser
import Foundation
import LedgerCore
import LedgerServer
import LedgerServices
import LedgerStore
import Logging
import PostgresNIO

/// `ledger-bench reconcile`: one reconciler pass over a pool of orphans and a population of open
/// orders loaded straight into a scratch database (events and projections as the ledger writes
/// them, in bulk), at two sizes; prints each pass's time and the ratio between the sizes.
struct BenchReconcile: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "reconcile", abstract: "Reconciler passes at two sizes (orphans : open orders).")

    @OptionGroup var options: BenchOptions
    @Option(help: "Sizes as orphans:openOrders, comma-separated") var sizes = "10000:100000,100000:1000000"

    func run() async throws {
        let configuration = try options.load()
        let logger = benchLogger
        let parsed = try sizes.split(separator: ",").map { pair -> (Int, Int) in
            let parts = pair.split(separator: ":").compactMap { Int($0) }
            guard parts.count == 2, parts[0] > 0, parts[1] >= parts[0] else { throw BenchFailure("--sizes takes orphans:openOrders pairs, such as 10000:100000") }
            return (parts[0], parts[1])
        }
        let opened = try await OpenedDatabase.open(configuration.database, logger: logger)
        defer { try? opened.close(logger: logger) }
        var results: [(orphans: Int, orders: Int, summary: ReconcilerPass.Summary, load: Double)] = []
        for (orphans, orders) in parsed {
            let bench = try await BenchAppend.prepareDatabase(opened.clientConfiguration, logger: logger)
            let (summary, load) = try await withPostgresClient(bench, logger: logger) { client in
                let database = Database(client: client, logger: logger)
                let loadStart = ContinuousClock.now
                try await Self.loadMix(orphans: orphans, orders: orders, on: database)
                let loaded = ContinuousClock.now - loadStart
                let summary = try await ServiceAssembly(database: database).reconcilerPass(settings: .init(settle: 0)).run()
                return (summary, loaded.inSeconds)
            }
            results.append((orphans, orders, summary, load))
            FileHandle.standardError.write(Data("reconciled \(orphans) orphans against \(orders) open orders in \(format(summary.seconds, decimals: 1)) s\n".utf8))
        }
        print("Reconciler pass (one pass over the realistic mix: users with 1, 2, 4 or 10 open orders, 2.2 on average, half queued; one orphan in ten with no candidate; loading not counted)")
        printTableHeader(["orphans", "open orders", "paired", "ambiguous", "pass s", "orphans/s", "load s"])
        for result in results {
            printTableRow(["\(result.orphans)", "\(result.orders)", "\(result.summary.paired)", "\(result.summary.ambiguous)", format(result.summary.seconds, decimals: 1),
                           format(Double(result.summary.paired) / max(result.summary.seconds, 0.001)), format(result.load, decimals: 1)])
        }
        if results.count >= 2 {
            let first = results[0], last = results[results.count - 1]
            let growth = Double(last.orphans) / Double(first.orphans)
            print("Time ratio \(last.orphans)/\(first.orphans) orphans: \(format(last.summary.seconds / max(first.summary.seconds, 0.001), decimals: 2)) for \(format(growth, decimals: 0))× the work (linear: \(format(growth, decimals: 0)))")
        }
        try await BenchAppend().dropDatabase(opened.clientConfiguration, logger: logger)
    }

    /// The reconciler's realistic mix, as events and projection rows: users with 1 (half of them),
    /// 2, 4 or 10 open orders (2.2 on average) of two products, half of the orders with
    /// `payment-added`; orphans of the first users, one each but every tenth a second purchase of
    /// the user before it, and one in ten of a product no order has (no candidate).
    static func loadMix(orphans: Int, orders: Int, on database: Database) async throws {
        let users = max(orders * 20 / 44, orphans)
        // At most 2,047 orders (two events each) per transaction: 900 users make 1,980.
        for low in stride(from: 0, to: users, by: 900) {
            let high = min(low + 900, users) - 1
            try await database.client.query(
                """
                WITH o AS MATERIALIZED (
                    SELECT row_number() OVER (ORDER BY u, g) - 1 AS n, 'bench-order-' || u || '-' || g AS order_id,
                           'user-' || u AS user_id, 'product-' || (g % 2) AS product_id, (u + g) % 2 = 0 AS queued,
                           date_trunc('milliseconds', now()) - make_interval(mins => (30 + (u * 7 + g * 13) % 1000)::int) AS created_at,
                           gen_random_uuid() AS token
                    FROM generate_series(\(low), \(high)) AS u,
                         LATERAL generate_series(1, CASE WHEN u % 20 < 10 THEN 1 WHEN u % 20 < 16 THEN 2 WHEN u % 20 < 19 THEN 4 ELSE 10 END) AS g
                ), created AS (
                    INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, recorded_at)
                    SELECT pg_current_xact_id()::text::bigint * 4096 + 2 * n, 'order-' || order_id, 0, gen_random_uuid(), 'created',
                           jsonb_build_object('userId', user_id, 'productId', product_id, 'quantity', 1, 'appAccountToken', token), created_at
                    FROM o
                ), paid AS (
                    INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, recorded_at)
                    SELECT pg_current_xact_id()::text::bigint * 4096 + 2 * n + 1, 'order-' || order_id, 1, gen_random_uuid(), 'payment-added',
                           jsonb_build_object('queuedAt', to_char((created_at + interval '20 seconds') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')),
                           created_at + interval '20 seconds'
                    FROM o WHERE queued
                )
                INSERT INTO orders (order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                                    transaction_id, created_at, updated_at, queued_at)
                SELECT order_id, user_id, product_id, 1, NULL, NULL, token, CASE WHEN queued THEN 'payment-added' ELSE 'created' END,
                       CASE WHEN queued THEN 1 ELSE 0 END, NULL, created_at,
                       CASE WHEN queued THEN created_at + interval '20 seconds' ELSE created_at END,
                       CASE WHEN queued THEN created_at + interval '20 seconds' END
                FROM o
                """,
                logger: database.logger)
        }
        try await loadOrphans(
            orphans, user: "'user-' || (j - CASE WHEN j % 10 = 9 THEN 1 ELSE 0 END)",
            product: "CASE WHEN j % 10 = 3 THEN 'product-9' ELSE 'product-1' END",
            purchased: "date_trunc('second', now()) - interval '20 minutes'", received: "now() - interval '1 hour'", on: database)
        try await database.client.query("ANALYZE", logger: database.logger)
    }

    /// Open orders (10 per user, two products, half with payment-added) and orphans of the same
    /// users, as events and projection rows, 4,000 per transaction (a position holds 4,096 events
    /// per writing transaction).
    static func load(orphans: Int, orders: Int, on database: Database) async throws {
        let users = max(orders / 10, 1)
        let batch = 4_000
        for low in stride(from: 0, to: orders, by: batch) {
            let high = min(low + batch, orders) - 1
            try await database.client.query(
                """
                WITH o AS MATERIALIZED (
                    SELECT i, 'bench-order-' || i AS order_id, 'user-' || (i % \(users)) AS user_id, 'product-' || (i % 2) AS product_id,
                           now() - make_interval(mins => (10 + i % 1000)::int) AS created_at, gen_random_uuid() AS token
                    FROM generate_series(\(low), \(high)) AS i
                ), ev AS (
                    INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, recorded_at)
                    SELECT pg_current_xact_id()::text::bigint * 4096 + (i - \(low)), 'order-' || order_id, 0, gen_random_uuid(), 'created',
                           jsonb_build_object('userId', user_id, 'productId', product_id, 'quantity', 1, 'appAccountToken', token), created_at
                    FROM o
                )
                INSERT INTO orders (order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                                    transaction_id, created_at, updated_at, queued_at)
                SELECT order_id, user_id, product_id, 1, 0.99, 'USD', token, 'created', 0, NULL, created_at, created_at, NULL FROM o
                """,
                logger: database.logger)
        }
        try await loadOrphans(
            orphans, user: "'user-' || (j % \(users))", product: "'product-' || (j % 2)", purchased: "date_trunc('second', now())",
            received: "now()", on: database)
        try await database.client.query("ANALYZE", logger: database.logger)
    }

    /// `count` orphans, 4,000 per transaction, as events and pool rows: transaction ids from
    /// 900000000000 on, each row's user, product, purchase date and reception time given as SQL
    /// expressions of its number `j`.
    static func loadOrphans(
        _ count: Int, user: String, product: String, purchased: String, received: String, on database: Database
    ) async throws {
        let batch = 4_000
        for low in stride(from: 0, to: count, by: batch) {
            let high = min(low + batch, count) - 1
            try await database.client.query(
                """
                WITH t AS MATERIALIZED (
                    SELECT j, (900000000000 + j)::text AS transaction_id, \(unescaped: user) AS user_id, \(unescaped: product) AS product_id,
                           \(unescaped: purchased) AS purchase_date, \(unescaped: received) AS received_at
                    FROM generate_series(\(low), \(high)) AS j
                ), body AS MATERIALIZED (
                    SELECT t.*, jsonb_build_object(
                        'transaction', jsonb_build_object(
                            'transactionId', transaction_id, 'originalTransactionId', transaction_id, 'productId', product_id,
                            'purchaseDate', to_char(purchase_date AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                            'environment', 'Sandbox', 'bundleId', 'com.example.bench', 'quantity', 1, 'format', 'jws',
                            'receiptSha256', repeat('ab', 32)),
                        'userId', user_id, 'reason', 'no-order') AS data
                    FROM t
                ), ev AS (
                    INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, recorded_at)
                    SELECT pg_current_xact_id()::text::bigint * 4096 + (j - \(low)), 'transaction-' || transaction_id, 0, gen_random_uuid(),
                           'transaction-unmatched', data, received_at
                    FROM body
                )
                INSERT INTO apple_transactions (transaction_id, order_id, user_id, product_id, purchase_date, environment, status,
                                                received_at, updated_at, verification)
                SELECT transaction_id, NULL, user_id, product_id, purchase_date, 'Sandbox', 'unmatched', received_at, received_at, data
                FROM body
                """,
                logger: database.logger)
        }
    }
}
