import Hummingbird
import LedgerCore

/// The body `{userId?}` of the admin routes that may also come without one (the Apple order
/// lookup, a history sweep): the user named, or nil for an empty body.
struct OptionalUserBody: ClosedBody {
    let userId: UserID?

    enum CodingKeys: String, CodingKey, CaseIterable { case userId }
    static var elsewhere: [String: String] { ["bundleId": "the app goes in the query: ?bundleId="] }

    static func user(of request: Request, _ context: LedgerRequestContext) async throws -> UserID? {
        let body = try await request.bodyWhole(upTo: context.maxUploadSize)
        guard body.readableBytes > 0 else { return nil }
        let user = try LedgerRequestDecoder.decode(Self.self, from: body).userId
        // What Apple answers is recorded as this user's: one no order can have is refused.
        try user?.checkGiven()
        return user
    }
}
