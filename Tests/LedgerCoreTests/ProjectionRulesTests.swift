import Foundation
import LedgerCore
import Testing

@Suite("The projections' rules")
struct ProjectionRulesTests {
    let at = Date(timeIntervalSince1970: 1_800_000_000)
    let orderID = OrderID(unchecked: "o-1")
    let transactionID = TransactionID(unchecked: "2000001")

    var pooled: TransactionUnmatched {
        TransactionUnmatched(
            transaction: AppleTransaction(
                transactionId: transactionID, originalTransactionId: "1999999", productId: ProductID(unchecked: "gems.100"),
                purchaseDate: at, environment: "Production", bundleId: "com.example", appAccountToken: nil, appTransactionId: "app-1",
                format: .jws, receiptSha256: String(repeating: "a", count: 64)),
            userId: nil, claimedOrderId: nil, reason: "no-order")
    }

    func receipt(matchedBy: MatchedBy = .reconciler) -> ReceiptReceived {
        ReceiptReceived(
            transactionId: transactionID, productId: ProductID(unchecked: "gems.100"), purchaseDate: at,
            receiptSha256: String(repeating: "b", count: 64), format: .receipt, matchedBy: matchedBy,
            appAccountToken: UUID(uuidString: "00000000-0000-4000-8000-000000000001"), environment: "Sandbox")
    }

    func order() -> Order? {
        let created = OrderEvent.created(OrderCreated(
            userId: UserID(unchecked: "u-1"), productId: ProductID(unchecked: "gems.100"),
            appAccountToken: UUID(uuidString: "00000000-0000-4000-8000-0000000000aa")!))
        return Projection.apply(created, to: nil, id: orderID, claimed: nil, version: 0, at: at).order
    }

    @Test("a transaction held for an Apple-account conflict is refunded by Apple's REFUND like one in the pool")
    func heldTransactionRefunded() throws {
        var held = pooled
        held.reason = AppleTransactionRecord.accountConflictReason
        held.knownUserId = UserID(unchecked: "u-2")
        let row = try #require(Projection.apply(.unmatched(held), data: try JSONEncoder().encode(held), to: nil, at: at))
        #expect(row.status == .conflict && row.isHeldForSupport && !row.isPooled)
        let refunded = try #require(Projection.apply(notification("REFUND"), data: Data(), to: row, at: at.addingTimeInterval(60)))
        #expect(refunded.status == .refunded && !refunded.isHeldForSupport)
        let reversed = try #require(Projection.apply(notification("REFUND_REVERSED"), data: Data(), to: refunded, at: at.addingTimeInterval(120)))
        #expect(reversed.status == .conflict && reversed.isHeldForSupport && !reversed.isPooled, "held again, as before the refund")
    }

    func notification(_ type: String) -> TransactionEvent {
        .notificationReceived(NotificationReceived(notificationUUID: UUID(), notificationType: type, subtype: nil, transactionId: transactionID, signedDate: at))
    }

    @Test("a reversed refund puts a pooled transaction back as its pool entry left it: free for orders, or a family member's never")
    func reversalRestoresThePoolEntry() throws {
        for (reason, ownership, expected) in [
            ("no-order", "PURCHASED", AppleTransactionRecord.Status.unmatched),
            ("purchased-before-order", nil, .unmatched),
            (AppleTransactionRecord.familyShareRevokedReason, "FAMILY_SHARED", .refunded),
            ("no-order", "FAMILY_SHARED", .refunded),
        ] {
            var entry = pooled
            entry.reason = reason
            entry.transaction.inAppOwnershipType = ownership
            let row = Projection.apply(.unmatched(entry), data: try JSONEncoder().encode(entry), to: nil, at: at)
            let refunded = try #require(Projection.apply(notification("REVOKE"), data: Data(), to: row, at: at.addingTimeInterval(60)))
            #expect(refunded.status == .refunded, "\(reason)")
            let reversed = try #require(Projection.apply(notification("REFUND_REVERSED"), data: Data(), to: refunded, at: at.addingTimeInterval(120)))
            #expect(reversed.status == expected, "\(reason), \(ownership ?? "no ownership")")
        }
    }

