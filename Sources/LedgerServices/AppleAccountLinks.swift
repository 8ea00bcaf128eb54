import Foundation
import LedgerCore
import LedgerJSON
import LedgerStore
import Logging

/// The Apple account links: which user owns which Apple account (`appTransactionId`). A link is
/// the first event of the account's stream, so the database's one-event-per-version rule lets
/// exactly one user own an account however many servers race; a claim by another user is
/// recorded as a conflict for support and moves nothing. The reconciler's view of the pool
/// (`pool_with_users`) and the history sweeps read the links from the log.
public struct AppleAccountLinks: Sendable {
    let database: Database
    let writer: LedgerWriter
    let events: EventStore

    public init(database: Database, writer: LedgerWriter, events: EventStore) {
        self.database = database
        self.writer = writer
        self.events = events
    }

    /// What a claim did.
    public enum Outcome: String, Codable, Sendable {
        /// The account is now this user's.
        case linked
        /// It was this user's already (a retry, another login): nothing appended.
        case alreadyLinked = "already-linked"
        /// Another user owns it: the claim is recorded for support and the link stays.
        case conflict
    }

    public struct Answer: Sendable, Equatable {
        public var outcome: Outcome
        public var appTransactionId: AppTransactionID
        public var userId: UserID
        /// The owner, when it is not `userId`.
        public var ownerUserId: UserID?
    }

    /// Records that `user` presented `account`'s signed AppTransaction.
    public func link(_ account: AppleAccount, to user: UserID, metadata: Data) async throws -> Answer {
        try await database.transactionAgainAfterLostRace { tx in
            try await link(account, to: user, metadata: metadata, in: tx)
        }
    }

    func link(_ account: AppleAccount, to user: UserID, metadata: Data, in tx: DatabaseTransaction) async throws -> Answer {
        let id = account.appTransactionId
        try await writer.lock([id.streamID], in: tx)
        let owner = try await owner(of: id, in: tx)
        if owner == user { return Answer(outcome: .alreadyLinked, appTransactionId: id, userId: user, ownerUserId: nil) }
        if let owner { return try await recordConflict(id, claimedBy: user, owner: owner, metadata: metadata, in: tx) }
        // No link yet, but the ledger knows the account for another user already (its earliest
        // transaction tied to an order): a link would move every later purchase of the account to
        // the claimant, whoever was first. The account is linked to the user the ledger knows,
        // which changes no one's purchases, and the claim is a conflict for support.
        if let tied = try await TransactionPool(database: database).earliestTiedUser(of: id.rawValue, bundleId: account.bundleId, in: tx), tied != user {
            _ = try await recordLink(account, to: tied, metadata: metadata, in: tx)
            return try await recordConflict(id, claimedBy: user, owner: tied, metadata: metadata, in: tx)
        }
        return try await recordLink(account, to: user, metadata: metadata, in: tx)
    }

    /// The account's first event: `user` owns it.
    private func recordLink(_ account: AppleAccount, to user: UserID, metadata: Data, in tx: DatabaseTransaction) async throws -> Answer {
        let id = account.appTransactionId
        let event = try EventCoding.newEvent(
            type: AppleAccountEvents.linked, AppleAccountEvents.Linked(account: account, userId: user),
            id: EventID.named(AppleAccountEvents.linked, id.rawValue, user.rawValue), metadata: metadata)
        _ = try await writer.append(LedgerWriter.Write(LedgerWriter.Append([event], to: id.streamID, expected: .noStream)), in: tx)
        database.logger.info("Apple account linked", metadata: ["apple.app_transaction": "\(id)", "user.id": "\(user)"])
        return Answer(outcome: .linked, appTransactionId: id, userId: user, ownerUserId: nil)
    }

    /// Another user's claim, for support; named by the claimant, so claiming again records one.
    private func recordConflict(
        _ id: AppTransactionID, claimedBy user: UserID, owner: UserID, metadata: Data, in tx: DatabaseTransaction
    ) async throws -> Answer {
        let event = try EventCoding.newEvent(
            type: AppleAccountEvents.conflict, AppleAccountEvents.Conflict(appTransactionId: id, userId: user, ownerUserId: owner),
            id: EventID.named(AppleAccountEvents.conflict, id.rawValue, user.rawValue), metadata: metadata)
        let written = try await writer.append(LedgerWriter.Write(LedgerWriter.Append([event], to: id.streamID)), in: tx)
        if !written.replayed {
            database.logger.warning("an Apple account another user owns was claimed", metadata: [
                "apple.app_transaction": "\(id)", "user.id": "\(user)", "apple.owner": "\(owner)"])
        }
        return Answer(outcome: .conflict, appTransactionId: id, userId: user, ownerUserId: owner)
    }

    /// The user who owns the account, if one does: the one its first event, the link, names.
    func owner(of id: AppTransactionID, in tx: DatabaseTransaction) async throws -> UserID? {
        struct Owner: Decodable { let userId: String }
        guard let link = try await events.firstEvent(of: id.streamID, in: tx) else { return nil }
        return UserID(unchecked: try EventCoding.decoder.decode(Owner.self, from: link.data).userId)
    }
}
