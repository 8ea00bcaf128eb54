import AppleReceipts
import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import Logging

/// The calls the ledger makes to Apple because of what its log says (docs/apple.md): consumption
/// answers to `CONSUMPTION_REQUEST`, Finish Transaction after delivery, Set App Account Token
/// after a late pairing. A pass feeds the queue from the log, then makes the due calls: a failure
/// Apple may get over (busy, away, rate-limited, refusing the key) is tried again later with
/// backoff, never before Apple's `Retry-After`; a refusal is recorded and not tried again.
public struct AppleCalls: Sendable {
    let api: LazyAppStoreServerAPI
    public let queue: AppleCallQueue
    public var switches: AppleCallQueue.Switches
    /// Calls made per pass.
    public var batch = 50
    /// The first retry's delay; each later one doubles it, up to an hour.
    public var backoff: TimeInterval = 30
    /// Tries before a finish or token call is given up (a consumption answer has its 12 hours).
    public var attempts = 20
    /// How long a server holds the calls it took before another may take them.
    public var lease: TimeInterval = 300
    let logger: Logger

    public init(api: LazyAppStoreServerAPI, queue: AppleCallQueue, switches: AppleCallQueue.Switches, logger: Logger) {
        self.api = api
        self.queue = queue
        self.switches = switches
        self.logger = logger
    }

    /// What a pass did: calls queued from the log, and the calls made by `<kind> <outcome>`
    /// (`sent`, `refused`, `too-late`, `retrying`, `given-up`, `dropped`; `skipped`: its app has
    /// no key, tried again later).
    public struct Summary: Sendable, Equatable {
        public var queued = 0
        public var calls: [String: Int] = [:]
        public init() {}
    }

