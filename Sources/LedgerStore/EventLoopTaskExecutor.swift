import NIOCore

/// Runs tasks on one NIO event loop (swift-nio 2.101 has no task executor of its own): the
/// group-commit writer, run on the loop of the database connections, resumes from each round trip
/// without waiting for a thread that HTTP handlers keep busy. Kept for its measured gain in
/// `bench http` (docs/performance.md, "What the design buys").
public final class EventLoopTaskExecutor: TaskExecutor, Sendable {
    public let eventLoop: any EventLoop

    public init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        eventLoop.execute { job.runSynchronously(on: executor) }
    }
}
