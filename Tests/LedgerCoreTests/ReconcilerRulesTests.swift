import Foundation
import LedgerCore
import LedgerTestSupport
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

    /// The pairings as "transaction→order", in purchase order.
    func pairs(_ orphans: [Reconciler.Orphan], _ orders: [Reconciler.OpenOrder], settings: Reconciler.Settings = .init()) -> [String] {
        Reconciler.pair(orphans, with: orders, settings: settings).map { "\($0.transactionId)→\($0.orderId)" }
    }

    @Test("the purchase-date guard compares whole milliseconds: a purchase exactly the allowance before the createdAt the API shows is not before the order")
    func guardInMilliseconds() {
        // Kept to the microsecond (…00.534533), shown to the millisecond (…00.534Z).
        let created = Date(timeIntervalSince1970: 1_800_000_000.534_533)
        let atTheEdge = Date(timeIntervalSince1970: Double(1_800_000_000_534 - 300_000) / 1000)
        #expect(!Reconciler.purchasedBeforeOrder(atTheEdge, created: created, allowance: 300))
        #expect(Reconciler.purchasedBeforeOrder(atTheEdge.addingTimeInterval(-0.001), created: created, allowance: 300))
        // Apple's .900, held as a binary fraction just below it, against an order created at .900.
        let apple = Date(timeIntervalSince1970: Double(1_790_985_599_900) / 1000)
        #expect(!Reconciler.purchasedBeforeOrder(apple, created: Date(timeIntervalSince1970: 1_790_985_599.9), allowance: 0))
        #expect(Reconciler.purchasedBeforeOrder(apple, created: Date(timeIntervalSince1970: 1_790_985_599.901), allowance: 0))
    }

    @Test("the queue entry nearest before the purchase wins; the rule, the candidate count and the others are recorded")
    func nearestQueued() {
        let pairings = Reconciler.pair([orphan("t")], with: [
            order("old", created: -600, queued: -500), order("near", created: -300, queued: -60), order("after", created: -200, queued: 3600),
        ])
        #expect(pairings == [.init(
            transactionId: TransactionID(unchecked: "t"), orderId: OrderID(unchecked: "near"), rule: .queueOrder, candidates: 3,
            otherCandidates: [OrderID(unchecked: "old"), OrderID(unchecked: "after")])])
    }

    @Test("orders never queued stand in the queue at their creation: the nearest created before the purchase")
    func creationOrder() {
        let pairings = Reconciler.pair([orphan("t")], with: [order("b", created: -100), order("a", created: -200)])
        #expect(pairings.map(\.orderId.rawValue) == ["b"])
        #expect(pairings.first?.rule == .creationOrder && pairings.first?.candidates == 2)
        #expect(pairings.first?.otherCandidates == [OrderID(unchecked: "a")])
        let alone = Reconciler.pair([orphan("t")], with: [order("only", created: -100, queued: -50)])
        #expect(alone.first?.candidates == 1 && alone.first?.otherCandidates == [] && alone.first?.rule == .queueOrder)
    }

    @Test("purchases made one after another pair each with its own order, whatever order their proofs arrive in")
    func oneAfterAnother() {
        let orders = [order("A", created: -600, queued: -590), order("B", created: -300, queued: -290)]
        let first = orphan("p1", at: -580)
        let second = orphan("p2", at: -280)
        #expect(pairs([first, second], orders) == ["p1→A", "p2→B"])
        #expect(pairs([second, first], orders.reversed()) == ["p1→A", "p2→B"])
        // One proof at a time, in either order: each pass leaves the right order for the other.
        #expect(pairs([second], orders) == ["p2→B"])
        #expect(pairs([first], [orders[0]]) == ["p1→A"])
        #expect(pairs([first], orders) == ["p1→A"])
        #expect(pairs([second], [orders[1]]) == ["p2→B"])
    }

    @Test("payments queued together pair in queue order, never crossed")
    func queuedTogether() {
        // A double tap: A and B queued 5 s apart, both purchases completing after both were queued.
        let orders = [order("B", created: -58, queued: -55), order("A", created: -62, queued: -60)]
        let orphans = [orphan("p2", at: -20), orphan("p1", at: -30)]
        let pairings = Reconciler.pair(orphans, with: orders)
        #expect(pairings.map { "\($0.transactionId)→\($0.orderId)" } == ["p1→A", "p2→B"])
        #expect(pairings.allSatisfy { $0.candidates == 2 })
        // Queue order holds for any pairing found: a later purchase never takes an earlier queue entry.
        var generator = SeededGenerator(state: 23)
        var checked = 0
        for _ in 0..<300 {
            let orders = (0..<Int.random(in: 1...6, using: &generator)).map { index in
                order("o\(index)", created: -Double.random(in: 0...3_000, using: &generator),
                      queued: Bool.random(using: &generator) ? -Double.random(in: 0...3_000, using: &generator) : nil)
            }
            let orphans = (0..<Int.random(in: 1...6, using: &generator)).map { orphan("t\($0)", at: -Double.random(in: 0...3_000, using: &generator)) }
            let byID = Dictionary(uniqueKeysWithValues: orders.map { ($0.orderId, $0) })
            let purchases = Dictionary(uniqueKeysWithValues: orphans.map { ($0.transactionId, $0.purchaseDate) })
            let found = Reconciler.pair(orphans, with: orders)
            #expect(Set(found.map(\.orderId)).count == found.count)
            for (a, b) in zip(found, found.dropFirst()) {
                #expect(purchases[a.transactionId]! <= purchases[b.transactionId]!)
                #expect(byID[a.orderId]!.queueEntry <= byID[b.orderId]!.queueEntry)
                checked += 1
            }
        }
        #expect(checked > 100)
    }

    @Test("a payment queued, abandoned and never reported is skipped: the later order takes the purchase")
    func abandonedPayment() {
        let orders = [order("abandoned", created: -400, queued: -390), order("paid", created: -100, queued: -90)]
        let pairings = Reconciler.pair([orphan("t", at: -30)], with: orders)
        #expect(pairings.map(\.orderId.rawValue) == ["paid"])
        #expect(pairings.first?.otherCandidates == [OrderID(unchecked: "abandoned")])
    }

    @Test("an order never queued yields to one queued up to an hour before it")
    func queuedBeatsNeverQueued() {
        let orders = [order("queued", created: -1_500, queued: -1_500), order("abandoned", created: -900)]
        #expect(pairs([orphan("t")], orders) == ["t→queued"])
        // Queued more than an hour before the other was created: the nearer one.
        let older = [order("queued", created: -9_000, queued: -9_000), order("recent", created: -900)]
        #expect(pairs([orphan("t")], older) == ["t→recent"])
    }

    @Test("a purchase with no order of its own does not take an order whose timing fits another purchase better")
    func strayPurchase() {
        // "stray" was bought before the order was even queued (another device, an older app);
        // "mine" completed 20 s after it was queued.
        let orders = [order("o", created: -130, queued: -120)]
        #expect(pairs([orphan("stray", at: -200), orphan("mine", at: -100)], orders) == ["mine→o"])
        // With a second, earlier order, each purchase takes the one queued before it.
        let two = [order("early", created: -260, queued: -250)] + orders
        #expect(pairs([orphan("stray", at: -200), orphan("mine", at: -100)], two) == ["stray→early", "mine→o"])
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

    @Test("never an order twice; more purchases than orders leave the latest-fitting ones in the pool")
    func purchaseOrder() {
        let orphans = [orphan("second", at: 60), orphan("first", at: 0), orphan("third", at: 120)]
        let orders = [order("o1", created: -100, queued: -10), order("o2", created: -90, queued: 50)]
        let pairings = Reconciler.pair(orphans, with: orders)
        #expect(pairings.map { "\($0.transactionId)→\($0.orderId)" } == ["first→o1", "second→o2"])
    }
}