    /// One pass: the feed until it has caught up, then the calls due now.
    public func run(metadata: Data = Data(#"{"appendedBy":"apple-calls"}"#.utf8)) async throws -> Summary {
        var summary = Summary()
        summary.queued = try await queue.catchUp(switches)
        while !Task.isCancelled {
            let calls = try await queue.claim(batch: batch, lease: lease)
            if calls.isEmpty { break }
            for call in calls {
                // Apple slow on the calls before it: a call whose lease ran out meanwhile may be
                // another server's now, and is left to it (made twice, Apple would be asked twice).
                guard try await queue.leases.renew(call.lease, for: lease) else { continue }
                let outcome: String
                do {
                    outcome = try await make(call, metadata: metadata)
                } catch let error where !(error is CancellationError) {
                    // A call the ledger cannot make (its facts unreadable) is tried again later,
                    // and the calls after it go on; a database that does not answer fails the
                    // pass here too.
                    logger.error("a call to Apple could not be made; it is tried again later", metadata: [
                        "apple.call": "\(call.kind.rawValue)", "apple.transaction": "\(call.transactionId)", "error.message": "\(String(describing: error))"])
                    try await queue.retry(call, at: Date().addingTimeInterval(Self.afterFailure), error: "\(error)", appleErrorCode: nil)
                    outcome = "failed"
                }
                summary.calls["\(call.kind.rawValue) \(outcome)", default: 0] += 1
            }
            if calls.count < batch { break }
        }
        return summary
    }

    /// How long a call the ledger could not make waits before it is tried again.
    static let afterFailure: TimeInterval = 300

    /// Makes one call with the key of the transaction's app, at its environment's host, and
    /// settles or reschedules it; answers its outcome. An app without a key (or whose key cannot
    /// be read) has its calls tried again later, as when Apple refuses a key: the operator may
    /// give it one.
    func make(_ call: AppleCallQueue.Call, metadata: Data) async throws -> String {
        let client: AppStoreServerAPI
        do {
            client = try await api.client(for: call.bundleId, environment: AppleEnvironment(stored: call.environment))
        } catch let error as AppStoreServerAPIError {
            if call.kind == .consumption, let deadline = call.deadline, retryDate(call, error) >= deadline {
                return try await make(call, failing: error, metadata: metadata)
            }
            try await queue.retry(call, at: retryDate(call, error), error: error.description, appleErrorCode: nil)
            return "skipped"
        }
        return try await make(call, with: client, metadata: metadata)
    }

    /// A consumption request that can no longer be answered in time, for want of a client.
    private func make(_ call: AppleCallQueue.Call, failing error: AppStoreServerAPIError, metadata: Data) async throws -> String {
        let fields = try await queue.consumptionFacts(call.transactionId).fields
        let answer = ConsumptionAnswer(
            notificationUUID: call.notificationUUID ?? UUID(), transactionId: call.transactionId, outcome: .tooLate,
            deliveryStatus: fields.deliveryStatus, customerConsented: true, sampleContentProvided: fields.sampleContentProvided,
            refundPreference: fields.refundPreference?.rawValue, consumptionPercentage: fields.consumptionPercentage,
            preferenceAdjusted: fields.preferenceAdjusted?.rawValue, sampleContentDefaulted: fields.sampleContentDefaulted ? true : nil,
            attempts: call.attempts - 1, error: error.code, appleErrorCode: nil)
        try await queue.settle(call, answer: answer, metadata: metadata)
        logger.warning("a consumption request was not answered", metadata: [
            "apple.transaction": "\(call.transactionId)", "outcome": "too-late", "error": "\(error.code)"])
        return ConsumptionAnswer.Outcome.tooLate.rawValue
    }

    /// Makes one call with `client` and settles or reschedules it; answers its outcome.
    func make(_ call: AppleCallQueue.Call, with client: AppStoreServerAPI, metadata: Data) async throws -> String {
        switch call.kind {
        case .consumption: try await answer(call, with: client, metadata: metadata)
        case .finish, .setToken: try await changeAtApple(call, with: client, metadata: metadata)
        }
    }

    /// Answers a consumption request with what the ledger knows now, within its 12 hours.
    private func answer(_ call: AppleCallQueue.Call, with client: AppStoreServerAPI, metadata: Data) async throws -> String {
        let fields = try await queue.consumptionFacts(call.transactionId).fields
        let information = AppStoreServerAPI.ConsumptionInformation(
            customerConsented: true, deliveryStatus: fields.deliveryStatus.rawValue, sampleContentProvided: fields.sampleContentProvided,
            refundPreference: fields.refundPreference?.rawValue, consumptionPercentage: fields.consumptionPercentage)
        func record(_ outcome: ConsumptionAnswer.Outcome, _ error: AppStoreServerAPIError?) async throws -> String {
            let answer = ConsumptionAnswer(
                notificationUUID: call.notificationUUID ?? UUID(), transactionId: call.transactionId, outcome: outcome,
                deliveryStatus: fields.deliveryStatus, customerConsented: true, sampleContentProvided: fields.sampleContentProvided,
                refundPreference: fields.refundPreference?.rawValue, consumptionPercentage: fields.consumptionPercentage,
                preferenceAdjusted: fields.preferenceAdjusted?.rawValue, sampleContentDefaulted: fields.sampleContentDefaulted ? true : nil,
                // Taking the call counted a try; found too late before calling, none was made.
                attempts: outcome == .tooLate && error == nil ? call.attempts - 1 : call.attempts,
                error: error?.code, appleErrorCode: error?.appleErrorCode)
            try await queue.settle(call, answer: answer, metadata: metadata)
            if outcome != .sent {
                logger.warning("a consumption request was not answered", metadata: [
                    "apple.transaction": "\(call.transactionId)", "outcome": "\(outcome.rawValue)", "error": "\(error?.code ?? "")",
                    "apple.error_code": "\(error?.appleErrorCode.map(String.init) ?? "")"])
            }
            return outcome.rawValue
        }
        if let deadline = call.deadline, deadline <= Date() { return try await record(.tooLate, nil) }
        do {
            try await client.sendConsumptionInformation(call.transactionId.rawValue, information)
            return try await record(.sent, nil)
        } catch let error as AppStoreServerAPIError {
            guard Self.isPassing(error) else { return try await record(.refused, error) }
            let next = retryDate(call, error)
            if let deadline = call.deadline, next >= deadline { return try await record(.tooLate, error) }
            try await queue.retry(call, at: next, error: error.description, appleErrorCode: error.appleErrorCode)
            return "retrying"
        }
    }

    /// Finish Transaction, or Set App Account Token with the token of the order holding the
    /// transaction now; the outcome is recorded on the stream `apple-calls-<transactionId>`, not
    /// on the order's, so that it never moves an order's version under a client's expectedVersion.
    private func changeAtApple(_ call: AppleCallQueue.Call, with client: AppStoreServerAPI, metadata: Data) async throws -> String {
        var target: (order: OrderID, token: UUID, originalTransactionId: String)?
        if call.kind == .setToken {
            target = try await queue.tokenTarget(call.transactionId)
            // Support undid the pairing meanwhile: no token to set.
            if target == nil {
                try await queue.settle(call, event: nil, on: call.streamId)
                return "dropped"
            }
        }
        func record(_ outcome: String, _ error: AppStoreServerAPIError?) async throws -> String {
            let body = ChangeAtApple(
                outcome: outcome, transactionId: call.transactionId.rawValue, originalTransactionId: target?.originalTransactionId,
                orderId: target?.order.rawValue ?? call.orderId?.rawValue, appAccountToken: target?.token.uuidString.lowercased(),
                attempts: call.attempts, error: error?.code, appleErrorCode: error?.appleErrorCode)
            let type = call.kind == .finish ? "apple-transaction-finished" : "apple-account-token-set"
            let event = try EventCoding.newEvent(type: type, body, id: EventID.named("apple-call", call.id), metadata: metadata)
            try await queue.settle(call, event: event, on: StreamID(unchecked: "apple-calls-" + call.transactionId.rawValue))
            if outcome != "sent" {
                logger.warning("a call to Apple was not made", metadata: [
                    "apple.call": "\(call.id)", "outcome": "\(outcome)", "error": "\(error?.code ?? "")"])
            }
            return outcome
        }
        do {
            if let target {
                try await client.setAppAccountToken(target.originalTransactionId, target.token)
            } else {
                try await client.finishTransaction(call.transactionId.rawValue)
            }
            return try await record("sent", nil)
        } catch let error as AppStoreServerAPIError {
            guard Self.isPassing(error) else { return try await record("refused", error) }
            guard call.attempts < attempts else { return try await record("given-up", error) }
            try await queue.retry(call, at: retryDate(call, error), error: error.description, appleErrorCode: error.appleErrorCode)
            return "retrying"
        }
    }

    /// Apple busy, away, rate-limiting, or refusing the key (which the operator can mend): worth
    /// trying again. Any other refusal is Apple's answer to this call.
    static func isPassing(_ error: AppStoreServerAPIError) -> Bool {
        error.isAppleAway || error.code == "apple-api-unauthorized" || error.code == "apple-api-key-invalid"
    }

    /// When to try again: `backoff` doubled per try made, at most an hour, never before Apple's
    /// `Retry-After`.
    func retryDate(_ call: AppleCallQueue.Call, _ error: AppStoreServerAPIError) -> Date {
        let delay = min(backoff * pow(2, Double(max(0, call.attempts - 1))), 3600)
        let next = Date().addingTimeInterval(delay)
        return error.retryAt.map { max($0, next) } ?? next
    }

    /// The body of an `apple-transaction-finished` or `apple-account-token-set` event.
    struct ChangeAtApple: Encodable {
        let outcome: String
        let transactionId: String
        let originalTransactionId: String?
        let orderId: String?
        let appAccountToken: String?
        let attempts: Int
        let error: String?
        let appleErrorCode: Int?
    }
}
