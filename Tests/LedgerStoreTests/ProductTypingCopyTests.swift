import Foundation
import LedgerCore
import LedgerStore
import LedgerTestSupport
import Testing

@Suite("The catalog's copy of product types")
struct ProductTypingCopyTests {
    @Test("a type kept for receipts is read again once its own catalog sets the product, and kept until then")
    func setThroughTheSameCatalog() async throws {
        try await withTestDatabase { db in
            let catalog = ProductCatalog(database: db.database, keepingTypesFor: .seconds(3_600))
            let product = try ProductID("pro.monthly")
            #expect(try await catalog.typing(of: product, bundleId: "com.example.game") == nil)

            try await catalog.set(product, status: .active, price: nil, currency: nil, type: .autoRenewable, subscriptionGroup: "pro")
            let typed = try await catalog.typing(of: product, bundleId: "com.example.game")
            #expect(typed == ProductCatalog.Typing(type: .autoRenewable, subscriptionGroup: "pro"))

            // Set elsewhere (another server, `ledger products set`): this copy keeps what it read
            // for its age, which the server keeps at a second.
            try await ProductCatalog(database: db.database).set(product, status: .active, price: nil, currency: nil, type: .consumable)
            #expect(try await catalog.typing(of: product, bundleId: "com.example.game") == typed)
            let fresh = ProductCatalog(database: db.database, keepingTypesFor: .zero)
            #expect(try await fresh.typing(of: product, bundleId: "com.example.game")?.type == .consumable)
        }
    }
}
