import Logging

/// `StreamLogHandler`'s lines on standard error, with the logger's metadata written out when a
/// line is logged instead of each time it changes: every request sets three metadata items
/// (Hummingbird's request id, ours, the API key), and `StreamLogHandler` sorts and renders all of
/// them at each change, about 5% of the server's CPU for lines that are seldom logged.
public struct LedgerLogHandler: LogHandler {
    private var stream: StreamLogHandler
    public var metadata: Logger.Metadata = [:]

    public init(label: String, level: Logger.Level) {
        stream = StreamLogHandler.standardError(label: label)
        stream.logLevel = level
    }

    public var logLevel: Logger.Level {
        get { stream.logLevel }
        set { stream.logLevel = newValue }
    }

    public var metadataProvider: Logger.MetadataProvider? {
        get { stream.metadataProvider }
        set { stream.metadataProvider = newValue }
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Whether `source` (the module that logged) is PostgreSQL's client library.
    static func isDatabaseClient(_ source: String) -> Bool { source == "PostgresNIO" || source == "_ConnectionPoolModule" }

    /// The line as `StreamLogHandler` writes it, the logger's metadata given with the line's own
    /// (which wins on a shared key).
    public func log(event: LogEvent) {
        // PostgreSQL's client library traces the rows it reads and the values it sends, an app's
        // shared secret among them (docs/apps.md: never logged): its traces are never written.
        if event.level == .trace, Self.isDatabaseClient(event.source) { return }
        var event = event
        if !metadata.isEmpty {
            event.metadata = metadata.merging(event.metadata ?? [:]) { _, explicit in explicit }
        }
        stream.log(event: event)
    }
}
