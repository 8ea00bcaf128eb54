import Foundation
import LedgerCore
import LedgerStore

/// A subscription whose start an order holds but that was never started: the start reached its
/// order otherwise than through the intake as a subscription's start (an imported history, a
/// backend's own `receipt-received`, a grant from before subscriptions). Every way a later
/// transaction of it arrives (an upload, a notification, the catch-up, the history sweep) starts it
/// here first, from what the ledger holds of the start, so its periods are recorded on it.
extension ReceiptLedger {
    /// Starts subscription `id`, in the caller's transaction, when an order holds its start and its
    /// stream is not started: `recordStart` (as the intake writes it, tied to that order, with the
    /// renewals that waited), under the start's lock and then the subscription's. `seen` is a
    /// transaction of the subscription at hand, verified (its start, or a later period); the start
    /// is taken from it when it is the start, else from its pool entry, else from its order's
    /// `receipt-received`. Only a product the ledger knows as auto-renewable starts one: the
    /// catalog's type of the start's product, else Apple's signed type of `seen`
    /// (`TransactionRole.of`'s rule). A start its order's backend claimed and nobody verified yet
    /// starts nothing from a later period. Answers whether it started the subscription.
    @discardableResult
    func startHeldSubscription(_ id: String, seen: AppleTransaction, metadata: Data, in tx: DatabaseTransaction) async throws -> Bool {
        guard try await subscriptions.store.subscription(id, in: tx) == nil else { return false }
        let startID = TransactionID(unchecked: id)
        // The start's lock before the subscription's, as the intake of the start takes them.
        try await lockTransaction(startID, in: tx)
        guard let holder = try await writer.read(orders: [], transactions: [startID], in: tx).transaction(startID),
              let order = holder.orderId, holder.status == .claimed, (holder.originalTransactionId ?? id) == id,
              let start = try await heldStart(holder, of: id, order: order, seen: seen, in: tx), !start.isFamilyShared
        else { return false }
        // A backend's own claim of the start, not yet verified, is no one's until Apple's signed
        // start or the backend's `verified` stands by it: its renewals wait (Apple's start may be
        // another user's, and take the claim back).
        if seen.transactionId != startID, try await unverifiedClaim(of: startID, holder: holder, in: tx) != nil { return false }
        // Apple's signed start at hand (a refresh's, a sweep's): a claim it contradicts is taken
        // back first, and starts nothing.
        if seen.transactionId == startID, try await takeBackClaim(of: seen, holder: holder, metadata: metadata, in: tx) { return false }
        let typing = try await catalog.typing(of: start.productId, bundleId: start.bundleId, in: tx)
        guard (typing?.type ?? seen.type.flatMap(ProductType.init(appleType:))) == .autoRenewable else { return false }
        try await recordStart(start, of: id, typing: typing, metadata: metadata, in: tx)
        return try await subscriptions.store.subscription(id, in: tx) != nil
    }

    /// `startHeldSubscription` for each subscription of `transactions` (by their role) in a
    /// transaction of its own: what the catch-up and the history sweep do before taking in what
    /// they read, so that a renewal they hold already, or take in, finds its subscription.
    /// Answers the subscriptions it started.
    public func startHeldSubscriptions(of transactions: [AppleTransaction], metadata: Data) async throws -> [String] {
        var seen: [String: AppleTransaction] = [:]
        for transaction in transactions {
            let typing = try await catalog.typing(of: transaction.productId, bundleId: transaction.bundleId)
            guard let role = try? TransactionRole.of(transaction, catalogType: typing?.type), let id = Self.purchasedSubscription(role) else {
                continue
            }
            // The start itself, when Apple's answer holds it, is the best the ledger can have of it.
            if seen[id] == nil || transaction.transactionId.rawValue == id { seen[id] = transaction }
        }
        var started: [String] = []
        for (id, transaction) in seen.sorted(by: { $0.key < $1.key }) {
            // Most are started long since: that is read without a transaction of its own.
            guard try await subscriptions.store.subscription(id) == nil else { continue }
            // A deadlock with a live upload or notification of it: the loser runs again.
            let didStart = try await database.transactionAgainAfterLostRace { tx in
                try await startHeldSubscription(id, seen: transaction, metadata: metadata, in: tx)
            }
            if didStart { started.append(id) }
        }
        return started
    }

    /// The subscription a transaction of `role` is a period of (its start or a later one); nil for
    /// a purchase, a family member's share and a restore.
    static func purchasedSubscription(_ role: TransactionRole) -> String? {
        switch role {
        case .subscriptionStart(let id), .subscriptionPeriod(let id): id
        case .purchase, .familyShared, .restore: nil
        }
    }

    /// The start of subscription `id` as the ledger holds it for order `order`: `seen` when it is
    /// the start (Apple's, verified now), else its pool entry when it went through the pool, else
    /// its order's `receipt-received` (which holds no period end nor price: the start's period is
    /// then known by its transaction id, and `recordStart` never records a second one for it).
    private func heldStart(
        _ holder: AppleTransactionRecord, of id: String, order: OrderID, seen: AppleTransaction, in tx: DatabaseTransaction
    ) async throws -> AppleTransaction? {
        if seen.transactionId == holder.transactionId { return seen }
        if let pooled = try holder.verifiedTransaction(), pooled.transactionId == holder.transactionId { return pooled }
        guard let receipt = try await subscriptions.store.startReceipt(id, order: order, in: tx) else { return nil }
        return AppleTransaction(
            transactionId: holder.transactionId, originalTransactionId: id, productId: receipt.productId, purchaseDate: receipt.purchaseDate,
            environment: receipt.environment ?? holder.environment ?? seen.environment,
            bundleId: receipt.bundleId?.rawValue ?? holder.bundleId?.rawValue ?? seen.bundleId,
            appAccountToken: receipt.appAccountToken ?? holder.appAccountToken, appTransactionId: receipt.appTransactionId ?? holder.appTransactionId,
            format: receipt.format, receiptSha256: receipt.receiptSha256, type: seen.type,
            // One subscription's transactions share its group, as Apple signed it for `seen`.
            subscriptionGroupIdentifier: seen.subscriptionGroupIdentifier, storefront: receipt.storefront ?? holder.storefront)
    }
}
