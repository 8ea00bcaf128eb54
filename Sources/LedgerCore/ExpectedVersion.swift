/// What a writer believes about a stream's version before appending (optimistic concurrency).
public enum ExpectedVersion: Hashable, Sendable, CustomStringConvertible {
    /// Append whatever the stream's version is.
    case any
    /// The stream must not exist yet.
    case noStream
    /// The stream's last event must have this version (versions count 0, 1, 2, …).
    case exact(Int64)

    /// The stream version of a stream with no events.
    public static let noStreamVersion: Int64 = -1

    /// The encoding `append_events` takes: nil for any, -1 for no stream, else the version.
    public var databaseValue: Int64? {
        switch self {
        case .any: nil
        case .noStream: Self.noStreamVersion
        case .exact(let version): version
        }
    }

    public var description: String {
        switch self {
        case .any: "any"
        case .noStream: "no stream"
        case .exact(let version): String(version)
        }
    }
}
