import Hummingbird
import Logging

/// Serves Apple's stand-ins (tests', the demo's) on a free local port.
/// The stand-in server stopped before it listened.
struct StandInEnded: Error {}

/// Serves `router` on a free local port for the duration of `body`, which gets the port.
public func serveStandIn<T: Sendable>(_ router: Router<BasicRequestContext>, _ body: @Sendable (_ port: Int) async throws -> T) async throws -> T {
    let port = PortBox()
    let server = Application(
        router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
        onServerRunning: { channel in await port.set(.success(channel.localAddress?.port ?? 0)) },
        logger: standInLogger)
    return try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask {
            do {
                try await server.runService(gracefulShutdownSignals: [])
                await port.set(.failure(StandInEnded()))
            } catch {
                await port.set(.failure(error))
                throw error
            }
            return nil
        }
        let bound = try await port.wait()
        let result = try await body(bound)
        group.cancelAll()
        return result
    }
}

/// Stand-ins log nothing below critical: their requests are the test's business.
let standInLogger: Logger = {
    var logger = Logger(label: "apple-stand-in")
    logger.logLevel = .critical
    return logger
}()

/// The stand-in's port, once it listens; or why it never will.
actor PortBox {
    var port: Result<Int, any Error>?
    var waiters: [CheckedContinuation<Int, any Error>] = []

    func set(_ value: Result<Int, any Error>) {
        if port != nil { return }
        port = value
        for waiter in waiters { waiter.resume(with: value) }
        waiters = []
    }

    /// The port; throws if the server ended before listening (without this, a server that
    /// fails to start leaves its test waiting forever).
    func wait() async throws -> Int {
        if let port { return try port.get() }
        return try await withCheckedThrowingContinuation { waiters.append($0) }
    }
}
