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
    var writer: LedgerWriter { receipts.writer }
    var logger: Logger { receipts.database.logger }

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

    public func apply(_ notification: Notification, metadata: Data) async throws -> Applied {
        try await orders.database.transaction { connection in
            let eventID = EventID(notification.record.notificationUUID)
            if let stored = try await storedEvent(eventID, on: connection) {
                return Applied(appended: false, streamId: stored.stream, type: stored.type)
            }
            let record = notification.record
            guard let transaction = notification.transaction else {
                // Nothing to tie it to: kept on a stream of its own.
                let stream = StreamID(unchecked: "notification-" + record.notificationUUID.uuidString.lowercased())
                let event = try EventCoding.newEvent(type: OrderEventType.notificationReceived.rawValue, record, id: eventID, metadata: metadata)
                _ = try await writer.append(LedgerWriter.Write(LedgerWriter.Append([event], to: stream)), on: connection)
                return Applied(appended: true, streamId: stream, type: OrderEventType.notificationReceived.rawValue)
            }
            let id = transaction.transactionId
            try await receipts.lockTransaction(id, on: connection)
            var known = try await writer.read(orders: [], transactions: [id], on: connection).transaction(id)
            if known == nil {
                // Unknown to the ledger: tied to its order by appAccountToken, or into the pool.
                _ = try await receipts.apply(transaction, claim: .init(userId: nil, orderId: nil), metadata: metadata, on: connection)
                known = try await writer.read(orders: [], transactions: [id], on: connection).transaction(id)
            }
            guard let holder = known else { throw OrderLedgerError.duplicateTransaction(id) }
            let type = record.notificationType
            if let orderID = holder.orderId {
                try await writer.lock([orderID.streamID], on: connection)
                let snapshot = try await writer.read(orders: [orderID], transactions: [], on: connection)
                if let order = snapshot.order(orderID) {
                    var event = OrderEvent.notificationReceived(record)
                    if AppleTransactionRecord.poolStatus(after: type) == .refunded, OrderTransitions.isAllowed(.refunded, from: order.state) {
                        event = .refunded(Refunded(
                            revocationDate: notification.revocationDate ?? record.signedDate,
                            revocationReason: notification.revocationReason, revocationType: type))
                    } else if type == "REFUND_REVERSED", OrderTransitions.isAllowed(.refundReversed, from: order.state) {
                        event = .refundReversed
                    }
                    _ = try await receipts.append([(event, eventID)], to: order, metadata: metadata, on: connection, knowing: snapshot)
                    return Applied(appended: true, streamId: orderID.streamID, type: event.type.rawValue)
                }
            }
            // Waiting in the pool: recorded on its stream, where a refund keeps it from being granted.
            let event = try EventCoding.newEvent(TransactionEvent.notificationReceived(record), id: eventID, metadata: metadata)
            _ = try await writer.append(LedgerWriter.Write(LedgerWriter.Append([event], to: id.streamID)), on: connection)
            return Applied(appended: true, streamId: id.streamID, type: TransactionEventType.notificationReceived.rawValue)
        }
    }

    private func storedEvent(_ id: EventID, on connection: PostgresConnection) async throws -> (stream: StreamID, type: String)? {
        let rows = try await connection.guardedQuery("SELECT stream_id, type FROM events WHERE event_id = \(id.uuid)", logger: logger)
        for try await (stream, type) in rows.decode((String, String).self) { return (StreamID(unchecked: stream), type) }
        return nil
    }
}
