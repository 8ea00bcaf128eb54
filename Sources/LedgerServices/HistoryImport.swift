import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import Logging

/// Imports a team's history (docs/import.md): each line's order becomes its events (`created`
/// with its own creation time, then what its final state took), through the writer and the
/// append routine like any order's, so that projections, the pool's protections, replay refusal,
/// reports and dashboards cover it at once.
///
/// Every event's id is named by its order and type, so importing a line again adds nothing; an
/// order's events are one write, and a batch of orders one database transaction, so a stop part
/// way leaves whole orders, and the next run goes on past those already present. A line that
/// conflicts with the log (its transaction granted to another order, its order id taken by
/// another user or by an order not imported) is refused and reported, never overwritten.
public struct HistoryImport: Sendable {
    let orders: OrderLedger
    let writer: LedgerWriter
    var database: Database { writer.database }
    /// Orders per database transaction (each about five events; a transaction positions 4,096).
    public var batchSize = 500
    /// Database transactions in flight at once.
    public var batchesAtOnce = 2

    public init(orders: OrderLedger) {
        self.orders = orders
        self.writer = orders.writer
    }

    /// A line refused, and why.
    public struct Refusal: Sendable, Codable, Equatable {
        public let line: Int
        public let code: String
        public let message: String
    }

    /// What an import did.
    public struct Summary: Sendable, Codable, Equatable {
        public var read = 0
        public var imported = 0
        public var alreadyPresent = 0
        public var refused = 0
        /// The refused lines, at most `refusalsKept` of them, in order.
        public var refusals: [Refusal] = []
        public init() {}

        public static let refusalsKept = 1_000

        mutating func refuse(_ line: Int, _ code: String, _ message: String) {
            refused += 1
            if refusals.count < Self.refusalsKept { refusals.append(Refusal(line: line, code: code, message: message)) }
        }

        /// Adds what a batch did (its lines were counted as read already).
        mutating func merge(_ other: Summary) {
            imported += other.imported
            alreadyPresent += other.alreadyPresent
            refused += other.refused
            refusals += other.refusals.prefix(max(0, Self.refusalsKept - refusals.count))
        }
    }

    /// One line's order as it is written.
    struct Planned {
        let line: Int
        let orderId: OrderID
        let userId: UserID
        let transactionId: TransactionID?
        let write: LedgerWriter.Write
        let createdEvent: EventID
        /// What names the line's history, its app (the fourth) but for `app` (`createdEvent(for:)`).
        let facts: [String]
        /// The app the line names, as it names it; nil when it names none.
        let namedApp: BundleID?
        /// A granted transaction listed alone that leaves its user, product or purchase date
        /// unsaid: re-planned from what Apple signed when it waits in the pool (`filledFromPool`).
        var alone: (record: HistoryRecord, app: BundleID?, source: MetadataWriter)?
        /// Why the line is refused unless its order is present already (imported before: a
        /// resumed or repeated import counts it present, whatever changed since).
        var refusal: OrderLedgerError? = nil

        /// The id of the `created` event this line's order would have, imported for `app`.
        func createdEvent(for app: BundleID?) -> EventID {
            var facts = facts
            facts[3] = app?.rawValue ?? ""
            return HistoryImport.createdEventID(orderId.rawValue, facts: facts)
        }

        /// Whether `found` is this line's order as an earlier run imported it: the line's whole
        /// history, for the app it names, else (naming none) for the order's own app, or for no
        /// app (imported while the ledger held none, the order given the first app since).
        func isImported(as found: OrderLedger.Present) -> Bool {
            if found.imported { return true }
            guard let created = found.createdEvent else { return false }
            guard let namedApp else { return created == createdEvent(for: found.bundleId) || created == createdEvent(for: nil) }
            // An app the ledger cannot take now (retired): its order's, in any spelling.
            guard let app = found.bundleId, app.rawValue.lowercased() == namedApp.rawValue.lowercased() else { return false }
            return created == createdEvent(for: app)
        }

