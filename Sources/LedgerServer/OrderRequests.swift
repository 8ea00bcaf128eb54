import Foundation
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerStore

/// The body of `POST /v1/orders`: the order's id and the fields of its `created` event, with a
/// generated `appAccountToken` and a quantity of 1 where the caller gives none (or null).
struct CreateOrder: ClosedBody {
    let orderId: OrderID
    var created: OrderCreated
    /// Whether the caller chose the token (a retry is then the same order only with the same token).
    let tokenGiven: Bool

    enum CodingKeys: String, CodingKey, CaseIterable {
        case orderId, userId, productId, quantity, price, currency, appAccountToken, bundleId
    }

    init(from decoder: any Decoder) throws {
        let body = try decoder.container(keyedBy: CodingKeys.self)
        orderId = try body.decode(OrderID.self, forKey: .orderId)
        let token = try body.decodeIfPresent(UUID.self, forKey: .appAccountToken)
        tokenGiven = token != nil
        created = OrderCreated(
            userId: try body.decode(UserID.self, forKey: .userId), productId: try body.decode(ProductID.self, forKey: .productId),
            quantity: Int(try body.decodeInteger(forKey: .quantity) ?? 1),
            price: try body.decodeIfPresent(String.self, forKey: .price), currency: try body.decodeIfPresent(String.self, forKey: .currency),
            appAccountToken: token ?? UUID(), bundleId: try body.decodeIfPresent(BundleID.self, forKey: .bundleId))
        try OrderEvent.created(created).validate()
        try orderId.checkGiven()
        try created.userId.checkGiven()
        try created.productId.checkGiven()
        // Kept as every later read shows it, so that the first answer shows it so too.
        created.price = created.price.map(OrderEvent.normalizedPrice)
    }
}

/// The body of `POST /v1/orders/{orderId}/events`: `{type, eventId?, expectedVersion?, data}`.
/// `data` is stored as the caller sent it (fields its type does not know included), and the event
/// is read from that same member, so what is stored is what was decided on.
struct AppendEvent: ClosedBody {
    let event: OrderEvent
    let eventId: EventID?
    let expectedVersion: ExpectedVersion?
    /// Whether the body has `data` (else the event's data is `{}`).
    let hasData: Bool

    enum CodingKeys: String, CodingKey, CaseIterable {
        case type, eventId, expectedVersion, data
    }

    /// The body `buffer` read: the event, and its data as stored.
    static func read(_ buffer: ByteBuffer) throws -> (body: AppendEvent, data: Data) {
        let body = try LedgerRequestDecoder.decode(AppendEvent.self, from: buffer)
        guard body.hasData else { return (body, Data("{}".utf8)) }
        if let data = BodyMember.text(of: CodingKeys.data.stringValue, in: buffer) { return (body, data) }
        // Written again from the member as the decoder read it (the event was read from it too).
        struct Member: Decodable { let data: JSONValue }
        // Through the request decoder, so that what JSONValue cannot hold is a 400 naming `data`.
        return (body, try EventCoding.encoder.encode(try LedgerRequestDecoder.decode(Member.self, from: buffer).data))
    }

