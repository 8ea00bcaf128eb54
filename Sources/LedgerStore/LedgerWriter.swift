import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// The ledger's one write path: every event it stores (an order's, a pooled transaction's, an
/// audit record) is appended here, with the projection rows it leaves, in one database
/// transaction (docs/architecture.md, "The append transaction").
///
/// A write is read, decided and stored in two round trips:
/// 1. read the orders and Apple transactions it touches (`LedgerWriter+Plan`);
/// 2. decide in Swift: each order event through the state machine (`Order.decide`), the rows
///    every event leaves through `Projection`, the claim of an Apple transaction (refused when
///    another order holds it; taken out of the pool with `transaction-matched`);
/// 3. `CALL append_events(…)`: under the streams' locks, each write is stored whole only when
///    everything it was decided on still holds (its streams at the versions read, its claim still
///    unknown) and none of its event ids is stored; else nothing of it is, and it is read and
///    decided again (`LedgerWriter+Call`).
///
/// Writes that arrive together share steps 1 and 3 (group commit): `append(_:)` answers after
/// COMMIT, so an acknowledged write is durable, and a single write is a group of one.
/// `append(_:in:knowing:)` runs the same steps inside a transaction the caller holds.
public final class LedgerWriter: Sendable {
    public let database: Database
    private let queue: GroupCommit<Write, Written>
    private let remembered: Remembered

    public init(database: Database) {
        let remembered = Remembered()
        self.database = database
        self.remembered = remembered
        self.queue = GroupCommit(
            executor: database.writerExecutor, session: { body in await database.holdingConnection(body) }, select: Self.select,
            execute: { batch in await Self.execute(batch, database, remembered) })
    }

    /// Events for one stream.
    public struct Append: Sendable {
        public var stream: StreamID
        public var expected: ExpectedVersion
        public var events: [NewEvent]

        public init(_ events: [NewEvent], to stream: StreamID, expected: ExpectedVersion = .any) {
            self.stream = stream
            self.expected = expected
            self.events = events
        }
    }

    /// One caller's appends, stored all together or not at all.
    public struct Write: Sendable {
        public var appends: [Append]
        /// For a receipt that takes its transaction out of the pool: how the pairing was made,
        /// recorded on the `transaction-matched` the writer appends for it.
        public var pairing: Pairing?
        /// For a write decided on what the writer reads rather than on what its caller read
        /// under locks (a receipt's common case): what the order of its first append must be,
        /// as read, for the write to be stored; else it is refused with `WriteConditionFailed`.
        public var condition: (@Sendable (Order) -> Bool)?
        /// For a client's own events: a `receipt-received` that takes a transaction the ledger
        /// holds (pooled, or held for support) is refused when Apple signed its purchase more
        /// than this long before the order was created (`purchasedBeforeOrder`, issue 41).
        public var purchaseAllowance: TimeInterval?

        public init(
            _ appends: [Append], pairing: Pairing? = nil, condition: (@Sendable (Order) -> Bool)? = nil, purchaseAllowance: TimeInterval? = nil
        ) {
            self.appends = appends
            self.pairing = pairing
            self.condition = condition
            self.purchaseAllowance = purchaseAllowance
        }

        public init(
            _ append: Append, pairing: Pairing? = nil, condition: (@Sendable (Order) -> Bool)? = nil, purchaseAllowance: TimeInterval? = nil
        ) {
            self.init([append], pairing: pairing, condition: condition, purchaseAllowance: purchaseAllowance)
        }
    }

    /// A write's `condition` did not hold of its order as read: nothing of it was stored.
    public struct WriteConditionFailed: Error, Sendable {}

    /// How an Apple transaction was paired with an order: among how many candidates, by which rule.
    public struct Pairing: Sendable {
        public var candidates: Int
        public var rule: String?
        /// The candidates not chosen (the reconciler's ambiguous pairings).
        public var otherCandidates: [OrderID]

        public init(candidates: Int, rule: String?, otherCandidates: [OrderID] = []) {
            self.candidates = candidates
            self.rule = rule
            self.otherCandidates = otherCandidates
        }
    }

    /// What a write did, one entry per append in the order given (then the
    /// `transaction-matched` appended for a receipt that took its transaction out of the pool).
    public struct Written: Sendable {
        public var appends: [Appended]