        /// The order and the transaction it writes, as keys no two writes in flight may share.
        var keys: Set<String> {
            var keys: Set<String> = ["order \(orderId.rawValue)"]
            if let transactionId { keys.insert("transaction \(transactionId.rawValue)") }
            return keys
        }
    }

    /// Imports `lines` of the file named `source` (kept in each event's metadata with its line).
    /// `progress` is told the lines read so far after each batch.
    public func run(
        _ lines: some Sequence<HistoryFile.Line>, source: String, progress: (@Sendable (Int) -> Void)? = nil
    ) async throws -> Summary {
        var summary = Summary()
        var batch = Batch()
        let source = try MetadataWriter(source: source)
        var apps: [BundleID?: Result<App?, OrderLedgerError>] = [:]
        try await withThrowingTaskGroup(of: (Int, Summary).self) { group in
            // The orders and transactions of each batch in flight, by its number: a line that
            // shares one with them waits until they are stored, so the file's first line wins.
            var flying: [Int: Set<String>] = [:]
            var number = 0
            func land() async throws {
                guard let (landed, done) = try await group.next() else { return }
                summary.merge(done)
                flying[landed] = nil
                progress?(summary.read)
            }
            // Batches in flight at once: while PostgreSQL stores one, the next is read and decided.
            func submit() async throws {
                guard !batch.planned.isEmpty else { return }
                if flying.count == batchesAtOnce { try await land() }
                number += 1
                let (planned, keys, id) = (batch.planned, batch.keys, number)
                flying[id] = keys
                batch = Batch()
                group.addTask { (id, try await write(planned)) }
            }
            for line in lines {
                summary.read += 1
                let record: HistoryRecord
                switch line.fields {
                case .failure(let error):
                    summary.refuse(line.number, error.code, error.description)
                    continue
                case .success(let fields):
                    do { record = try HistoryRecord(fields, line: line.number) } catch let error as LedgerInputError {
                        summary.refuse(line.number, error.code, error.description)
                        continue
                    }
                }
                // The app, found once per bundle id named (`OrderApps`: the one held, in its spelling).
                let resolved: Result<App?, OrderLedgerError>
                if let known = apps[record.bundleId] { resolved = known } else { resolved = await app(of: record.bundleId) }
                apps[record.bundleId] = resolved
                // A line whose app the ledger cannot take now (it names none while the ledger holds
                // several, or its app is retired) is refused unless an earlier run imported it
                // (a second app added since, or its app retired: a repeated or resumed import
                // counts it present), which `write` finds by the order's own app.
                var app: App?
                var unsettled: OrderLedgerError?
                switch resolved {
                case .success(let found): app = found
                case .failure(let error) where Self.mayBePresent(error): unsettled = error
                case .failure(let error):
                    summary.refuse(line.number, error.code, error.description)
                    continue
                }
                // Whatever else a line's events cannot hold refuses that line, never the import.
                var planned: Planned
                do { planned = try Self.plan(record, app: app?.bundleId, source: source, purchaseAllowance: orders.purchaseAllowance) } catch {
                    let input = error is DecodingError || error is LedgerInputError
                        ? EventCoding.inputError(error, field: "line") : LedgerInputError(field: "line", problem: "cannot be stored: \(error)")
                    summary.refuse(line.number, input.code, input.description)
                    continue
                }
                // An app set to Production alone takes no sandbox purchase, as it takes no sandbox
                // proof (and the other way round); a line that names no environment claims none.
                if let app, record.transactionId != nil, let given = record.givenEnvironment, let named = App.Environment(name: given),
                   !app.environments.contains(named) {
                    planned.refusal = .environmentRefused(app.bundleId, environment: named.rawValue)
                }
                if let unsettled { planned.refusal = unsettled }
                if record.orderId == nil, record.transactionId != nil,
                   record.userId == nil || record.productId == nil || record.purchaseDate == HistoryRecord.unknownDate {
                    planned.alone = (record, app?.bundleId, source)
                }
                // A batch's writes share no order and no transaction, nor with the batches in flight.
                if !batch.keys.isDisjoint(with: planned.keys) || flying.values.contains(where: { !$0.isDisjoint(with: planned.keys) }) {
                    try await submit()
                    while !flying.isEmpty { try await land() }
                }
                batch.add(planned)
                if batch.planned.count >= batchSize { try await submit() }
            }
            try await submit()
            while !flying.isEmpty { try await land() }
        }
        summary.refusals.sort { $0.line < $1.line }
        progress?(summary.read)
        return summary
    }

