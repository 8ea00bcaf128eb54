import Foundation
import LedgerCore

/// An event with a JSON body given as text.
func event(_ type: String = "created", _ json: String = #"{"n": 1}"#, id: EventID = EventID()) throws -> NewEvent {
    try NewEvent(id: id, type: type, data: Data(json.utf8))
}

/// A stream id unique to one test (of no order or transaction: its events are not the state
/// machine's).
func uniqueStream(_ prefix: String = "stream") throws -> StreamID {
    try StreamID("\(prefix)-\(UUID().uuidString.prefix(8))")
}

extension Result where Failure == any Error {
    /// The result of an async throwing body.
    init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}
