import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// Applies App Store Server Notifications: refunds and their reversals change the order, every
/// other type is recorded on the stream of the order (or pooled transaction) it concerns. The
/// notification's UUID is the id of the event it appends, so Apple's retries apply it once.
public struct NotificationLedger: Sendable {
    public let receipts: ReceiptLedger
    var orders: OrderLedger { receipts.orders }
    var logger: Logger { receipts.logger }

    public init(receipts: ReceiptLedger) {
        self.receipts = receipts
    }

    /// A verified notification and the transaction it carries.
    public struct Notification: Sendable {
        public var record: NotificationReceived
        public var transaction: AppleTransaction?
        public var revocationDate: Date?
        public var revocationReason: Int?

        public init(record: NotificationReceived, transaction: AppleTransaction?, revocationDate: Date?, revocationReason: Int?) {
            self.record = record
            self.transaction = transaction
            self.revocationDate = revocationDate
            self.revocationReason = revocationReason
        }
    }

    /// What the notification did.
    public struct Applied: Sendable, Equatable {
        /// False when this notification had been applied before (Apple retried it).
        public var appended: Bool
        /// The stream it was recorded on.
        public var streamId: StreamID
        /// The event type it appended there.
        public var type: String
    }

    static let refundTypes: Set<String> = ["REFUND", "REVOKE"]

    public func apply(_ notification: Notification, metadata: Data) async throws -> Applied {
        try await orders.database.transaction { connection in
            let eventID = EventID(notification.record.notificationUUID)
            if let stored = try await storedEvent(eventID, on: connection) {
                return Applied(appended: false, streamId: stored.stream, type: stored.type)
            }
            let record = OrderEvent.notificationReceived(notification.record)
            guard let transaction = notification.transaction else {
                // Nothing to tie it to: kept on a stream of its own.
                let stream = StreamID(unchecked: "notification-" + notification.record.notificationUUID.uuidString.lowercased())
                try await append(record.encodedData(), type: .notificationReceived, id: eventID, to: stream, metadata: metadata, on: connection)
                return Applied(appended: true, streamId: stream, type: OrderEventType.notificationReceived.rawValue)
            }
            try await receipts.lockTransaction(transaction.transactionId, on: connection)
            var known = try await receipts.holderOfTransaction(transaction.transactionId, on: connection)
            if known == nil {
                // Unknown to the ledger: tied to its order by appAccountToken, or into the pool.
                _ = try await receipts.apply(transaction, claim: .init(userId: nil, orderId: nil), metadata: metadata, on: connection)
                known = try await receipts.holderOfTransaction(transaction.transactionId, on: connection)
            }
            guard let holder = known else { throw OrderLedgerError.duplicateTransaction(transaction.transactionId) }
            let type = notification.record.notificationType
            if let orderID = holder.orderId, let order = try await orders.projection.order(orderID, on: connection, forUpdate: true) {
                var event = record
                if Self.refundTypes.contains(type), OrderTransitions.isAllowed(.refunded, from: order.state) {
                    event = .refunded(Refunded(
                        revocationDate: notification.revocationDate ?? notification.record.signedDate,
                        revocationReason: notification.revocationReason, revocationType: type))
                } else if type == "REFUND_REVERSED", OrderTransitions.isAllowed(.refundReversed, from: order.state) {
                    event = .refundReversed
                }
                _ = try await orders.apply([(event, eventID)], to: order, metadata: metadata, on: connection)
                return Applied(appended: true, streamId: orderID.streamID, type: event.type.rawValue)
            }
            let stream = transaction.transactionId.streamID
            try await append(record.encodedData(), type: .notificationReceived, id: eventID, to: stream, metadata: metadata, on: connection)
            if let status = Self.poolStatus(after: type) {
                try await orders.projection.setPoolStatus(transaction.transactionId, status, at: try await orders.transactionTime(on: connection), on: connection)
            }
            return Applied(appended: true, streamId: stream, type: OrderEventType.notificationReceived.rawValue)
        }
    }

    /// What a notification does to a transaction waiting in the pool: a refunded one may not be
    /// granted; a reversed refund puts it back.
    static func poolStatus(after notificationType: String) -> String? {
        if refundTypes.contains(notificationType) { return "refunded" }
        if notificationType == "REFUND_REVERSED" { return "unmatched" }
        return nil
    }

    private func append(_ data: Data, type: OrderEventType, id: EventID, to stream: StreamID, metadata: Data, on connection: PostgresConnection) async throws {
        let event = try NewEvent(id: id, type: type.rawValue, data: data, metadata: metadata)
        _ = try await orders.store.append([event], to: stream, expectedVersion: .any, on: connection)
    }

    private func storedEvent(_ id: EventID, on connection: PostgresConnection) async throws -> (stream: StreamID, type: String)? {
        let rows = try await connection.guardedQuery("SELECT stream_id, type FROM events WHERE event_id = \(id.uuid)", logger: logger)
        for try await (stream, type) in rows.decode((String, String).self) { return (StreamID(unchecked: stream), type) }
        return nil
    }
}
