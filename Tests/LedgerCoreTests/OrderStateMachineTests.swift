import Foundation
import LedgerCore
import LedgerTestSupport
import Testing

/// The transition table (docs/architecture.md, "Orders"), written out here independently of `OrderTransitions`.
let designTable: [OrderState?: Set<OrderEventType>] = [
    nil: [.created],
    .created: [.paymentAdded, .receiptReceived, .failed],
    .paymentAdded: [.receiptReceived, .failed],
    .receiptReceived: [.verified, .failed, .pairingUndone],
    .verified: [.delivered, .refunded, .failed, .pairingUndone],
    .delivered: [.finished, .refunded, .failed],
    .finished: [.refunded],
    .refunded: [.refundReversed],
    .failed: [],
]

/// A sample event of each type.
func sample(_ type: OrderEventType, seed: Int = 0) -> OrderEvent {
    let date = Date(timeIntervalSince1970: 1_800_000_000 + Double(seed))
    switch type {
    case .created:
        let token = UUID(uuidString: "00000000-0000-4000-8000-" + String(String(seed).suffix(12)).leftPadded(to: 12))!
        return .created(OrderCreated(userId: UserID(unchecked: "u\(seed % 3)"), productId: ProductID(unchecked: "gems.100"), price: "0.99", currency: "USD", appAccountToken: token))
    case .paymentAdded: return .paymentAdded(PaymentAdded(queuedAt: date))
    case .receiptReceived: return .receiptReceived(ReceiptReceived(
        transactionId: TransactionID(unchecked: "2000\(seed)"), productId: ProductID(unchecked: "gems.100"), purchaseDate: date,
        receiptSha256: String(repeating: "a", count: 64), format: .jws, matchedBy: .applicationUsername))
    case .verified: return .verified(Verified(environment: "Production"))
    case .delivered: return .delivered
    case .finished: return .finished
    case .refunded: return .refunded(Refunded(revocationDate: date, revocationReason: 1))
    case .refundReversed: return .refundReversed
    case .failed: return .failed(Failed(reason: "cancelled"))
    case .notificationReceived: return .notificationReceived(NotificationReceived(
        notificationUUID: UUID(uuidString: "00000000-0000-4000-8000-\(String(seed).leftPadded(to: 12))")!, notificationType: "CONSUMPTION_REQUEST", subtype: nil, transactionId: nil, signedDate: date))
    case .pairingUndone: return .pairingUndone(PairingUndone(transactionId: TransactionID(unchecked: "2000\(seed)"), reason: "wrong recipient", fromState: .verified))
    case .consumptionAnswer: return .consumptionAnswer(ConsumptionAnswer(
        notificationUUID: UUID(uuidString: "00000000-0000-4000-8000-\(String(seed).leftPadded(to: 12))")!, transactionId: TransactionID(unchecked: "2000\(seed)"),
        outcome: .sent, deliveryStatus: .delivered, customerConsented: true, attempts: 1))
    }
}

extension String {
    func leftPadded(to length: Int) -> String { String(repeating: "0", count: max(0, length - count)) + self }
}

/// An order in `state`, reached through allowed events.
func order(in state: OrderState) -> Order {
    let paths: [OrderState: [OrderEventType]] = [
        .created: [.created], .paymentAdded: [.created, .paymentAdded], .receiptReceived: [.created, .receiptReceived],
        .verified: [.created, .receiptReceived, .verified], .delivered: [.created, .receiptReceived, .verified, .delivered],
        .finished: [.created, .receiptReceived, .verified, .delivered, .finished],
        .refunded: [.created, .receiptReceived, .verified, .refunded], .failed: [.created, .failed],
    ]
    var current: Order?
    for (version, type) in paths[state]!.enumerated() {
        current = Order.evolve(current, sample(type), orderID: OrderID(unchecked: "o1"), version: Int64(version), at: .now)
    }
    return current!
}

@Suite("The order state machine")
struct OrderStateMachineTests {
    @Test("the transition table is the documented one, for every state and event type")
    func tableMatchesDesign() {
        for state in [nil] + OrderState.allCases.map(Optional.some) {
            #expect(Set(OrderTransitions.allowed(from: state)) == designTable[state], "state \(String(describing: state))")
        }
    }

    @Test("decide allows or refuses every (state, event type) pair exactly as the table says", arguments: OrderState.allCases)
    func decideEveryPair(state: OrderState) {
        let current = order(in: state)
        #expect(current.state == state)
        for type in OrderEventType.allCases {
            let decision = Order.decide(current, sample(type))
            if type == .created {
                #expect(decision == .failure(.orderExists(current.orderId)))
            } else if type.isRecord {
                // A record, not a transition: every state takes it and stays as it is.
                #expect(decision == .success([sample(type)]))
                let next = Order.evolve(current, sample(type), orderID: current.orderId, version: current.version + 1, at: .now)
                #expect(next?.state == state && next?.version == current.version + 1)
            } else if designTable[state]!.contains(type) {
                #expect(decision == .success([sample(type)]), "\(type) from \(state)")
                let next = Order.evolve(current, sample(type), orderID: current.orderId, version: current.version + 1, at: .now)
                #expect(next?.version == current.version + 1)
            } else {
                #expect(decision == .failure(.transitionNotAllowed(state: state, type: type, allowed: OrderTransitions.allowed(from: state))), "\(type) from \(state)")
                #expect(Order.evolve(current, sample(type), orderID: current.orderId, version: current.version + 1, at: .now) == current)
            }
        }
    }

