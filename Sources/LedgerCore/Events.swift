// LedgerCore: the domain (events, the order state machine, the projections' and the reconciler's rules), free of I/O and JSON.

import Foundation

/// What an event means to the projections: an order's event, a transaction's, or neither.
public enum EventBody: Sendable, Equatable {
    case order(OrderEvent)
    case transaction(TransactionEvent)
    /// A subscription's event (issue 40), read by the `subscriptions` projection alone.
    case subscription(SubscriptionEvent)
    /// Read by no projection: an audit record, a notification kept on a stream of its own.
    case opaque(type: String)

    /// The type as the log stores it.
    public var type: String {
        switch self {
        case .order(let event): event.type.rawValue
        case .transaction(let event): event.type.rawValue
        case .subscription(let event): event.type.rawValue
        case .opaque(let type): type
        }
    }
}

/// An event a writer wants to append: its idempotency key, what it means, and its JSON bodies.
public struct NewEvent: Sendable, Equatable {
    /// The longest event type name the log accepts.
    public static let maximumTypeLength = 128

    public let id: EventID
    public let body: EventBody
    /// The event's body as it is stored: the UTF-8 text of one JSON value, from which `body` was
    /// read (or which was written from it).
    public let data: Data
    /// Who appended it, request id, causation: the UTF-8 text of one JSON object.
    public let metadata: Data

    public var type: String { body.type }

    /// An event no projection reads, of any type.
    public init(id: EventID = EventID(), type: String, data: Data, metadata: Data = Data("{}".utf8)) throws(LedgerInputError) {
        guard !type.isEmpty, type.count <= Self.maximumTypeLength else {
            throw LedgerInputError(field: "type", problem: "must have 1 to \(Self.maximumTypeLength) characters")
        }
        self.init(id: id, body: .opaque(type: type), data: data, metadata: metadata)
    }

    /// An event with its typed body and the JSON that body is stored as.
    public init(id: EventID = EventID(), body: EventBody, data: Data, metadata: Data = Data("{}".utf8)) {
        self.id = id
        self.body = body
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
