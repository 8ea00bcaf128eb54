/// Where a verifier finds the app a proof is for, by the bundle id Apple signed: the apps the
/// ledger holds (LedgerServices' `AppDirectory` over the `apps` table).
public protocol AppleAppDirectory: Sendable {
    /// The app of `bundleId` (found whatever its case, as Apple holds bundle ids), or nil when
    /// the ledger holds none. A lookup that cannot be made is a retryable error.
    func app(bundleId: String) async throws(AppleVerificationError) -> AppleProofVerifier.App?

    /// The legacy shared secrets the apps hold, by bundle id in lower case.
    func sharedSecrets() async throws(AppleVerificationError) -> [String: String]
}

extension AppleVerificationError {
    /// A proof for an app the ledger does not hold: refused, and nothing of it is stored.
    public static func unknownApp(_ bundleId: String?, part: String = "signed") -> Self {
        Self(
            code: "unknown-app",
            message: "\(part) for bundle \"\(bundleId ?? "")\", which this ledger does not hold (ledger apps add, or POST /v1/apps)")
    }

    /// The code of `notReached`, the API's for any app a key does not reach.
    public static let notReachedCode = "app-not-allowed"

    /// Whether this refuses a proof of an app its sender does not reach (`bundleId` names it).
    public var isNotReached: Bool { code == Self.notReachedCode }

    /// A proof for an app the sender may not reach (`AppleProofVerifier.reaching`): refused
    /// before anything of its app is looked at, whether the ledger holds it or not.
    static func notReached(_ bundleId: String?) -> Self {
        Self(code: notReachedCode, message: "the proof is for bundle \"\(bundleId ?? "")\", which the sender does not reach", bundleId: bundleId ?? "")
    }

    /// Production-signed data of an app without its Apple id: Apple's verifier refuses to check
    /// production without one. Retryable: the operator sets it, and the proof is fine.
    static func appAppleIdMissing(_ bundleId: String) -> Self {
        Self(
            code: "app-apple-id-missing",
            message: "Production-signed data of \(bundleId) needs the app's Apple id: set it (ledger apps set --app-apple-id)",
            isRetryable: true, bundleId: bundleId)
    }
}
