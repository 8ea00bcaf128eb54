import Hummingbird
import LedgerCore
import Prometheus
import Synchronization

/// The service's Prometheus metrics, in a registry of its own (one per application).
final class LedgerMetrics: Sendable {
    let registry: PrometheusCollectorRegistry
    private let consumptionRequestsPending: Gauge
    private let consumptionSecondsLeft: Gauge

    init() {
        let registry = PrometheusCollectorRegistry()
        self.registry = registry
        consumptionRequestsPending = registry.makeGauge(
            descriptor: .init(metricName: "ledger_apple_consumption_requests_pending", helpText: "Consumption requests not yet answered"))
        consumptionSecondsLeft = registry.makeGauge(
            descriptor: .init(metricName: "ledger_apple_consumption_seconds_left", helpText: "Least time left to answer a pending consumption request"))
        consumptionPending(count: 0, secondsLeft: nil)
    }

    static let durationBuckets: [Duration] = [
        .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
        .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5), .seconds(5),
    ]

    /// The counter and histogram of each route, method and status seen so far: the registry
    /// checks names and labels and looks them up under its lock on every `make`, which was 4% of
    /// the server's CPU when done per request.
    private let requestMetrics = Mutex<[RequestKey: (Counter, DurationHistogram)]>([:])

    private struct RequestKey: Hashable {
        let route: String
        let method: String
        let status: Int
    }

    func request(route: String, method: String, status: Int, duration: Duration) {
        let key = RequestKey(route: route, method: method, status: status)
        let (counter, histogram) = requestMetrics.withLock { known in
            if let metrics = known[key] { return metrics }
            let metrics = (
                registry.makeCounter(
                    descriptor: .init(metricName: "http_server_requests", unitName: "total", helpText: "HTTP requests answered, by route and status"),
                    labels: [("http_route", route), ("http_request_method", method), ("http_response_status_code", String(status))]),
                registry.makeDurationHistogram(
                    descriptor: .init(metricName: "http_server_request_duration", unitName: "seconds", helpText: "HTTP request durations, by route"),
                    labels: [("http_route", route), ("http_request_method", method)],
                    buckets: Self.durationBuckets))
            known[key] = metrics
            return metrics
        }
        counter.increment()
        histogram.record(duration)
    }

    /// Events the ledger appended and committed, whichever route or service appended them.
    @Sendable func eventsAppended(_ types: [String]) {
        for type in types {
            counter("ledger_events_appended", help: "Events appended to the log, by type", label: "type", type).increment()
        }
    }

    /// Receipts by outcome and app: `rejected` and `retry-later` are the verification failures
    /// worth an alert. `app`: the held app Apple signed the proof for, in lower case (bundle ids
    /// are case-insensitive; Apple may sign another case than the app was added in), "" when none.
    func receiptAnswered(_ outcome: String, app: String?) {
        counter("ledger_receipts", help: "Proofs of purchase answered, by outcome and app", labels: [("outcome", outcome), ("app", app?.lowercased() ?? "")])
            .increment()
    }

    /// Proofs refused because the ledger holds no app of the bundle Apple signed (nothing of
    /// them is stored), by `proof`: `transaction`, `receipt`, `notification`.
    func unknownApp(_ proof: String) {
        counter("ledger_apple_unknown_app", help: "Proofs refused for an app the ledger does not hold, by kind", label: "proof", proof).increment()
    }

    /// Notifications by result and app (`app` as for receipts).
    func notificationAnswered(_ result: String, app: String?) {
        counter("ledger_apple_notifications", help: "App Store Server Notifications, by result and app", labels: [("result", result), ("app", app?.lowercased() ?? "")])
            .increment()
    }

    /// Calls to Apple the log called for, by `<kind> <outcome>` (consumption `too-late` and
    /// `refused`, and any `given-up`, are worth an alert).
    func appleCalled(_ kindAndOutcome: String, times: Int) {
        counter("ledger_apple_calls", help: "Calls to Apple made because of events, by kind and outcome", label: "call", kindAndOutcome)
            .increment(by: Int64(times))
    }

    /// A notification backfill that started again from the earliest date Apple allows, by
    /// Apple's reason (`StartDateTooFarInPast`, `InvalidPaginationToken`, `PaginationTokenExpired`).
    @Sendable func notificationBackfillRestarted(_ reason: String) {
        counter("ledger_notification_backfill_restarts", help: "Notification backfills started again after Apple refused their position, by reason",
                label: "reason", reason).increment()
    }

    /// Work that asks Apple skipped because its app has no App Store Server API key, by app.
    @Sendable func appleAppSkipped(_ app: BundleID) {
        counter("ledger_apple_apps_skipped", help: "Work that asks Apple skipped for want of the app's App Store Server API key, by app",
                label: "app", app.rawValue).increment()
    }

    /// Consumption requests waiting for an answer, and the least time left to send one (Apple
    /// waits 12 hours); set by each pass of the calls to Apple.
    func consumptionPending(count: Int, secondsLeft: Double?) {
        consumptionRequestsPending.set(Int64(count))
        consumptionSecondsLeft.set(secondsLeft ?? 43_200)
    }

    /// The counters of one label seen so far, kept for the reason `requestMetrics` is (the
    /// registry's lookup of the events' counter was 1.5% of the server's CPU).
    private let counters = Mutex<[CounterKey: Counter]>([:])

    private struct CounterKey: Hashable {
        let name: String
        let values: [String]
    }

    private func counter(_ name: String, help: String, label: String, _ value: String) -> Counter {
        counter(name, help: help, labels: [(label, value)])
    }

    private func counter(_ name: String, help: String, labels: [(String, String)]) -> Counter {
        counters.withLock { known in
            let key = CounterKey(name: name, values: labels.map(\.1))
            if let counter = known[key] { return counter }
            let counter = registry.makeCounter(descriptor: .init(metricName: name, unitName: "total", helpText: help), labels: labels)
            known[key] = counter
            return counter
        }
    }
}

/// Records every answer's route, status and duration; outermost, so it sees the final status.
struct MetricsMiddleware: RouterMiddleware {
    typealias Context = LedgerRequestContext
    let metrics: LedgerMetrics

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let start = ContinuousClock.now
        let response = try await next(request, context)
        metrics.request(
            route: context.endpointPath ?? "unknown", method: request.method.rawValue,
            status: response.status.code, duration: ContinuousClock.now - start)
        return response
    }
}
