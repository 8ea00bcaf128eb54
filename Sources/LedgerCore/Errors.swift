/// Bad input from a caller, naming the field and what is wrong with it.
public struct LedgerInputError: Error, Hashable, Sendable, CustomStringConvertible {
    public let field: String
    public let problem: String

    public init(field: String, problem: String) {
        self.field = field
        self.problem = problem
    }

    /// Stable error code for clients.
    public var code: String { "invalid-input" }
    public var description: String { "\(field) \(problem)" }
}

/// A refused append, with a stable code for clients.
public enum AppendError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The stream is not at the version the writer expected.
    case wrongExpectedVersion(stream: StreamID, expected: ExpectedVersion, current: Int64)
    /// The event id was already used for a different event.
    case eventIDConflict(EventID)
    /// The batch itself is unacceptable (empty, too large, repeated ids, invalid JSON).
    case invalidBatch(String)

    public var code: String {
        switch self {
        case .wrongExpectedVersion: "wrong-expected-version"
        case .eventIDConflict: "event-id-conflict"
        case .invalidBatch: "invalid-batch"
        }
    }

    public var description: String {
        switch self {
        case .wrongExpectedVersion(let stream, let expected, let current):
            let currentText = current == ExpectedVersion.noStreamVersion ? "does not exist" : "is at version \(current)"
            return "stream \(stream) \(currentText), expected \(expected)"
        case .eventIDConflict(let id):
            return "event id \(id) names another event already (an event id is unique in the whole ledger): a retry sends the same event, a new event a new id"
        case .invalidBatch(let reason):
            return reason
        }
    }
}
