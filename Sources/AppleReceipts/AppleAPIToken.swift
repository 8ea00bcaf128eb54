import Foundation
import JWTKit

/// The bearer token of an Apple API key (ES256, `typ` JWT, the key's id as `kid`), for the App
/// Store Server API and the App Store Connect API alike: made when none is valid, and reused
/// until a minute before it expires.
final class AppleAPIToken: Sendable {
    private let keys = JWTKeyCollection()
    private let keyID: String
    private let cache = TokenCache()
    /// How long before its expiry a new token is made.
    static let renewal: TimeInterval = 60

    init(keyID: String, key: ES256PrivateKey) async {
        self.keyID = keyID
        await keys.add(ecdsa: key, kid: JWKIdentifier(string: keyID))
    }

    /// The token of the moment; `claims` gives a new one's claims from the times it is issued
    /// (`backdated` before now, for a clock a little ahead of Apple's) and expires (`lifetime`
    /// after now).
    func bearer<Claims: JWTPayload>(
        lifetime: TimeInterval, backdated: TimeInterval = 0, _ claims: (_ issued: Int, _ expires: Int) -> Claims
    ) async throws -> String {
        let now = Date()
        if let cached = await cache.valid(at: now.addingTimeInterval(Self.renewal)) { return cached }
        let issued = Int(now.timeIntervalSince1970 - backdated)
        let expires = Int(now.timeIntervalSince1970) + Int(lifetime)
        var header = JWTHeader()
        header.typ = "JWT"
        let signed = try await keys.sign(claims(issued, expires), kid: JWKIdentifier(string: keyID), header: header)
        await cache.set(signed, expires: Date(timeIntervalSince1970: TimeInterval(expires)))
        return signed
    }

    /// Forgets the token (Apple refused it).
    func clear() async { await cache.clear() }
}

/// The claims of an Apple API token: the key's issuer, when it was issued and expires, the
/// audience (`appstoreconnect-v1` for both APIs) and, for the App Store Server API, the app
/// (`bid`; a Team key of App Store Connect reaches every app and names none).
public struct AppleAPIClaims: JWTPayload, Equatable {
    public var iss: String
    public var iat: Int
    public var exp: Int
    public var aud: String
    public var bid: String?

    public init(iss: String, iat: Int, exp: Int, aud: String, bid: String? = nil) {
        (self.iss, self.iat, self.exp, self.aud, self.bid) = (iss, iat, exp, aud, bid)
    }

    public func verify(using _: some JWTAlgorithm) async throws {
        guard Date(timeIntervalSince1970: TimeInterval(exp)) > Date() else { throw JWTError.claimVerificationFailure(failedClaim: nil, reason: "expired") }
    }
}

/// The wait after `failures` failures in a row: `first`, doubled after each, at most `cap`.
func backoff(after failures: Int, first: Duration, cap: Duration) -> Duration {
    var wait = first
    for _ in 1..<max(failures, 1) {
        wait *= 2
        if wait >= cap { break }
    }
    return min(wait, cap)
}
