import ArgumentParser
import Foundation
import LedgerStore
import PostgresNIO
import PrivatePostgres

/// A baseline measured with pgbench on the benchmark's database.
struct PgbenchBaseline {
    let binaries: PostgresBinaries
    let configuration: PostgresClient.Configuration
    let workDirectory: URL
    var workload: Workload = .insert

    /// What each pgbench transaction does.
    enum Workload: String {
        /// One single-row INSERT of an event's shape into a bare table: the floor of a durable write.
        case insert
        /// By hand, the durable work of one order event: lock the order's row, insert one event
        /// into the ledger's own log (its indexes and checks), update the order's row, commit.
        case orderEvent = "order-event"

        var script: String {
            switch self {
            case .insert:
                """
                \\set n random(1, 2000000000)
                INSERT INTO bench_baseline (stream_id, stream_version, event_id, type, data, metadata) VALUES ('bench-' || :n, 0, gen_random_uuid(), 'created', '{"orderId": "o-1", "userId": "u-1", "productId": "p-1", "price": "0.99"}', '{"by": "bench"}');

                """
            case .orderEvent:
                """
                \\set n random(1, \(PgbenchBaseline.orders))
                BEGIN;
                SELECT version AS v FROM orders WHERE order_id = 'pgbench-' || :n FOR UPDATE \\gset
                INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, metadata) VALUES (pg_current_xact_id()::text::bigint << 12, 'order-pgbench-' || :n, :v + 1, gen_random_uuid(), 'delivered', '{"queuedAt": "2026-11-21T10:00:00.000Z"}', '{"appendedBy": "bench", "requestId": "pgbench"}');
                UPDATE orders SET state = 'delivered', version = :v + 1, updated_at = now() WHERE order_id = 'pgbench-' || :n;
                COMMIT;

                """
            }
        }
    }

    /// The orders the `order-event` workload writes to, chosen at random (contention is rare).
    static let orders = 10_000

    static let tableSQL = """
        CREATE TABLE bench_baseline (
            stream_id text, stream_version bigint, event_id uuid, type text, data jsonb, metadata jsonb,
            recorded_at timestamptz DEFAULT now(), transaction_id xid8 DEFAULT pg_current_xact_id())
        """

    /// The `order-event` workload's orders `low` to `high`, each with its `created` event, as the
    /// ledger stores them (4,096 events at most: one transaction positions no more).
    static func ordersSQL(_ low: Int, _ high: Int) -> String {
        """
        WITH o AS MATERIALIZED (
            SELECT 'pgbench-' || i AS order_id, gen_random_uuid() AS token FROM generate_series(\(low), \(high)) AS i
        ), ev AS (
            INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data)
            SELECT pg_current_xact_id()::text::bigint * 4096 + row_number() OVER () - 1, 'order-' || order_id, 0, gen_random_uuid(),
                   'created', jsonb_build_object('userId', 'u-pgbench', 'productId', 'gems.100', 'quantity', 1, 'appAccountToken', token)
            FROM o
        )
        INSERT INTO orders (order_id, user_id, product_id, quantity, app_account_token, state, version, created_at, updated_at)
        SELECT order_id, 'u-pgbench', 'gems.100', 1, token, 'created', 0, now(), now() FROM o
        """
    }

    func run(concurrency: Int, seconds: Int) throws -> LatencySummary {
        try measure(concurrency: concurrency, seconds: seconds).summary
    }

    /// A run's figures and the whole machine's CPU while pgbench ran (its start, its connections
    /// and its rows; not the reading of its logs here afterwards).
    typealias Measurement = (summary: LatencySummary, machine: MachineCPU)

    /// `run`, with the machine's CPU meanwhile.
    func measure(concurrency: Int, seconds: Int) throws -> Measurement {
        let runDirectory = workDirectory.appendingPathComponent("pgbench-\(workload.rawValue)-\(concurrency)")
        try? FileManager.default.removeItem(at: runDirectory)
        try FileManager.default.createDirectory(at: runDirectory, withIntermediateDirectories: true)
        let scriptPath = runDirectory.appendingPathComponent("\(workload.rawValue).sql").path
        try workload.script.write(toFile: scriptPath, atomically: true, encoding: .utf8)

        var arguments = ["-n", "-M", "prepared", "-c", "\(concurrency)", "-j", "\(min(concurrency, 2))", "-T", "\(seconds)",
                         "-l", "--log-prefix", runDirectory.appendingPathComponent("log").path, "-f", scriptPath,
                         "-U", configuration.username]
        if let socket = configuration.unixSocketPath {
            let url = URL(fileURLWithPath: socket)
            arguments += ["-h", url.deletingLastPathComponent().path, "-p", String(url.lastPathComponent.split(separator: ".").last ?? "5432")]
        } else {
            arguments += ["-h", configuration.host ?? "localhost", "-p", "\(configuration.port ?? 5432)"]
        }
        arguments.append(configuration.database ?? configuration.username)
        if let password = configuration.password { setenv("PGPASSWORD", password, 1) }

        let before = MachineCPU.now()
        let outcome = try ProcessRunner(workingDirectory: runDirectory).runBlocking(binaries.pgbench, arguments)
        let machine = MachineCPU.now() - before
        guard outcome.status == 0 else { throw ValidationError("pgbench failed: \(outcome.output)") }
        return (try summary(output: outcome.output, logDirectory: runDirectory, seconds: seconds), machine)
    }

    /// Transactions from the summary, latencies from the per-transaction logs (third field, µs).
    private func summary(output: String, logDirectory: URL, seconds: Int) throws -> LatencySummary {
        let processed = output.split(separator: "\n").first { $0.contains("number of transactions actually processed") }
            .flatMap { $0.split(separator: ":").last?.split(separator: "/").first }
            .flatMap { Int($0.trimmingCharacters(in: .whitespaces)) } ?? 0
        var latencies: [Double] = []
        for file in try FileManager.default.contentsOfDirectory(atPath: logDirectory.path) where file.hasPrefix("log") {
            let text = try String(contentsOf: logDirectory.appendingPathComponent(file), encoding: .utf8)
            for line in text.split(separator: "\n") {
                let fields = line.split(separator: " ")
                if fields.count > 2, let micros = Double(fields[2]) { latencies.append(micros / 1000) }
            }
        }
        return LatencySummary(operations: processed, seconds: Double(seconds), latencies: latencies)
    }
}
