import Foundation
import LedgerCore
import LedgerServices
import LedgerStore
import LedgerTestSupport
import PostgresNIO
import Testing

/// Renewal notifications in groups (`NotificationLedger+Renewals`): a group of many records what
/// the locked path records for each, and leaves to it what is not the common case.
@Suite("Renewal notifications written in groups")
struct RenewalGroupTests {
    let metadata = Data(#"{"appendedBy":"test"}"#.utf8)
    let day: TimeInterval = 86_400

    func period(_ otid: String, _ n: Int, now: Date) -> AppleTransaction {
        AppleTransaction(
            transactionId: TransactionID(unchecked: n == 0 ? otid : "\(otid)-\(n)"), originalTransactionId: otid,
            productId: ProductID(unchecked: "pro.monthly"), purchaseDate: now.addingTimeInterval(Double(n - 1) * 30 * day),
            environment: "Sandbox", bundleId: "com.example.game", inAppOwnershipType: "PURCHASED", price: "4.99", currency: "USD",
            format: .jws, receiptSha256: String(repeating: "ab", count: 32), type: "Auto-Renewable Subscription",
            expiresDate: now.addingTimeInterval(Double(n) * 30 * day), webOrderLineItemId: "\(otid)-w\(n)",
            transactionReason: n == 0 ? "PURCHASE" : "RENEWAL", subscriptionGroupIdentifier: "g-pro")
    }

    func didRenew(_ transaction: AppleTransaction, uuid: UUID = UUID()) -> NotificationLedger.Notification {
        NotificationLedger.Notification(
            record: NotificationReceived(
                notificationUUID: uuid, notificationType: "DID_RENEW", subtype: nil, transactionId: transaction.transactionId, signedDate: Date()),
            transaction: transaction, revocation: nil)
    }

    /// Waits (up to 60 s, polling, never racing a fixed sleep) until `condition` holds.
    func until(_ what: String, _ condition: () async throws -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(60)
        while try await !condition() {
            guard ContinuousClock.now < deadline else { throw TestTimedOut(what: what) }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    struct TestTimedOut: Error { let what: String }

    @Test("renewals that wait while a group is held are written as one group, one uploaded before among them; a repeat, a renewal twice and an unknown subscription take the locked path")
    func oneGroupOfMany() async throws {
        try await withTestDatabase { db in
            let services = ServiceAssembly(database: db.database)
            let notifications = services.notifications
            let now = Date()
            let ids = (1...10).map { "r-\($0)" }
            for id in ids {
                let start = period(id, 0, now: now)
                let started = SubscriptionStarted(originalTransactionId: id, transaction: start, userId: UserID(unchecked: "u-\(id)"), familyShared: false)
                _ = try await db.database.transaction { tx in
                    try await services.subscriptions.record([
                        (.started(started), SubscriptionLedger.startedEventID(id)),
                        (.period(SubscriptionPeriodRecorded(transaction: start, kind: .start)), SubscriptionLedger.periodEventID(id, start)),
                    ], on: id, metadata: metadata, in: tx)
                }
            }
            let first = didRenew(period(ids[0], 1, now: now))
            var rest = ids.dropFirst().map { didRenew(period($0, 1, now: now)) }
            let twice = rest[0]
            rest.append(twice)  // the same notification twice in the queue: a later group, a repeat
            rest.append(first)  // Apple's retry of the one being written
            rest.append(didRenew(period("r-unknown", 1, now: now)))
            // One renewal the client uploaded first: the group adds its notification alone.
            let uploaded = try await services.receipts.apply(
                period(ids[2], 1, now: now), claim: .init(userId: UserID(unchecked: "u-\(ids[2])"), orderId: nil), metadata: metadata)
            #expect(uploaded.outcome == .recorded)
            let before = notifications.renewalGroupStatistics

            // A transaction of the test holds the first subscription's lock: the first group waits on it.
            let outcome = try await db.database.withConnection { connection in
                try await connection.query("BEGIN", logger: db.database.logger)
                try await services.writer.lock([StreamID.subscription(ids[0])], in: DatabaseTransaction(connection))
                let held = Task { try await notifications.apply(first, metadata: metadata) }
                try await until("the first group waits for the lock") {
                    try await scalar(db, "SELECT count(*)::int FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()") == 1
                }
                let others = rest.map { notification in Task { try await notifications.apply(notification, metadata: metadata) } }
                try await until("the others wait for a group") { notifications.renewalGroupStatistics.waiting == rest.count }
                try await connection.query("ROLLBACK", logger: db.database.logger)
                var answers = [try await held.value]
                for task in others { answers.append(try await task.value) }
                return answers
            }
            let after = notifications.renewalGroupStatistics
            #expect(after.renewals - before.renewals == rest.count + 1)
            // The first alone; the nine others, one of the pair and the retry in one; the pair's second in the next.
            #expect(after.groups - before.groups == 3)

            #expect(outcome.count == rest.count + 1)
            // The pair (ids[1]'s renewal twice) may join the groups in either order, as their tasks
            // start: one of the two is written, the other is its repeat.
            let repeats = outcome.dropFirst(ids.count)
            let pair = [outcome[1], repeats[repeats.startIndex]]
            #expect(pair.filter(\.appended).count == 1, "\(pair)")
            for (index, answer) in outcome.prefix(ids.count).enumerated() where index != 1 {
                #expect(answer.appended && answer.streamId == .subscription(ids[index]) && answer.type == "subscription-renewal-changed")
            }
            let written = try #require(pair.first { $0.appended })
            #expect(written.streamId == .subscription(ids[1]) && written.type == "subscription-renewal-changed")
            #expect(repeats.dropFirst().map(\.appended) == [false, true], "Apple's retry of the first is a repeat; the unknown one is recorded")
            #expect(repeats.last?.streamId == TransactionID(unchecked: "r-unknown-1").streamID)
            #expect(repeats.last?.type == "notification-received")
            for id in ids {
                let subscription = try #require(try await services.subscriptionStore.subscription(id))
                #expect(subscription.periods.map(\.kind) == [.start, .renewal] && subscription.version == 3, "\(id)")
            }
            #expect(try await scalar(db, "SELECT count(*)::int FROM apple_transactions WHERE status = 'renewal'") == ids.count + 1)
            #expect(try await ProjectionRebuilder(database: db.database).verify() == [])
        }
    }

    func scalar(_ db: TestDatabase, _ query: PostgresQuery) async throws -> Int? {
        for try await value in try await db.client.query(query, logger: db.database.logger).decode(Int.self) { return value }
        return nil
    }
}
