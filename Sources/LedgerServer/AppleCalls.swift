import AppleReceipts
import Foundation
import LedgerCore
import LedgerStore
import Logging

/// The calls to Apple that changes queue in `apple_calls` (migration 007): Finish Transaction
/// once an order is delivered, Set App Account Token once the reconciler or support paired a
/// pooled transaction. A pass takes due calls under a lease (several servers divide them), makes
/// each, records its outcome as an event on the stream `apple-calls-<transactionId>`, and
/// deletes it; a failure Apple may get over (busy, away, rate-limited) is tried again later with
/// backoff, a refusal is recorded and not tried again.
public struct AppleCalls: Sendable {
    let api: LazyAppStoreServerAPI
    let writer: LedgerWriter
    var database: Database { writer.database }    /// Calls taken per pass.
    public var batch = 50
    /// The first retry's delay; each later one doubles it, up to an hour.
    public var backoff: TimeInterval = 30
    /// Tries before a call is given up and its failure recorded.
    public var attempts = 20

    public init(api: LazyAppStoreServerAPI, writer: LedgerWriter) {
        self.api = api
        self.writer = writer
    }

    /// What a pass did, by outcome: `done`, `refused`, `retrying`, `given-up`.
    public typealias Summary = [String: Int]

    struct Call: Sendable {
        let id: String
        let kind: String
        let transactionID: String
        let originalTransactionID: String?
        let orderID: String
        let token: UUID?
        let attempt: Int
    }

    /// One pass over the calls due now.
    public func run(metadata: Data = Data(#"{"appendedBy":"apple-calls"}"#.utf8)) async throws -> Summary {
        let rows = try await database.query(
            """
            UPDATE apple_calls SET claimed_until = now() + interval '5 minutes', attempts = attempts + 1
             WHERE call_id IN (SELECT call_id FROM apple_calls
                                WHERE due_at <= now() AND (claimed_until IS NULL OR claimed_until < now())
                                ORDER BY due_at LIMIT \(batch) FOR UPDATE SKIP LOCKED)
            RETURNING call_id, kind, transaction_id, original_transaction_id, order_id, app_account_token, attempts
            """)
        var calls: [Call] = []
        for try await (id, kind, transaction, original, order, token, attempt) in rows.decode((String, String, String, String?, String, UUID?, Int).self) {
            calls.append(Call(id: id, kind: kind, transactionID: transaction, originalTransactionID: original, orderID: order, token: token, attempt: attempt))
        }
        var summary: Summary = [:]
        guard !calls.isEmpty else { return summary }
        let client = try await api.client()
        for call in calls {
            let outcome = try await make(call, with: client, metadata: metadata)
            summary[outcome, default: 0] += 1
        }
        return summary
    }

    /// Makes one call and settles its row; answers its outcome.
    private func make(_ call: Call, with client: AppStoreServerAPI, metadata: Data) async throws -> String {
        do {
            switch call.kind {
            case "finish":
                try await client.finishTransaction(call.transactionID)
            default:
                // The trigger takes the token from the order's row, where it is never null.
                guard let token = call.token else {
                    throw AppStoreServerAPIError(code: "no-account-token", message: "order \(call.orderID) has no appAccountToken to set")
                }
                try await client.setAppAccountToken(call.originalTransactionID ?? call.transactionID, token)
            }
            try await settle(call, outcome: "done", error: nil, metadata: metadata)
            return "done"
        } catch let error as AppStoreServerAPIError {
            // Apple away, the key refused (until the operator fixes it), the server stopping: later.
            let transient = error.isAppleAway || ["apple-api-unauthorized", "cancelled"].contains(error.code)
            guard transient, call.attempt < attempts else {
                let outcome = transient ? "given-up" : "refused"
                try await settle(call, outcome: outcome, error: error, metadata: metadata)
                return outcome
            }
            let delay = min(backoff * pow(2, Double(call.attempt - 1)), 3600)
            try await database.query(
                """
                UPDATE apple_calls SET due_at = now() + make_interval(secs => \(delay)), claimed_until = NULL, last_error = \(error.description)
                 WHERE call_id = \(call.id)
                """)
            logger.warning("a call to Apple failed; it will be tried again", metadata: [
                "apple.call": "\(call.id)", "error": "\(error.code)", "apple.attempt": "\(call.attempt)"])
            return "retrying"
        }
    }

    var logger: Logger { database.logger }

    /// Records the call's outcome on the transaction's stream (named by the call: recorded once
    /// however often it was made) and deletes its row.
    private func settle(_ call: Call, outcome: String, error: AppStoreServerAPIError?, metadata: Data) async throws {
        let type = call.kind == "finish" ? "apple-transaction-finished" : "apple-account-token-set"
        let body = Outcome(
            outcome: outcome, transactionId: call.transactionID, originalTransactionId: call.originalTransactionID, orderId: call.orderID,
            appAccountToken: call.token?.uuidString.lowercased(), attempts: call.attempt, error: error?.code, appleErrorCode: error?.appleErrorCode)
        let event = try EventCoding.newEvent(type: type, body, id: EventID.named("apple-call", call.id), metadata: metadata)
        let stream = StreamID(unchecked: "apple-calls-" + call.transactionID)
        do {
            _ = try await writer.append([event], to: stream)
        } catch AppendError.eventIDConflict {
            // Recorded before, with another outcome (a call made again after a lost lease): the first stands.
        }
        try await database.query("DELETE FROM apple_calls WHERE call_id = \(call.id)")
        if outcome != "done" {
            logger.warning("a call to Apple was not made", metadata: ["apple.call": "\(call.id)", "outcome": "\(outcome)", "error": "\(error?.code ?? "")"])
        }
    }

    /// The event body of a call's outcome.
    struct Outcome: Encodable {
        let outcome: String
        let transactionId: String
        let originalTransactionId: String?
        let orderId: String
        let appAccountToken: String?
        let attempts: Int
        let error: String?
        let appleErrorCode: Int?
    }

    /// Writes the operator's switches where the queue's triggers read them.
    public static func setSwitches(finishAfterDelivery: Bool, setTokenAfterPairing: Bool, on database: Database) async throws {
        try await database.query(
            "UPDATE ledger_switches SET finish_after_delivery = \(finishAfterDelivery), set_token_after_pairing = \(setTokenAfterPairing)")
    }
}
