import HTTPTypes
import Hummingbird
import HummingbirdCore
import HummingbirdTesting
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

/// HTTP to a live server of the tests. HummingbirdTesting's `.live` gives its client a fixed 20 s
/// read time-out, and requests queued on its one connection (32 concurrent appends) can wait
/// longer than that on a loaded machine; this client waits as long as the test runs.
struct LiveClient: Sendable {
    let client: TestClient
    /// The server's port, for a test that speaks to it without this client.
    let port: Int

    struct Response: Sendable {
        let status: HTTPResponse.Status
        let headers: HTTPFields
        let body: ByteBuffer
    }

    func execute(uri: String, method: HTTPRequest.Method, headers: HTTPFields = [:], body: ByteBuffer? = nil) async throws -> Response {
        var headers = headers
        headers[.connection] = "keep-alive"
        let response = try await client.execute(.init(uri, method: method, authority: "localhost", headers: headers, body: body))
        return Response(status: response.status, headers: response.headers, body: response.body ?? ByteBuffer())
    }
}

/// Runs `application` on a free local port for the length of `test`, which gets a client of it.
func withLiveServer<App: ApplicationProtocol, Value: Sendable>(
    _ application: App, _ test: @Sendable (LiveClient) async throws -> Value
) async throws -> Value {
    let port = PortPromise()
    let server = PortReporting(base: application, port: port)
    let group = ServiceGroup(configuration: .init(services: [server], gracefulShutdownSignals: [], logger: application.logger))
    return try await withThrowingTaskGroup(of: Void.self) { tasks in
        tasks.addTask {
            defer { port.complete(nil) }
            try await group.run()
        }
        guard let bound = await port.wait() else {
            // The server ended before it listened: its error.
            try await tasks.waitForAll()
            throw CancellationError()
        }
        let outcome: Result<Value, any Error>
        var client: TestClient?
        do {
            let connected = try await connectedClient(bound)
            client = connected
            outcome = .success(try await test(LiveClient(client: connected, port: bound)))
        } catch {
            outcome = .failure(error)
        }
        try? await client?.shutdown()
        await group.triggerGracefulShutdown()
        try await tasks.waitForAll()
        return try outcome.get()
    }
}

/// A client connected to the local server on `port`. Hummingbird's test client gives a connection
/// 5 s: on a machine whose every core is busy many times over, one took longer (its `Connect
/// timeout (5 s)` failed whole tests). A connection that timed out is tried again, ten times in
/// all; a server that refuses, or never accepts, still fails the test.
func connectedClient(_ port: Int) async throws -> TestClient {
    var attempt = 1
    while true {
        let client = TestClient(host: "localhost", port: port, configuration: .init(timeout: .seconds(600)))
        client.connect()
        do {
            _ = try await client.getChannel()
            return client
        } catch ChannelError.connectTimeout where attempt < 10 {
            try? await client.shutdown()
            attempt += 1
        } catch {
            try? await client.shutdown()
            throw error
        }
    }
}

/// `base`, on port 0, telling `port` where it listens.
private struct PortReporting<Base: ApplicationProtocol>: ApplicationProtocol {
    typealias Responder = Base.Responder
    let base: Base
    let port: PortPromise

    var responder: Responder { get async throws { try await base.responder } }
    var server: HTTPServerBuilder { base.server }
    var eventLoopGroup: any EventLoopGroup { base.eventLoopGroup }
    var configuration: ApplicationConfiguration { base.configuration.with(address: .hostname("localhost", port: 0)) }
    var logger: Logger { base.logger }
    var services: [any Service] { base.services }
    var processesRunBeforeServerStart: [@Sendable () async throws -> Void] { base.processesRunBeforeServerStart }

    @Sendable func onServerRunning(_ channel: any Channel) async {
        await base.onServerRunning(channel)
        port.complete(channel.localAddress?.port)
    }
}

/// The port a server bound, once it listens (nil: it ended first).
private final class PortPromise: Sendable {
    private struct State {
        var port: Int??
        var waiters: [CheckedContinuation<Int?, Never>] = []
    }

    private let state = Mutex(State())

    func complete(_ port: Int?) {
        let waiters = state.withLock { state -> [CheckedContinuation<Int?, Never>] in
            guard state.port == nil else { return [] }
            state.port = .some(port)
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume(returning: port) }
    }

    func wait() async -> Int? {
        await withCheckedContinuation { continuation in
            let port: Int?? = state.withLock { state in
                if state.port == nil { state.waiters.append(continuation) }
                return state.port
            }
            if let port { continuation.resume(returning: port) }
        }
    }
}

extension LedgerHTTP {
    /// `count` clients of the same server, each on a connection of its own, for the length of
    /// `work`: requests sent through different ones are served at once (through one, in turn).
    func withConnections<Value: Sendable>(_ count: Int, _ work: @Sendable ([LedgerHTTP]) async throws -> Value) async throws -> Value {
        let port = client.port
        var clients: [TestClient] = []
        let outcome: Result<Value, any Error>
        do {
            for _ in 0..<count { clients.append(try await connectedClient(port)) }
            outcome = .success(try await work(clients.map { LedgerHTTP(client: LiveClient(client: $0, port: port), key: key) }))
        } catch {
            outcome = .failure(error)
        }
        for client in clients { try? await client.shutdown() }
        return try outcome.get()
    }
}