    @Test("without an order only created is accepted")
    func noOrderYet() {
        #expect(Order.decide(nil, sample(.created)) == .success([sample(.created)]))
        for type in OrderEventType.allCases where type != .created {
            #expect(Order.decide(nil, sample(type)) == .failure(.noSuchOrder))
        }
    }

    @Test("a refund remembers the state it interrupted and refund-reversed restores it", arguments: [OrderState.verified, .delivered, .finished])
    func refundRoundTrip(state: OrderState) throws {
        let before = order(in: state)
        let refunded = try #require(Order.evolve(before, sample(.refunded), orderID: before.orderId, version: before.version + 1, at: .now))
        #expect(refunded.state == .refunded)
        let reversed = try #require(Order.evolve(refunded, .refundReversed, orderID: before.orderId, version: refunded.version + 1, at: .now))
        #expect(reversed.state == state)
    }

    @Test("an undone pairing returns the order to where it stood before the receipt", arguments: [false, true])
    func undoRestoresState(queued: Bool) throws {
        var current = order(in: .created)
        if queued { current = try #require(Order.evolve(current, sample(.paymentAdded), orderID: current.orderId, version: 1, at: .now)) }
        for type in [OrderEventType.receiptReceived, .verified] {
            current = try #require(Order.evolve(current, sample(type), orderID: current.orderId, version: current.version + 1, at: .now))
        }
        #expect(current.state == .verified && current.transactionId != nil)
        let undone = try #require(Order.evolve(current, sample(.pairingUndone), orderID: current.orderId, version: current.version + 1, at: .now))
        #expect(undone.state == (queued ? .paymentAdded : .created) && undone.transactionId == nil && undone.isOpen)
        #expect(!OrderEventType.pairingUndone.isWrittenByClients)
    }

    @Test("a body's fields are checked as documented: prices, ISO 4217 codes, a digest's 64 hex digits, ASCII alone")
    func fieldChecks() throws {
        for (price, valid) in [("0.99", true), ("10", true), (String(repeating: "9", count: 32), true), (".99", false), ("1.", false),
                               ("1.2.3", false), ("-1", false), ("1e3", false), ("", false), ("\u{0663}", false), ("１", false),
                               (String(repeating: "9", count: 33), false)] {
            #expect(OrderEvent.isValidPrice(price) == valid, "\(price)")
        }
        for (currency, valid) in [("USD", true), ("usd", false), ("US", false), ("USDT", false), ("ＵＳＤ", false), ("ÉUR", false)] {
            #expect(OrderEvent.isValidCurrency(currency) == valid, "\(currency)")
        }
        func receipt(_ digest: String) -> OrderEvent {
            .receiptReceived(ReceiptReceived(
                transactionId: TransactionID(unchecked: "1"), productId: ProductID(unchecked: "p"), purchaseDate: Date(),
                receiptSha256: digest, format: .jws, matchedBy: .applicationUsername))
        }
        try receipt(String(repeating: "aF", count: 32)).validate()
        for digest in [String(repeating: "a", count: 63), String(repeating: "a", count: 65), String(repeating: "g", count: 64),
                       String(repeating: "ａ", count: 64), String(repeating: "a", count: 63) + "é"] {
            #expect(throws: LedgerInputError.self, "\(digest)") { try receipt(digest).validate() }
        }
    }

    @Test("the client may finish only once delivered or definitively rejected")
    func finishAdvice() {
        #expect(OrderState.allCases.filter(\.clientMayFinish) == [.delivered, .finished, .failed, .refunded])
    }

    @Test("property: replaying the accepted events of random sequences reproduces the state; refused events change nothing")
    func randomSequences() {
        var generator = SeededGenerator(state: 20261121)
        for sequence in 0..<2000 {
            var live: Order?
            var accepted: [OrderEvent] = []
            for step in 0..<Int.random(in: 1...14, using: &generator) {
                let event = sample(OrderEventType.allCases.randomElement(using: &generator)!, seed: sequence * 100 + step)
                let before = live
                switch Order.decide(live, event) {
                case .success(let events):
                    for accepted_ in events {
                        live = Order.evolve(live, accepted_, orderID: OrderID(unchecked: "o\(sequence)"), version: Int64(accepted.count), at: Date(timeIntervalSince1970: Double(step)))
                        accepted.append(accepted_)
                    }
                    #expect(live != before || before == nil)
                case .failure:
                    #expect(live == before)
                }
            }
            var replayed: Order?
            for (version, event) in accepted.enumerated() {
                replayed = Order.evolve(replayed, event, orderID: OrderID(unchecked: "o\(sequence)"), version: Int64(version), at: Date(timeIntervalSince1970: 0))
            }
            // Replays differ only in the recording times given to evolve.
            #expect(replayed?.state == live?.state)
            #expect(replayed?.version == live?.version)
            #expect(replayed?.transactionId == live?.transactionId)
            #expect(accepted.first.map { $0.type == .created } ?? true)
        }
    }
}