        /// True when every event was stored before: a retry, and nothing was appended.
        public var replayed: Bool { appends.allSatisfy(\.result.replayed) }
        /// Every event type appended (none for a replay).
        var appendedTypes: [String] { appends.filter { !$0.result.replayed }.flatMap { $0.events.map(\.type) } }
    }

    /// What one append did.
    public struct Appended: Sendable {
        public let stream: StreamID
        public let result: AppendResult
        /// For an order's stream: the order as the append left it (nil for a replay, which
        /// leaves the order as it is).
        public let order: Order?
        /// The events as stored (none for a replay).
        public let events: [RecordedEvent]
    }

    /// Appends `write` in a database transaction of its own, shared with the writes that arrive
    /// meanwhile; answers once that transaction has committed. A refusal is thrown: the state
    /// machine's (`OrderDecisionError`), an expected version (`AppendError`), a transaction held
    /// by another order (`OrderLedgerError.duplicateTransaction`).
    public func append(_ write: Write) async throws -> Written {
        let written = try await queue.submit(write)
        database.appended(written.appendedTypes, on: nil)
        return written
    }

    /// `append(_:)` for one append: its result.
    public func append(_ events: [NewEvent], to stream: StreamID, expected: ExpectedVersion = .any) async throws -> Appended {
        try await append(Write(Append(events, to: stream, expected: expected))).appends[0]
    }

    /// Appends `write` inside the transaction the caller holds: its streams stay locked until
    /// that transaction ends, and it is durable once the caller's COMMIT returns. `snapshot`: what
    /// the caller read (`read`) to decide on it, which the writer then need not read again.
    public func append(_ write: Write, in transaction: DatabaseTransaction, knowing snapshot: Snapshot? = nil) async throws -> Written {
        try await append([write], in: transaction, knowing: snapshot)[0].get()
    }

    /// `append(_:in:knowing:)` for several writes in one call of the routine: each write's
    /// outcome, a refusal as a failure. The writes touch no stream or Apple transaction in common,
    /// and carry at most 4096 events with what they claim (a transaction positions that many).
    public func append(_ writes: [Write], in transaction: DatabaseTransaction, knowing snapshot: Snapshot? = nil) async throws -> [Result<Written, any Error>] {
        guard !writes.isEmpty else { return [] }
        // Whether the caller's transaction commits is not known here: the groups read these orders again.
        remembered.forget(writes.flatMap(\.orderIDs))
        let connection = transaction.connection
        let results: [Result<Written, any Error>]
        do {
            results = try await Self.write(writes, on: connection, commit: false, database: database, knowing: snapshot)
        } catch let error as PSQLError {
            // The routine's app checks refuse by raising, which ends the caller's transaction too.
            throw writes.lazy.compactMap { Self.appRefusal(error, of: $0) }.first ?? error
        }
        for case .success(let written) in results { database.appended(written.appendedTypes, on: connection) }
        return results
    }

    /// The orders and Apple transactions given, as they stand in the caller's transaction (after
    /// `lock`, as they stay until it ends), in one round trip.
    /// With `locking`: after taking those streams' locks as `lock` does, in the same round trip.
    public func read(
        locking: [StreamID] = [], orders: [OrderID], transactions: [TransactionID], in transaction: DatabaseTransaction
    ) async throws -> Snapshot {
        var statement = Statement(connection: transaction.connection, logger: database.logger, leaseFirst: false)
        return try await Self.read(locking: locking, orders: orders, transactions: transactions, with: &statement)
    }

    /// Takes, in the caller's transaction, the locks the append routine takes for these streams
    /// (an Apple transaction is locked as its stream is): what the caller reads afterwards stays as
    /// read until it commits. Several at once are taken in the routine's order (by
    /// `read_for_write`, which takes them as `append_events` does).
    public func lock(_ streams: [StreamID], in transaction: DatabaseTransaction) async throws {
        _ = try await read(locking: streams, orders: [], transactions: [], in: transaction)
    }

    /// Group commit so far: transactions written, and writes they carried.
    public var groupCommitStatistics: (groups: Int, writes: Int) {
        let statistics = queue.statistics
        return (statistics.batches, statistics.items)
    }

    /// A group holds at most this many writes, and this many events (one transaction positions
    /// at most 4096).
    static let maximumWritesPerGroup = 256
    public static let maximumEventsPerGroup = 4096

