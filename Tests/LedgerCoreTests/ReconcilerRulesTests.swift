import Foundation
import LedgerCore
import Testing

@Suite("The reconciler's rules")
struct ReconcilerRulesTests {
    let purchase = Date(timeIntervalSince1970: 1_800_000_000)

    func orphan(_ id: String, user: String = "u", product: String = "p", at offset: TimeInterval = 0) -> Reconciler.Orphan {
        .init(transactionId: TransactionID(unchecked: id), userId: UserID(unchecked: user), productId: ProductID(unchecked: product),
              purchaseDate: purchase.addingTimeInterval(offset))
    }

    func order(_ id: String, user: String = "u", product: String = "p", created: TimeInterval, queued: TimeInterval? = nil) -> Reconciler.OpenOrder {
        .init(orderId: OrderID(unchecked: id), userId: UserID(unchecked: user), productId: ProductID(unchecked: product),
              createdAt: purchase.addingTimeInterval(created), queuedAt: queued.map { purchase.addingTimeInterval($0) })
    }

    @Test("nearest earlier queued order wins; the rule and the candidate count are recorded")
    func nearestQueued() {
        let pairings = Reconciler.pair([orphan("t")], with: [
            order("old", created: -600, queued: -500), order("near", created: -300, queued: -60), order("after", created: -200, queued: 3600),
        ])
        #expect(pairings == [.init(transactionId: TransactionID(unchecked: "t"), orderId: OrderID(unchecked: "near"), rule: .nearestQueued, candidates: 3)])
    }

    @Test("no order queued before the purchase: the oldest created")
    func oldestCreated() {
        let pairings = Reconciler.pair([orphan("t")], with: [order("b", created: -100), order("a", created: -200)])
        #expect(pairings.map(\.orderId.rawValue) == ["a"])
        #expect(pairings.first?.rule == .oldestCreated && pairings.first?.candidates == 2)
    }

    @Test("never across users or products, never outside the clock-skew and maximum-age windows")
    func windows() {
        let settings = Reconciler.Settings(clockSkew: 300, maximumAge: 86_400)
        let orders = [
            order("other-user", user: "v", created: -10), order("other-product", product: "q", created: -10),
            order("too-late", created: 301), order("too-old", created: -86_401),
        ]
        #expect(Reconciler.pair([orphan("t")], with: orders, settings: settings).isEmpty)
        #expect(Reconciler.pair([orphan("t")], with: [order("skewed", created: 299)], settings: settings).count == 1)
    }

    @Test("one user's and product's orphans are paired in purchase-date order, one order each")
    func purchaseOrder() {
        let orphans = [orphan("second", at: 60), orphan("first", at: 0), orphan("third", at: 120)]
        let orders = [order("o1", created: -100, queued: -10), order("o2", created: -90, queued: 50)]
        let pairings = Reconciler.pair(orphans, with: orders)
        #expect(pairings.map { "\($0.transactionId)→\($0.orderId)" } == ["first→o1", "second→o2"])
    }
}
