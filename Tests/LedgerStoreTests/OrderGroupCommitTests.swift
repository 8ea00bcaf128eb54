import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("The writer: order events in groups")
struct OrderGroupCommitTests {
    func created(_ token: UUID = UUID()) -> OrderCreated {
        OrderCreated(userId: UserID(unchecked: "u-group"), productId: ProductID(unchecked: "gems.100"), price: "0.99", currency: "USD", appAccountToken: token)
    }

    func orderID(_ prefix: String) -> OrderID { OrderID(unchecked: "\(prefix)-\(UUID().uuidString.prefix(8))") }

    func receipt(_ transaction: String) -> OrderEvent {
        .receiptReceived(ReceiptReceived(
            transactionId: TransactionID(unchecked: transaction), productId: ProductID(unchecked: "gems.100"), purchaseDate: Date(),
            receiptSha256: String(repeating: "ab", count: 32), format: .jws, matchedBy: .applicationUsername, environment: "Sandbox"))
    }

    func append(_ ledger: OrderLedger, _ id: OrderID, _ event: OrderEvent, expected: ExpectedVersion? = nil) async -> Result<OrderLedger.Outcome, any Error> {
        await attempt { try await ledger.append(id, event: event, eventID: EventID(), expected: expected, metadata: Data("{}".utf8)) }
    }

