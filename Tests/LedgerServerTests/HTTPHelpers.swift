import AppleReceipts
import Foundation
import Hummingbird
import HummingbirdTesting
import LedgerTestSupport
import NIOCore
import Testing

/// The live test client with an API key it sends as a Bearer token.
struct LedgerHTTP: Sendable {
    let client: LiveClient
    let key: String

    /// Sends a JSON body (or raw text) with `key` (this client's own unless given; nil: none) and
    /// answers the status and the decoded JSON object.
    @discardableResult
    func send(
        _ method: HTTPRequest.Method, _ uri: String, json: Any? = nil, raw: String? = nil, key: String?? = .none
    ) async throws -> (HTTPResponse.Status, [String: Any]) {
        var body: ByteBuffer?
        if let json { body = ByteBuffer(bytes: try JSONSerialization.data(withJSONObject: json)) }
        if let raw { body = ByteBuffer(string: raw) }
        var headers: HTTPFields = [.contentType: "application/json"]
        if let token = key ?? self.key { headers[.authorization] = "Bearer \(token)" }
        let response = try await client.execute(uri: uri, method: method, headers: headers, body: body)
        return (response.status, LedgerServerTests.json(response.body))
    }

    /// Posts Apple's signed notification to `POST /v1/notifications/apple`, with no API key
    /// (Apple signs it instead).
    @discardableResult
    func notifyApple(_ signedPayload: String) async throws -> (HTTPResponse.Status, [String: Any]) {
        try await send(.post, "/v1/notifications/apple", json: ["signedPayload": signedPayload], key: .some(nil))
    }

    /// `notifyApple`, expecting the notification taken (200): its answer.
    @discardableResult
    func notifyAppleTaken(_ signedPayload: String) async throws -> [String: Any] {
        let (status, answer) = try await notifyApple(signedPayload)
        #expect(status == .ok, "\(answer)")
        return answer
    }

    /// Order `id` (`newOrder`'s user and product) paid with `transaction` by its client's proof,
    /// then delivered.
    func deliveredOrder(_ id: String, paidWith transaction: SignedTransactionPayload, apple: TestApple) async throws {
        try await send(.post, "/v1/orders", json: newOrder(id))
        try await send(.post, "/v1/receipts", json: ["orderId": id, "signedTransaction": try await apple.sign(transaction)])
        try await send(.post, "/v1/orders/\(id)/events", json: ["type": "delivered", "data": [:]])
    }
}

/// The error object of an error answer.
func errorOf(_ json: [String: Any]) -> [String: Any] { json["error"] as? [String: Any] ?? [:] }

func newOrder(_ id: String, user: String = "u-1", product: String = "gems.100") -> [String: Any] {
    ["orderId": id, "userId": user, "productId": product, "price": "0.99", "currency": "USD"]
}

let sha = String(repeating: "ab", count: 32)

func receipt(_ transaction: String, product: String = "gems.100") -> [String: Any] {
    ["transactionId": transaction, "productId": product, "purchaseDate": "2026-11-21T10:00:00Z",
     "receiptSha256": sha, "format": "jws", "matchedBy": "applicationUsername"]
}
