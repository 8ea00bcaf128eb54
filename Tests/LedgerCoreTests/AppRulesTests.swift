import Foundation
import LedgerCore
import Testing

/// Everything belongs to an app (issue 39): the projections' and the reconciler's app rules.
@Suite("The app rules")
struct AppRulesTests {
    let at = Date(timeIntervalSince1970: 1_800_000_000)
    let orderID = OrderID(unchecked: "o-1")
    let transactionID = TransactionID(unchecked: "3000001")

    func created(_ bundle: String?) -> OrderEvent {
        .created(OrderCreated(userId: UserID(unchecked: "u-1"), productId: ProductID(unchecked: "gems.100"), bundleId: bundle.map(BundleID.init(unchecked:))))
    }

    func receipt(bundle: String?) -> ReceiptReceived {
        ReceiptReceived(
            transactionId: transactionID, productId: ProductID(unchecked: "gems.100"), purchaseDate: at,
            receiptSha256: String(repeating: "b", count: 64), format: .jws, matchedBy: .applicationUsername,
            environment: "Production", bundleId: bundle.map(BundleID.init(unchecked:)))
    }

    @Test("an order is its created event's app; a transaction claimed from a receipt is the app Apple signed, else its order's")
    func rowsCarryTheirApp() throws {
        let order = try #require(Projection.apply(created("com.example.a"), to: nil, id: orderID, claimed: nil, version: 0, at: at).order)
        #expect(order.bundleId?.rawValue == "com.example.a")
        let signed = Projection.apply(.receiptReceived(receipt(bundle: "com.example.a")), to: order, id: orderID, claimed: nil, version: 1, at: at)
        #expect(signed.claimed?.bundleId?.rawValue == "com.example.a" && signed.order?.bundleId?.rawValue == "com.example.a")
        let unsigned = Projection.apply(.receiptReceived(receipt(bundle: nil)), to: order, id: orderID, claimed: nil, version: 1, at: at)
        #expect(unsigned.claimed?.bundleId?.rawValue == "com.example.a")

        let pooled = TransactionUnmatched(
            transaction: AppleTransaction(
                transactionId: transactionID, originalTransactionId: nil, productId: ProductID(unchecked: "gems.100"), purchaseDate: at,
                environment: "Production", bundleId: "com.example.b", format: .jws, receiptSha256: String(repeating: "a", count: 64)),
            userId: nil, claimedOrderId: nil, reason: "no-order")
        let row = try #require(Projection.apply(.unmatched(pooled), data: Data("{}".utf8), to: nil, at: at))
        #expect(row.bundleId?.rawValue == "com.example.b")
        // Claimed from the pool: the pool's app stays (the database refuses it for another app's order).
        let taken = Projection.apply(.receiptReceived(receipt(bundle: nil)), to: order, id: orderID, claimed: row, version: 1, at: at)
        #expect(taken.claimed?.bundleId?.rawValue == "com.example.b")
    }

    @Test("a row whose events name no app is the ledger's first app's, and stays without one while the ledger holds none")
    func firstApp() throws {
        let order = try #require(Projection.apply(created(nil), to: nil, id: orderID, claimed: nil, version: 0, at: at).order)
        #expect(order.bundleId == nil)
        #expect(Projection.inFirstApp(order, BundleID(unchecked: "com.example.first")).bundleId?.rawValue == "com.example.first")
        #expect(Projection.inFirstApp(order, nil).bundleId == nil)
        let named = try #require(Projection.apply(created("com.example.b"), to: nil, id: orderID, claimed: nil, version: 0, at: at).order)
        #expect(Projection.inFirstApp(named, BundleID(unchecked: "com.example.first")).bundleId?.rawValue == "com.example.b")
    }

    @Test("the reconciler never pairs across apps: the same user and product id in two apps are two users and two products")
    func reconcilerStaysInItsApp() {
        let a = BundleID(unchecked: "com.example.a")
        let b = BundleID(unchecked: "com.example.b")
        let user = UserID(unchecked: "u"), product = ProductID(unchecked: "p")
        let orphan = Reconciler.Orphan(transactionId: TransactionID(unchecked: "t"), userId: user, productId: product, purchaseDate: at, bundleId: a)
        let other = Reconciler.OpenOrder(orderId: OrderID(unchecked: "in-b"), userId: user, productId: product, createdAt: at.addingTimeInterval(-60), queuedAt: nil, bundleId: b)
        #expect(Reconciler.pair([orphan], with: [other]).isEmpty)
        let own = Reconciler.OpenOrder(orderId: OrderID(unchecked: "in-a"), userId: user, productId: product, createdAt: at.addingTimeInterval(-30), queuedAt: nil, bundleId: a)
        #expect(Reconciler.pair([orphan], with: [other, own]).map(\.orderId.rawValue) == ["in-a"])
    }
}
