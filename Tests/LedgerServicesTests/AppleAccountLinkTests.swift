import Foundation
import LedgerCore
import LedgerServices
import LedgerStore
import LedgerTestSupport
import Testing

/// One owner per Apple account, decided in the database however many claims race.
@Suite("Apple account links under concurrency")
struct AppleAccountLinkTests {
    @Test("12 users claim one account at once, each through its own client: one owns it, 11 conflicts are recorded, the link event is stored once")
    func oneOwner() async throws {
        try await withTestDatabase { db in
            let metadata = Data(#"{"appendedBy":"test"}"#.utf8)
            let account = AppleAccount(appTransactionId: AppTransactionID(unchecked: "acct-race"), environment: "Sandbox", bundleId: "com.example.game")
            let answers = try await withThrowingTaskGroup(of: AppleAccountLinks.Answer.self) { group in
                for index in 0..<12 {
                    // A writer each, as on servers of their own.
                    let links = ServiceAssembly(database: db.database).accounts
                    group.addTask { try await links.link(account, to: UserID(unchecked: "racer-\(index)"), metadata: metadata) }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(answers.count == 12)
            let owners = answers.filter { $0.outcome == .linked }
            #expect(owners.count == 1, "\(answers.map(\.outcome))")
            #expect(answers.filter { $0.outcome == .conflict }.allSatisfy { $0.ownerUserId == owners.first?.userId })
            #expect(answers.filter { $0.outcome == .conflict }.count == 11)
            let stored = try await EventStore(database: db.database).readStream(account.appTransactionId.streamID)
            #expect(stored.count == 12)
            #expect(stored.filter { $0.type == AppleAccountEvents.linked }.count == 1 && stored.first?.type == AppleAccountEvents.linked)
        }
    }
}
