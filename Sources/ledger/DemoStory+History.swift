import Foundation
import AppleReceipts
import LedgerJSON

extension DemoStory {
    /// The team's history comes first (docs/import.md): a year of finished orders of its earlier
    /// backend, imported over `POST /v1/imports`, twice (the second adds nothing). Then a client
    /// replays one of those old purchases with a new order: the ledger answers it as granted
    /// already, and the new order is not paid.
    mutating func importHistory() async throws {
        let style = Date.ISO8601FormatStyle()
        var csv = "orderId,userId,productId,bundleId,createdAt,state,price,currency,transactionId,purchaseDate\n"
        for index in 0..<12 {
            let created = Date(timeIntervalSinceNow: -Double(400 - index * 30) * 86_400)
            csv += "legacy-order-\(index),demo-user-\(index % 4),gems.100,\(Demo.bundleId),\(created.formatted(style)),finished,0.99,USD,"
            csv += "\(Self.historyTransaction(index)),\(created.addingTimeInterval(20).formatted(style))\n"
        }
        let first = try await importCSV(csv)
        let again = try await importCSV(csv)
        historySummary.append("History import (POST /v1/imports): \(first["imported"] as? Int ?? 0) orders imported; again: \(again["imported"] as? Int ?? 0) imported, \(again["alreadyPresent"] as? Int ?? 0) already present")

        // demo-user-0's purchase of about 400 days ago, replayed by a client with a new order.
        let transactionId = String(Self.historyTransaction(0))
        let purchased = Date(timeIntervalSinceNow: -400 * 86_400 + 20)
        let payload = SignedTransactionPayload(
            transactionId: transactionId, originalTransactionId: transactionId, bundleId: Demo.bundleId, productId: "gems.100",
            purchaseDate: purchased.millisecondsSince1970, signedDate: Date().millisecondsSince1970, environment: "Production",
            price: 990, currency: "USD")
        _ = try await requestJSON("POST", "/v1/orders", body: orderBody("demo-user-0-replay", "demo-user-0", "gems.100", "0.99"))
        let jws = try chain.sign(payload)
        let answer = try await requestJSON(
            "POST", "/v1/receipts", body: #"{"userId":"demo-user-0","orderId":"demo-user-0-replay","signedTransaction":"\#(jws)"}"#)
        let order = try await requestJSON("GET", "/v1/orders/demo-user-0-replay")
        historySummary.append("Replayed purchase \(transactionId) of the imported history, sent with a new order: \(answer["outcome"] as? String ?? "?") (\(answer["reason"] as? String ?? "-"), finishTransaction \(answer["finishTransaction"] as? Bool ?? false)); the new order is \(order["state"] as? String ?? "?")")
    }

    static func historyTransaction(_ index: Int) -> Int { 150_000_000 + index }

    func importCSV(_ csv: String) async throws -> [String: Any] {
        let text = try await request("POST", "/v1/imports?source=demo-history.csv", body: csv, contentType: "text/csv")
        return (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:]
    }
}
