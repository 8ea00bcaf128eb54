/// Why Apple's proof was not accepted, with a stable code. `isRetryable` tells the client to send
/// the same proof again later (nothing is wrong with it); the others are definitive rejections.
public struct AppleVerificationError: Error, Sendable, Equatable, CustomStringConvertible {
    public let code: String
    public let message: String
    public let isRetryable: Bool
    /// Apple's verifyReceipt status, when the answer came from there.
    public let appleStatus: Int?
    /// The app the proof is for, when the refusal is of its app: one the sender does not reach
    /// (`notReached`), or one the ledger holds whose own rules refused it (its environments, its
    /// missing Apple id, a purchase Apple took back), for the metrics' `app`.
    public let bundleId: String?
    /// The transaction Apple signed, when its signature verified and what it says was refused
    /// (another app or environment, a revoked purchase): support finds the refusal by it.
    public var transactionId: String? = nil

    public init(code: String, message: String, isRetryable: Bool = false, appleStatus: Int? = nil, bundleId: String? = nil) {
        self.code = code
        self.message = message
        self.isRetryable = isRetryable
        self.appleStatus = appleStatus
        self.bundleId = bundleId
    }

    public var description: String { "\(code): \(message)" }

    static func malformed(_ message: String) -> Self { Self(code: "malformed-token", message: message) }
    static func chain(_ message: String) -> Self { Self(code: "invalid-certificate-chain", message: message) }
    static let tooLarge = Self(code: "token-too-large", message: "the signed token is larger than \(SignedDataVerifier.maximumTokenBytes) bytes")
    static let badSignature = Self(code: "invalid-signature", message: "the signature does not verify with the leaf certificate's key")

    static func unsupportedAlgorithm(_ alg: String?) -> Self {
        Self(code: "unsupported-algorithm", message: "the token's alg is \(alg.map { "\"\($0)\"" } ?? "missing"); only ES256 is accepted")
    }
}
