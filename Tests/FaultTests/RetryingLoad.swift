import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1

/// Clients that create orders and append their events with ids of their own, retrying every
/// request with the same body (so the same order id and event id) until it is answered 2xx — what
/// a backend does when the ledger or its database goes away. Records what was acknowledged and
/// every answer that was not.
actor RetryingLoad {
    struct Answer: Sendable {
        let status: Int
        let retryAfter: String?
        let body: String
    }

    /// Order ids whose creation was acknowledged, and event ids acknowledged per order.
    private(set) var ackedOrders: Set<String> = []
    private(set) var ackedEvents: [String: Set<String>] = [:]
    /// Every event id sent at least once per order (acknowledged or not).
    private(set) var sentEvents: [String: Set<String>] = [:]
    /// Non-2xx answers, and requests that got no answer (the server was gone).
    private(set) var refusals: [Answer] = []
    private(set) var unanswered = 0
    private(set) var acknowledgedAt: [ContinuousClock.Instant] = []
    /// Every request, when it was sent and when and how it was answered (nil: not yet, or never).
    private(set) var requests: [Request] = []

    struct Request: Sendable {
        let sent: ContinuousClock.Instant
        var answered: ContinuousClock.Instant?
        var answer: Answer?
    }

    private var stopping = false

    let base: String
    let key: String
    let client: HTTPClient

    init(base: String, key: String, client: HTTPClient) {
        self.base = base
        self.key = key
        self.client = client
    }

    func stop() { stopping = true }
    var isStopping: Bool { stopping }

    func acked(order: String) { ackedOrders.insert(order); acknowledgedAt.append(.now) }
    func acked(event: String, order: String) { ackedEvents[order, default: []].insert(event); acknowledgedAt.append(.now) }
    func sent(event: String, order: String) { sentEvents[order, default: []].insert(event) }
    func refused(_ answer: Answer) { refusals.append(answer) }
    func noAnswer(_ error: any Error, path: String) {
        unanswered += 1
        transportErrors.append("\(path): \(String(reflecting: error))")
    }
    /// What the client saw instead of an answer, for a failure's message.
    private(set) var transportErrors: [String] = []
    func sending() -> Int {
        requests.append(Request(sent: .now))
        return requests.count - 1
    }
    func answered(_ request: Int, _ answer: Answer?) {
        requests[request].answered = .now
        requests[request].answer = answer
    }
    /// The requests sent and not answered yet.
    var inFlight: [Int] { requests.indices.filter { requests[$0].answered == nil } }

    /// Runs `clients` workers until `stop()`; each finishes the order it is on, so every request
    /// started is retried to an answer (or the test's deadline).
    nonisolated func run(clients: Int, prefix: String, deadline: ContinuousClock.Instant) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            for worker in 0..<clients {
                group.addTask { try await self.worker(worker, prefix: prefix, deadline: deadline) }
            }
            try await group.waitForAll()
        }
    }

    private nonisolated func worker(_ worker: Int, prefix: String, deadline: ContinuousClock.Instant) async throws {
        var number = 0
        while await !isStopping {
            let order = "\(prefix)-\(worker)-\(number)"
            number += 1
            let create = #"{"orderId":"\#(order)","userId":"u-\#(worker)","productId":"gems.100","price":"0.99","currency":"USD"}"#
            try await send("/v1/orders", create, deadline: deadline)
            await acked(order: order)
            let events = [
                #""type":"payment-added","data":{"queuedAt":"2026-11-21T10:00:00Z"}"#,
                #""type":"receipt-received","data":{"transactionId":"t-\#(order)","productId":"gems.100","purchaseDate":"2026-11-21T10:00:00Z","receiptSha256":"\#(String(repeating: "ab", count: 32))","format":"jws","matchedBy":"applicationUsername"}"#,
                #""type":"verified","data":{"environment":"Sandbox"}"#,
                #""type":"delivered","data":{}"#,
                #""type":"finished","data":{}"#,
            ]
            for event in events {
                let id = UUID().uuidString.lowercased()
                await sent(event: id, order: order)
                try await send("/v1/orders/\(order)/events", #"{"eventId":"\#(id)",\#(event)}"#, deadline: deadline)
                await acked(event: id, order: order)
            }
        }
    }

    /// Sends until a 2xx answer; 503 and lost connections are retried after a short pause, and
    /// every other answer is recorded and retried too (the test then fails on it).
    private nonisolated func send(_ path: String, _ body: String, deadline: ContinuousClock.Instant) async throws {
        while true {
            guard ContinuousClock.now < deadline else { throw FaultTestError("\(path) was not acknowledged before the test's deadline") }
            var request = HTTPClientRequest(url: base + path)
            request.method = .POST
            request.headers.add(name: "Authorization", value: "Bearer \(key)")
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: body))
            let sent = await sending()
            do {
                // Generous: an answer is never raced against the machine's speed; a request
                // that waited the outage out shows in the tests' checks of `requests`.
                let response = try await client.execute(request, timeout: .seconds(120))
                let text = String(buffer: try await response.body.collect(upTo: 1 << 20))
                let answer = Answer(status: Int(response.status.code), retryAfter: response.headers.first(name: "Retry-After"), body: text)
                await answered(sent, answer)
                if (200..<300).contains(response.status.code) { return }
                await refused(answer)
            } catch {
                await answered(sent, nil)
                await noAnswer(error, path: path)
            }
            try await Task.sleep(for: .milliseconds(100))
        }
    }
}