    @Test("concurrent events for different orders share transactions, each decided and answered on its own")
    func mixedGroups() async throws {
        try await withTestDatabase { db in
            let ledger = OrderLedger(writer: LedgerWriter(database: db.database))
            let orders = (0..<24).map { _ in orderID("group") }
            let creations = await withTaskGroup(of: Result<OrderLedger.Outcome, any Error>.self) { group in
                for id in orders {
                    group.addTask { await attempt { try await ledger.create(id, created(), tokenGiven: true, metadata: Data("{}".utf8)) } }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
            for creation in creations {
                let outcome = try creation.get()
                #expect(outcome.appended && outcome.order.version == 0)
                // A creation answers its history without reading it: the one stored event.
                #expect(outcome.events?.map(\.streamVersion) == [0])
                #expect(outcome.events?.first?.recordedAt == outcome.order.createdAt)
            }
            let before = ledger.writer.groupCommitStatistics

            // Per order, one of: payment-added (allowed), delivered (refused by the state
            // machine), payment-added expecting version 5 (refused), a receipt claiming a
            // transaction of its own (allowed), a receipt for a transaction another order claims
            // in the same moment (one of the two wins).
            let results = await withTaskGroup(of: (Int, Result<OrderLedger.Outcome, any Error>).self) { group in
                for (index, id) in orders.enumerated() {
                    group.addTask {
                        switch index % 6 {
                        case 0, 1: (index, await append(ledger, id, .paymentAdded(PaymentAdded(queuedAt: Date()))))
                        case 2: (index, await append(ledger, id, .delivered))
                        case 3: (index, await append(ledger, id, .paymentAdded(PaymentAdded(queuedAt: Date())), expected: .exact(5)))
                        case 4: (index, await append(ledger, id, receipt("t-own-\(id)")))
                        default: (index, await append(ledger, id, receipt("t-shared-\(index / 6)")))
                        }
                    }
                    if index % 6 == 5 {
                        // The other claimant of the shared transaction: the previous order's twin.
                        let twin = orders[index - 1]
                        group.addTask { (-index, await append(ledger, twin, receipt("t-shared-\(index / 6)"))) }
                    }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
            var sharedWinners: [Int: Int] = [:]
            for (index, result) in results {
                if index < 0 {
                    if case .success = result { sharedWinners[-index / 6, default: 0] += 1 }
                    continue
                }
                switch index % 6 {
                case 0, 1:
                    #expect(try result.get().order.state == .paymentAdded)
                    #expect(try result.get().order.version == 1)
                case 2:
                    #expect(throws: OrderDecisionError.self) { try result.get() }
                case 3:
                    #expect(throws: AppendError.self) { try result.get() }
                case 4:
                    // The order also got the twin's claim attempt; this receipt came first or not.
                    if case .success(let outcome) = result { #expect(outcome.order.state == .receiptReceived) }
                default:
                    if case .success = result { sharedWinners[index / 6, default: 0] += 1 }
                }
            }
            // Each shared transaction went to exactly one order.
            #expect(sharedWinners.count == 4 && sharedWinners.values.allSatisfy { $0 == 1 })
            let claimed = try await db.database.query("SELECT count(*) FROM apple_transactions WHERE transaction_id LIKE 't-shared-%'")
            for try await count in claimed.decode(Int.self) { #expect(count == 4) }

            let after = ledger.writer.groupCommitStatistics
            #expect(after.writes - before.writes == results.count)
            #expect(after.groups - before.groups < results.count, "no two events shared a transaction")
            // The rows the groups wrote are the rows a replay of the log gives.
            let differences = try await ProjectionRebuilder(database: db.database).verify()
            #expect(differences == [], "\(differences)")
        }
    }

    @Test("two service instances racing on the same orders: each order takes exactly one of the events only one may have")
    func instancesRace() async throws {
        try await withTestDatabase { db in
            // Two ledgers, two writers: what two servers on one database do. Each reads its orders
            // unlocked, so only the routine's check of the versions read keeps the second one out.
            let ledgers = (0..<2).map { _ in OrderLedger(writer: LedgerWriter(database: db.database)) }
            let orders = (0..<40).map { _ in orderID("race") }
            for id in orders {
                _ = try await ledgers[0].create(id, created(), tokenGiven: true, metadata: Data("{}".utf8))
                _ = try await append(ledgers[0], id, receipt("t-race-\(id)")).get()
                _ = try await append(ledgers[0], id, .verified(Verified(environment: "Sandbox"))).get()
            }
            let results = await withTaskGroup(of: (OrderID, Bool).self) { group in
                for id in orders {
                    for attempt in 0..<8 {
                        group.addTask { (id, (try? await append(ledgers[attempt % 2], id, .delivered).get()) != nil) }
                    }
                }
                return await group.reduce(into: [OrderID: Int]()) { counts, result in counts[result.0, default: 0] += result.1 ? 1 : 0 }
            }
            #expect(results.values.allSatisfy { $0 == 1 }, "\(results)")
            for id in orders {
                #expect(try await ledgers[1].order(id)?.version == 3)
                #expect(try await ledgers[1].store.readStream(id.streamID).filter { $0.type == "delivered" }.count == 1)
            }
            let writes = ledgers.map { $0.writer.groupCommitStatistics.writes }.reduce(0, +)
            #expect(writes == 40 * 3 + 40 * 8)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("an order that moved on by another writer is decided on the state it has now")
    func orderMovedOn() async throws {
        try await withTestDatabase { db in
            // Two ledgers: two writers.
            let first = OrderLedger(writer: LedgerWriter(database: db.database))
            let second = OrderLedger(writer: LedgerWriter(database: db.database))
            let id = orderID("moved")
            _ = try await first.create(id, created(), tokenGiven: true, metadata: Data("{}".utf8))
            _ = try await append(first, id, .paymentAdded(PaymentAdded(queuedAt: Date()))).get()
            // The second instance takes the order to verified; the first last left it payment-added.
            _ = try await append(second, id, receipt("t-moved-1")).get()
            _ = try await append(second, id, .verified(Verified(environment: "Sandbox"))).get()

            // On payment-added, delivered would be refused: the writer reads the order, finds it
            // verified, and takes the event.
            let delivered = try await append(first, id, .delivered).get()
            #expect(delivered.appended && delivered.order.version == 4 && delivered.order.state == .delivered)

            // The second instance finishes it; finished again is refused by the state machine.
            _ = try await append(second, id, .finished).get()
            let again = await append(first, id, .finished)
            #expect(throws: OrderDecisionError.self) { try again.get() }
            // A stale expected version is refused as such.
            let stale = await append(first, id, .refunded(Refunded(revocationDate: Date())), expected: .exact(4))
            #expect(throws: AppendError.self) { try stale.get() }
            // A receipt on a finished order: refused, and its transaction not claimed.
            let lateReceipt = await append(first, id, receipt("t-moved-2"))
            #expect(throws: OrderDecisionError.self) { try lateReceipt.get() }

            #expect(try await first.store.readStream(id.streamID).map(\.type) == ["created", "payment-added", "receipt-received", "verified", "delivered", "finished"])
            let claimed = try await db.database.query("SELECT count(*) FROM apple_transactions WHERE transaction_id = 't-moved-2'")
            for try await count in claimed.decode(Int.self) { #expect(count == 0) }
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("a group that fails as a whole (a token taken) is written write by write: only the offender is refused")
    func failedGroupFallsBack() async throws {
        try await withTestDatabase { db in
            let ledger = OrderLedger(writer: LedgerWriter(database: db.database))
            let token = UUID()
            _ = try await ledger.create(orderID("holder"), created(token), tokenGiven: true, metadata: Data("{}".utf8))
            let others = (0..<12).map { _ in orderID("bystander") }
            let offender = orderID("offender")
            let results = await withTaskGroup(of: (OrderID, Result<OrderLedger.Outcome, any Error>).self) { group in
                for id in others {
                    group.addTask { (id, await attempt { try await ledger.create(id, created(), tokenGiven: true, metadata: Data("{}".utf8)) }) }
                }
                group.addTask { (offender, await attempt { try await ledger.create(offender, created(token), tokenGiven: true, metadata: Data("{}".utf8)) }) }
                return await group.reduce(into: [:]) { $0[$1.0] = $1.1 }
            }
            for id in others { #expect(try results[id]?.get().appended == true) }
            #expect(throws: OrderLedgerError.appAccountTokenTaken(token)) { try results[offender]?.get() }
            #expect(try await ledger.order(offender) == nil)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    @Test("retried event ids among concurrent order events: each retry answers its first result and appends nothing, a changed body is a conflict")
    func retriesInGroups() async throws {
        try await withTestDatabase { db in
            let ledger = OrderLedger(writer: LedgerWriter(database: db.database))
            let retried = (0..<12).map { _ in orderID("retried") }
            let fresh = (0..<12).map { _ in orderID("fresh") }
            for id in retried + fresh { _ = try await ledger.create(id, created(), tokenGiven: true, metadata: Data("{}".utf8)) }
            // A notification is a record any order takes in any state, so a retry of one is not
            // refused by the state machine first: it reaches the database, in a group or alone.
            let ids = retried.map { _ in EventID() }
            func notification(_ index: Int, type: String = "DID_RENEW") -> OrderEvent {
                .notificationReceived(NotificationReceived(
                    notificationUUID: ids[index].uuid, notificationType: type, subtype: nil, transactionId: nil,
                    signedDate: Date(timeIntervalSince1970: 1_700_000_000)))
            }
            func send(_ index: Int, _ event: OrderEvent) async -> Result<OrderLedger.Outcome, any Error> {
                await attempt { try await ledger.append(retried[index], event: event, eventID: ids[index], expected: nil, metadata: Data("{}".utf8)) }
            }
            for index in retried.indices { #expect(try await send(index, notification(index)).get().appended) }
            // One retry on its own (a group of one), then the rest among other orders' events.
            let alone = try await send(0, notification(0)).get()
            #expect(!alone.appended && alone.order.version == 1)

            // 0: the same event again; 1: the same id with another body; 2: a fresh order's event.
            let results = await withTaskGroup(of: (Int, Int, Result<OrderLedger.Outcome, any Error>).self) { group in
                for index in 0..<12 {
                    group.addTask { (0, index, await send(index, notification(index))) }
                    group.addTask { (1, index, await send(index, notification(index, type: "REFUND"))) }
                    group.addTask { (2, index, await append(ledger, fresh[index], .paymentAdded(PaymentAdded(queuedAt: Date())))) }
                }
                return await group.reduce(into: []) { $0.append($1) }
            }
            for (kind, index, result) in results {
                switch kind {
                case 0:
                    let outcome = try result.get()
                    #expect(!outcome.appended && outcome.order.version == 1, "retry \(index)")
                case 1:
                    #expect(throws: AppendError.eventIDConflict(ids[index])) { try result.get() }
                default:
                    #expect(try result.get().appended && result.get().order.version == 1, "fresh \(index)")
                }
            }
            for id in retried + fresh { #expect(try await ledger.store.readStream(id.streamID).map(\.streamVersion) == [0, 1]) }
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }
}

func attempt<Success>(_ body: () async throws -> Success) async -> Result<Success, any Error> {
    do { return .success(try await body()) } catch { return .failure(error) }
}
