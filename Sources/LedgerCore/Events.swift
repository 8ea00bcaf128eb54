import Foundation

/// An event a writer wants to append: its idempotency key, type and JSON bodies.
public struct NewEvent: Sendable, Equatable {
    /// The longest event type name the log accepts.
    public static let maximumTypeLength = 128

    public let id: EventID
    public let type: String
    /// The event's body: the UTF-8 text of one JSON value.
    public let data: Data
    /// Who appended it, request id, causation: the UTF-8 text of one JSON object.
    public let metadata: Data

    public init(id: EventID = EventID(), type: String, data: Data, metadata: Data = Data("{}".utf8)) throws(LedgerInputError) {
        guard !type.isEmpty, type.count <= Self.maximumTypeLength else {
            throw LedgerInputError(field: "type", problem: "must have 1 to \(Self.maximumTypeLength) characters")
        }
        self.id = id
        self.type = type
        self.data = data
        self.metadata = metadata
    }
}

/// An event as the log stores it.
public struct RecordedEvent: Sendable, Equatable {
    /// Position in the global feed: increasing in the order readers may see events.
    public let position: Int64
    public let streamID: StreamID
    /// 0, 1, 2, … within the stream.
    public let streamVersion: Int64
    public let id: EventID
    public let type: String
    public let data: Data
    public let metadata: Data
    public let recordedAt: Date

    public init(
        position: Int64, streamID: StreamID, streamVersion: Int64, id: EventID,
        type: String, data: Data, metadata: Data, recordedAt: Date
    ) {
        self.position = position
        self.streamID = streamID
        self.streamVersion = streamVersion
        self.id = id
        self.type = type
        self.data = data
        self.metadata = metadata
        self.recordedAt = recordedAt
    }
}

/// What an append did: the stream's new version and where each event landed.
public struct AppendResult: Sendable, Equatable {
    /// The version of the last event of the batch.
    public let streamVersion: Int64
    /// Global positions of the batch's events, in batch order.
    public let positions: [Int64]
    /// True when every event was already stored: this was a retry and nothing was appended.
    public let replayed: Bool

    public init(streamVersion: Int64, positions: [Int64], replayed: Bool) {
        self.streamVersion = streamVersion
        self.positions = positions
        self.replayed = replayed
    }
}