    /// Whether a line refused for its app may yet be present: its app is retired, or it names
    /// none while the ledger holds several (an earlier run imported it before either).
    static func mayBePresent(_ refusal: OrderLedgerError) -> Bool {
        switch refusal {
        case .bundleIDRequired, .appRetired: true
        default: false
        }
    }

    /// The app a line names (nil: the ledger's only one, or none while it holds none), or why none.
    func app(of named: BundleID?) async -> Result<App?, OrderLedgerError> {
        do { return .success(try await orders.apps.app(of: named)) } catch let error as OrderLedgerError {
            return .failure(error)
        } catch {
            return .failure(.unknownApp(named ?? BundleID(unchecked: "")))
        }
    }

    /// Orders gathered for one database transaction: no two share an order or a transaction.
    struct Batch {
        var planned: [Planned] = []
        /// Their orders and transactions (`Planned.keys`).
        var keys = Set<String>()

        mutating func add(_ next: Planned) {
            planned.append(next)
            keys.formUnion(next.keys)
        }
    }

    /// Writes one batch: the orders not present yet in one transaction, each write its own
    /// verdict; when the transaction fails whole (a refusal the routine raises), each alone.
    func write(_ batch: [Planned]) async throws -> Summary {
        var summary = Summary()
        guard !batch.isEmpty else { return summary }
        let batch = try await filledFromPool(batch)
        let present = try await orders.present(batch.map(\.orderId), createdEvents: batch.map(\.createdEvent))
        var writing: [Planned] = []
        for planned in batch {
            guard let found = present[planned.orderId] else {
                if let refusal = planned.refusal {
                    summary.refuse(planned.line, refusal.code, refusal.description)
                } else {
                    writing.append(planned)
                }
                continue
            }
            if planned.isImported(as: found) {
                summary.alreadyPresent += 1
            } else {
                // A granted transaction listed alone names the order it would make: say what is not recorded.
                let unrecorded = planned.transactionId.map { " (transaction \($0) is not recorded as granted by this line)" } ?? ""
                summary.refuse(planned.line, "order-exists", "order \(planned.orderId) is in the ledger already (user \(found.userId)), not with this line's history\(unrecorded)")
            }
        }
        guard !writing.isEmpty else { return summary }
        let results: [Result<LedgerWriter.Written, any Error>]
        do {
            results = try await database.transaction { tx in try await writer.append(writing.map(\.write), in: tx) }
        } catch {
            var alone: [Result<LedgerWriter.Written, any Error>] = []
            for planned in writing {
                do { alone.append(.success(try await writer.append(planned.write))) } catch { alone.append(.failure(error)) }
            }
            results = alone
        }
        for (planned, result) in zip(writing, results) {
            switch result {
            case .success(let written):
                if written.appends.first?.order == nil { summary.alreadyPresent += 1 } else { summary.imported += 1 }
            case .failure(let error):
                let (code, message) = Self.refusal(error, planned)
                summary.refuse(planned.line, code, message)
            }
        }
        return summary
    }