    /// The oldest writes that touch no stream or Apple transaction an older one in the group
    /// touches (a later write then sees the earlier one's result), within the limits.
    private static func select(_ pending: [Write]) -> [Int] {
        var touched = Set<String>()
        var events = 0
        var chosen: [Int] = []
        for (index, write) in pending.enumerated() where chosen.count < maximumWritesPerGroup {
            let keys = write.lockKeys
            // Its events, and a `transaction-matched` per transaction it claims, at most.
            let size = write.appends.reduce(0) { $0 + $1.events.count } + keys.count - write.appends.count
            guard !keys.contains(where: touched.contains), chosen.isEmpty || events + size <= maximumEventsPerGroup else { continue }
            touched.formUnion(keys)
            events += size
            chosen.append(index)
        }
        return chosen
    }

    private static func execute(_ batch: [GroupCommit<Write, Written>.Pending], _ database: Database, _ remembered: Remembered) async {
        let writer = Group(database: database, remembered: remembered)
        let results = await writer.write(batch.map(\.work))
        for (pending, result) in zip(batch, results) { pending.continuation.resume(with: result) }
    }

    /// A group's write, in transactions of its own.
    private struct Group {
        let database: Database
        let remembered: Remembered

        func write(_ writes: [Write]) async -> [Result<Written, any Error>] {
            guard writes.count > 1 else { return [await alone(writes[0])] }
            do {
                var results = try await database.withHeldConnection { connection in
                    try await LedgerWriter.write(writes, on: connection, commit: true, database: database, remembered: remembered)
                }
                // Left undecided by a later round: each alone, as below.
                for (index, result) in results.enumerated() {
                    if case .failure(let failed as RoundFailed) = result {
                        results[index] = isConnectionFailure(failed.error) ? .failure(failed.error) : await alone(writes[index])
                    }
                }
                return results
            } catch where !isConnectionFailure(error) {
                remembered.forget(writes.flatMap(\.orderIDs))
                // The call failed as a whole (a unique key taken by a writer outside the group, a
                // deadlock, a value PostgreSQL refuses): nothing of it is stored, and each write
                // alone finds out what is (its event ids make it a safe retry).
                database.logger.debug("group failed, writing each alone", metadata: ["error": "\(String(reflecting: error))"])
                var results: [Result<Written, any Error>] = []
                for write in writes { results.append(await alone(write)) }
                return results
            } catch {
                return writes.map { _ in .failure(error) }
            }
        }

        /// One write; again when a race was lost (a unique key taken meanwhile, which the next
        /// read sees, or a deadlock PostgreSQL broke here), three times in all.
        private func alone(_ write: Write) async -> Result<Written, any Error> {
            var attempt = 0
            while true {
                attempt += 1
                do {
                    let result = try await database.withHeldConnection { connection in
                        try await LedgerWriter.write([write], on: connection, commit: true, database: database, remembered: remembered)[0]
                    }
                    if case .failure(let failed as RoundFailed) = result { throw failed.error }
                    return result
                } catch let error as PSQLError where attempt < 3 && [.uniqueViolation, .deadlockDetected].contains(error.sqlState) {
                    continue
                } catch {
                    remembered.forget(write.orderIDs)
                    return .failure(LedgerWriter.refusal(error, of: write))
                }
            }
        }
    }
}

extension LedgerWriter.Write {
    /// The orders it appends to.
    var orderIDs: [OrderID] { appends.compactMap(\.stream.orderID) }

    /// Whether one of its `receipt-received` events claims transaction `id`.
    func claims(_ id: TransactionID) -> Bool {
        appends.contains { append in
            append.events.contains { event in
                if case .order(.receiptReceived(let receipt)) = event.body { return receipt.transactionId == id }
                return false
            }
        }
    }

    /// The keys of the advisory locks the routine takes for this write: its streams, then the
    /// stream of each Apple transaction whose row it may change (`OrderEvent.touchedTransaction`:
    /// one it claims or releases, one a `verified` names). An array, not a set: the group's
    /// selection asks this of every pending write, and most have one stream.
    var lockKeys: [String] {
        var keys = appends.map(\.stream.rawValue)
        for append in appends {
            for event in append.events {
                if case .order(let event) = event.body, let id = event.touchedTransaction {
                    let key = id.streamID.rawValue
                    if !keys.contains(key) { keys.append(key) }
                }
            }
        }
        return keys
    }
}