    @Test("a claim of a pooled transaction gives the same row whether the pool entry or the claim is folded first")
    func poolAndClaimCommute() throws {
        let data = Data(#"{"pooled":true}"#.utf8)
        let refund = TransactionEvent.notificationReceived(NotificationReceived(
            notificationUUID: UUID(), notificationType: "REFUND_REVERSED", subtype: nil, transactionId: transactionID, signedDate: at))
        let (pooledAt, notifiedAt, claimedAt) = (at, at.addingTimeInterval(60), at.addingTimeInterval(120))

        // As the writer meets them: the pool entry, a notification about the pooled transaction, the claim.
        var live = Projection.apply(.unmatched(pooled), data: data, to: nil, at: pooledAt)
        live = Projection.apply(refund, data: Data(), to: live, at: notifiedAt)
        let claim = OrderEvent.receiptReceived(receipt())
        let claimedLive = Projection.apply(claim, to: order(), id: orderID, claimed: live, version: 1, at: claimedAt)

        // As the rebuild meets them: every order stream first, then the transaction's stream.
        let claimedFirst = Projection.apply(claim, to: order(), id: orderID, claimed: nil, version: 1, at: claimedAt)
        var rebuilt = Projection.apply(.unmatched(pooled), data: data, to: claimedFirst.claimed, at: pooledAt)
        rebuilt = Projection.apply(refund, data: Data(), to: rebuilt, at: notifiedAt)

        let row = try #require(claimedLive.claimed)
        #expect(rebuilt == row)
        #expect(claimedLive.order == claimedFirst.order)
        // What Apple said comes from the pool's verified record, the order's fields from the claim.
        #expect(row.status == .claimed && row.orderId == orderID && row.userId == UserID(unchecked: "u-1"))
        #expect(row.matchedBy == .reconciler && row.environment == "Production" && row.appTransactionId == "app-1")
        #expect(row.appAccountToken == receipt().appAccountToken, "filled in from the claim where the pool had nothing")
        #expect(row.receivedAt == pooledAt && row.updatedAt == claimedAt && row.verification == data)
    }

    @Test("a refund in the pool keeps the transaction from being granted; its reversal puts it back; other notifications change nothing")
    func poolStatus() throws {
        let entered = try #require(Projection.apply(.unmatched(pooled), data: Data("{}".utf8), to: nil, at: at))
        #expect(entered.isPooled && entered.status == .unmatched && entered.orderId == nil)
        let refunded = try #require(Projection.apply(notification("REVOKE"), data: Data(), to: entered, at: at.addingTimeInterval(1)))
        #expect(refunded.status == .refunded && !refunded.isPooled)
        let renewed = Projection.apply(notification("DID_RENEW"), data: Data(), to: refunded, at: at.addingTimeInterval(2))
        #expect(renewed == refunded)
        let reversed = try #require(Projection.apply(notification("REFUND_REVERSED"), data: Data(), to: refunded, at: at.addingTimeInterval(3)))
        #expect(reversed.isPooled && reversed.updatedAt == at.addingTimeInterval(3))
        let matched = TransactionEvent.matched(TransactionMatched(orderId: orderID, matchedBy: .support, candidates: 1))
        #expect(Projection.apply(matched, data: Data(), to: reversed, at: at) == reversed, "the claim moves the row, not this record")
    }

    @Test("an event the state machine refuses changes neither the order nor a transaction")
    func refusedEventsChangeNothing() throws {
        let created = try #require(order())
        let refused = Projection.apply(.delivered, to: created, id: orderID, claimed: nil, version: 1, at: at)
        #expect(refused.order == created && refused.claimed == nil)
        let receipt = OrderEvent.receiptReceived(receipt())
        let claimed = Projection.apply(receipt, to: created, id: orderID, claimed: nil, version: 1, at: at)
        let again = Projection.apply(receipt, to: claimed.order, id: orderID, claimed: claimed.claimed, version: 2, at: at.addingTimeInterval(9))
        #expect(again.order == claimed.order && again.claimed == claimed.claimed)
    }

    @Test("family-share-revoked keeps a pooled transaction from being granted and leaves a claimed one, and its order, as they were")
    func familyShareRevoked() throws {
        var shared = pooled.transaction
        shared.inAppOwnershipType = "FAMILY_SHARED"
        let revocation = Revocation(date: at, reason: 0, type: .familyRevoke)
        #expect(revocation.endsFamilyShare(of: pooled.transaction), "FAMILY_REVOKE, whatever the ownership")
        #expect(Revocation(date: at, type: .refundFull).endsFamilyShare(of: shared), "a family member's transaction, whatever the type")
        #expect(!Revocation(date: at, type: .refundProrated, percentage: 50_000).endsFamilyShare(of: pooled.transaction))
        #expect(!Revocation(date: at).endsFamilyShare(of: pooled.transaction))

        let event = TransactionEvent.familyShareRevoked(FamilyShareRevoked(
            transactionId: transactionID, orderId: nil, inAppOwnershipType: "FAMILY_SHARED", revocation: revocation,
            notificationType: "REVOKE", notificationUUID: UUID()))
        let row = Projection.apply(.unmatched(pooled), data: Data(), to: nil, at: at)
        let revoked = try #require(Projection.apply(event, data: Data(), to: row, at: at.addingTimeInterval(60)))
        #expect(revoked.status == .refunded && !revoked.isPooled && revoked.updatedAt == at.addingTimeInterval(60))

        let claimed = Projection.apply(.receiptReceived(receipt()), to: order(), id: orderID, claimed: nil, version: 1, at: at).claimed
        #expect(Projection.apply(event, data: Data(), to: claimed, at: at.addingTimeInterval(60)) == claimed)
    }
}