    /// `batch` with each granted transaction listed alone that waits in the pool planned with
    /// what Apple signed of it and the user it waits for, where its line says nothing: its order
    /// counts on the day Apple sold it, of its product and user, not on 1970-01-01 under
    /// `imported`. The events' ids stay the line's, so importing it again finds it present.
    func filledFromPool(_ batch: [Planned]) async throws -> [Planned] {
        let ids = batch.compactMap { $0.alone == nil ? nil : $0.transactionId }
        guard !ids.isEmpty else { return batch }
        let snapshot = try await database.transaction { tx in try await writer.read(orders: [], transactions: ids, in: tx) }
        return try batch.map { planned in
            guard let (record, app, source) = planned.alone, let id = planned.transactionId, let held = snapshot.transaction(id), held.isPooled,
                  let signed = try held.verifiedTransaction() else { return planned }
            var filled = try Self.plan(
                record, app: app, source: source, purchaseAllowance: orders.purchaseAllowance, signed: (signed, held.userId))
            filled.refusal = planned.refusal
            return filled
        }
    }

    /// Why the log refused a line's order.
    static func refusal(_ error: any Error, _ planned: Planned) -> (String, String) {
        switch error {
        case OrderLedgerError.duplicateTransaction(let id):
            ("transaction-granted", "Apple transaction \(id) is granted to another order already")
        case OrderLedgerError.refundedInPool(let id):
            ("transaction-refunded", "Apple refunded transaction \(id) while it waited in the pool, paid to no order: the line's order is not imported")
        case OrderLedgerError.accountConflict(let id) where planned.userId.rawValue == HistoryRecord.unknownUser:
            ("account-conflict", "Apple transaction \(id) is of an Apple account or token the ledger knows for a user, and the line names none: give its userId, or support pairs it")
        case OrderLedgerError.accountConflict(let id):
            ("account-conflict", "Apple transaction \(id) is of an Apple account or token the ledger knows for another user than the line's: only support pairs it")
        case let error as OrderLedgerError: (error.code, error.description)
        case let error as OrderDecisionError: ("order-exists", "order \(planned.orderId) is in the ledger already: \(error)")
        case let error as AppendError: ("order-exists", "order \(planned.orderId) is in the ledger already: \(error)")
        default: ("refused", "\(error)")
        }
    }

    /// The order id of a granted transaction alone: its order is gone.
    public static func orderID(ofTransaction id: TransactionID) -> OrderID {
        OrderID(unchecked: "imported-\(id.rawValue)")
    }