    init(from decoder: any Decoder) throws {
        let body = try decoder.container(keyedBy: CodingKeys.self)
        let typeName = try body.decode(String.self, forKey: .type)
        // Every refusal of a type names the types a client may post.
        let allowed: [String: JSONValue] = ["allowed": .strings(OrderEventType.allCases.filter { $0.isWrittenByClients && $0 != .created }.map(\.rawValue))]
        guard let type = OrderEventType(rawValue: typeName) else {
            throw APIError(.badRequest, code: "unknown-event-type", message: "unknown event type \(typeName)", details: allowed)
        }
        guard type != .created else {
            throw APIError(.badRequest, code: "unknown-event-type", message: "orders are created with POST /v1/orders", details: allowed)
        }
        guard type.isWrittenByClients else {
            let writer = switch type {
            case .pairingUndone: "when support undoes a pairing (POST /v1/transactions/{transactionId}/unmatch)"
            case .consumptionAnswer: "when it answers Apple's consumption request (LEDGER_APPLE_CONSUMPTION_CONSENT)"
            default: "from Apple's notifications (POST /v1/notifications/apple)"
            }
            throw APIError(.badRequest, code: "unknown-event-type", message: "\(typeName) is recorded by the ledger \(writer)", details: allowed)
        }
        eventId = try body.decodeIfPresent(EventID.self, forKey: .eventId)
        expectedVersion = try body.decodeInteger(forKey: .expectedVersion).map { version throws(LedgerInputError) in
            guard version >= -1 else { throw LedgerInputError(field: "expectedVersion", problem: "must be -1 (no order) or more") }
            return version < 0 ? .noStream : .exact(version)
        }
        hasData = body.contains(.data)
        guard hasData else {
            event = try EventCoding.orderEvent(type, from: Data("{}".utf8))
            return
        }
        guard (try? body.nestedContainer(keyedBy: MemberKey.self, forKey: .data)) != nil else {
            throw LedgerInputError(field: "data", problem: "must be a JSON object")
        }
        do {
            event = try OrderEvent(type: type, body: Member(container: body, key: .data))
        } catch let error as DecodingError {
            throw EventCoding.inputError(error, field: "data", within: CodingKeys.data.stringValue)
        }
        try event.validateNew()
        // The reports count a purchase under the environment it names: Apple's two, spelled as Apple does.
        try event.checkEnvironmentSpelling()
        try event.checkTransactionIdSpelling()
        if case .refunded(let refund) = event {
            // Stored events read any other value as the notification type the ledger once wrote
            // there; from a client, only those two (REFUND, REVOKE) are: a misspelt
            // REFUND_PRORATED would otherwise be a full refund.
            struct Typed: Decodable { let revocationType: String? }
            if let given = (try? body.decode(Typed.self, forKey: .data))?.revocationType, RevocationType(rawValue: given) == nil,
               !AppleTransactionRecord.isRefund(given) {
                throw LedgerInputError(field: "revocationType", problem: "is \(given); use REFUND_FULL or REFUND_PRORATED")
            }
            try Self.checkClientRefund(refund)
        }
        if case .receiptReceived(let receipt) = event, receipt.matchedBy == .support {
            // Support's hand is the one exemption from the Apple-account rule (issue 41).
            throw LedgerInputError(field: "data.matchedBy", problem: "support is the ledger's own: support pairs by hand with POST /v1/transactions/{transactionId}/match")
        }
        if case .receiptReceived(let receipt) = event, receipt.matchedBy == .imported || receipt.format == .imported {
            throw LedgerInputError(field: receipt.matchedBy == .imported ? "data.matchedBy" : "data.format",
                                   problem: "imported is the ledger's own: import a history with POST /v1/imports or ledger import")
        }
    }

    /// What a client may say of a refund, beyond what a stored event may hold: a family
    /// revocation never refunds an order's purchase, and a prorated refund needs its share (the
    /// reports take it back).
    static func checkClientRefund(_ refund: Refunded) throws(LedgerInputError) {
        switch refund.revocationType {
        case .familyRevoke?:
            throw LedgerInputError(field: "revocationType", problem: "FAMILY_REVOKE ends a family member's shared access, not an order's purchase")
        case .refundProrated? where refund.revocationPercentage == nil:
            throw LedgerInputError(field: "revocationPercentage", problem: "is required with REFUND_PRORATED (thousandths of a percent, 0 to 100000)")
        default:
            break
        }
    }

    /// Reads an event's body from the request's `data` member.
    private struct Member: EventBodyReader {
        let container: KeyedDecodingContainer<CodingKeys>
        let key: CodingKeys
        func read<Body: Decodable>(_ type: Body.Type) throws -> Body { try container.decode(type, forKey: key) }
    }
}

extension KeyedDecodingContainer {
    /// An integer member, nil when absent or null; any other value (a string, true, 1.5) is an
    /// input error naming the member. (Foundation's decoder reports a fraction where it wants an
    /// integer as JSON that is not valid, without the member's name.)
    func decodeInteger(forKey key: Key) throws -> Int64? {
        switch try decodeIfPresent(JSONValue.self, forKey: key) {
        case nil, .null?:
            return nil
        case .number(let number)?:
            // Out of Int64's range or with a fraction, the integer differs from the number.
            let integer = NSDecimalNumber(decimal: number).int64Value
            if Decimal(integer) == number { return integer }
        default:
            break
        }
        throw LedgerInputError(field: key.stringValue, problem: "must be an integer")
    }
}