    /// A line's order and its events, named by the order and the event type.
    /// `signed`: what Apple signed of the line's transaction and the user its pool entry waits
    /// for, which fill what the line leaves unsaid (its events' ids stay the line's).
    static func plan(
        _ record: HistoryRecord, app: BundleID?, source: MetadataWriter, purchaseAllowance: TimeInterval? = nil,
        signed: (transaction: AppleTransaction, userId: UserID?)? = nil
    ) throws -> Planned {
        let said = record
        var record = record
        if let (transaction, pooledUser) = signed {
            record.userId = record.userId ?? pooledUser
            record.productId = record.productId ?? transaction.productId
            if record.purchaseDate == HistoryRecord.unknownDate {
                record.purchaseDate = transaction.purchaseDate
                if record.createdAt == HistoryRecord.unknownDate { record.createdAt = transaction.purchaseDate }
            }
        }
        let orderID = record.orderId ?? record.transactionId.map(orderID(ofTransaction:)) ?? OrderID(unchecked: "imported")
        let user = record.userId ?? UserID(unchecked: HistoryRecord.unknownUser)
        let product = record.productId ?? ProductID(unchecked: HistoryRecord.unknownProduct)
        let order = orderID.rawValue
        // Each event with its type's name (its id's part) and when it happened in the history.
        var events: [(OrderEvent, String, Date)] = [(.created(OrderCreated(
            userId: user, productId: product, price: record.price, currency: record.currency,
            appAccountToken: EventID.named("import-token", order).uuid, bundleId: app, createdAt: record.createdAt)), "created", record.createdAt)]
        if record.state == .paymentAdded {
            events.append((.paymentAdded(PaymentAdded(queuedAt: record.createdAt)), "payment-added", record.createdAt))
        }
        if record.state == .failed { events.append((.failed(Failed(reason: "imported")), "failed", record.createdAt)) }
        if let transaction = record.transactionId, let purchased = record.purchaseDate {
            events.append((.receiptReceived(ReceiptReceived(
                transactionId: transaction, productId: product, purchaseDate: purchased,
                receiptSha256: namedDigest("import-receipt", transaction.rawValue), format: .imported, matchedBy: .imported,
                originalTransactionId: record.originalTransactionId, environment: record.givenEnvironment, bundleId: app,
                storefront: record.storefront)), "receipt-received", purchased))
            events.append((.verified(Verified(transactionId: transaction, environment: record.givenEnvironment)), "verified", purchased))
            if record.state != .verified {
                events.append((.delivered, "delivered", purchased))
                events.append((.finished, "finished", purchased))
            }
            if let refunded = record.refundedAt { events.append((.refunded(Refunded(revocationDate: refunded)), "refunded", refunded)) }
        }
        for (event, _, _) in events { try event.validate() }
        // Every id names the line's whole history too: the same line again is a replay, another
        // line for the order (another transaction, state or price) is a conflict, never present.
        // As the line says it (not as the pool filled it): the same line names the same events.
        let facts = [order, said.userId?.rawValue ?? HistoryRecord.unknownUser, said.productId?.rawValue ?? HistoryRecord.unknownProduct,
                     app?.rawValue ?? "", String(said.createdAt.timeIntervalSince1970),
                     said.state.rawValue, said.price ?? "", said.currency ?? "", said.transactionId?.rawValue ?? "",
                     said.originalTransactionId ?? "", said.purchaseDate.map { String($0.timeIntervalSince1970) } ?? "",
                     said.environment, said.refundedAt.map { String($0.timeIntervalSince1970) } ?? ""]
                    + (said.storefront.map { [$0] } ?? [])  // only when given: earlier imports' ids stay theirs
        let history = namedDigest(facts.joined(separator: "\u{1F}"))
        let created = createdEventID(order, facts: facts)
        // One metadata per time (an order's events happened at two or three).
        var metadata: [Date: Data] = [:]
        let newEvents = try events.map { event, type, at in
            if metadata[at] == nil { metadata[at] = source.metadata(line: record.line, at: at) }
            return try EventCoding.newEvent(event, id: type == "created" ? created : EventID.named("import", order, type, history), metadata: metadata[at]!)
        }
        return Planned(
            line: record.line, orderId: orderID, userId: user, transactionId: record.transactionId,
            // Apple's signed purchase date of a transaction waiting in the pool guards the order too.
            write: LedgerWriter.Write(LedgerWriter.Append(newEvents, to: orderID.streamID, expected: .noStream), purchaseAllowance: purchaseAllowance),
            createdEvent: created, facts: facts, namedApp: record.bundleId)
    }

    /// The id of the `created` event of `order`, whose line's history `facts` name.
    static func createdEventID(_ order: String, facts: [String]) -> EventID {
        EventID.named("import", order, "created", namedDigest(facts.joined(separator: "\u{1F}")))
    }

    /// Each imported event's metadata, where it came from, as `EventCoding.encoder` writes it
    /// (keys sorted): `{"appendedBy":"import","importedFrom":{"at":…,"line":…,"source":…}}`, `at`
    /// when it happened in the history (what the reports date it by, `event_time`). Put together
    /// from the file's name, encoded once per import, and the line and time, which need no
    /// escaping: the encoder's fixed cost, paid for each event, showed in the importer's profile.
    struct MetadataWriter {
        private let sourceJSON: String

        init(source: String) throws {
            sourceJSON = String(decoding: try EventCoding.encoder.encode(source), as: UTF8.self)
        }

        func metadata(line: Int, at: Date) -> Data {
            Data(#"{"appendedBy":"import","importedFrom":{"at":"\#(EventCoding.formatDate(at))","line":\#(line),"source":\#(sourceJSON)}}"#.utf8)
        }
    }
}
