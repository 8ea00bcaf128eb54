import Crypto
import Foundation
import JWTKit
import Synchronization
import X509
@_spi(FixedExpiryValidationTime) import X509

/// Verifies Apple's signed data (StoreKit 2 transactions, App Store Server Notifications V2): a
/// JWS signed with ES256 by the leaf of an `x5c` chain of exactly three certificates that leads
/// to a configured root, with Apple's marker extensions, each certificate valid at the payload's
/// `signedDate`. Chains already verified are cached, so a busy app's one signing chain costs one
/// chain validation, then one signature check per token.
public final class SignedDataVerifier: Sendable {
    /// Apple's tokens are a few kilobytes (three certificates and a payload); anything this big is not one.
    public static let maximumTokenBytes = 64 * 1024
    static let maximumCachedChains = 64

    let roots: CertificateStore
    public let rootCount: Int
    /// The verified chains by the encoded JWS header that carried them (alg ES256 and the x5c):
    /// the leaf's key, and the time every certificate of the chain is valid in (checked against
    /// each payload's own `signedDate`).
    private let chains = Mutex<[HeaderKey: VerifiedChain]>([:])

    /// An encoded header as the cache's key. An `ArraySlice`'s own hash feeds the hasher a byte at
    /// a time, some 4,000 calls for a header with its chain: 3% of a receipt's server CPU. This
    /// one hashes the length and the first bytes as one run (the leaf certificate, first in x5c,
    /// begins with its serial number); equality compares the whole header.
    struct HeaderKey: Hashable, Sendable {
        let bytes: ArraySlice<UInt8>
        static let hashedBytes = 512

        func hash(into hasher: inout Hasher) {
            hasher.combine(bytes.count)
            bytes.prefix(Self.hashedBytes).withUnsafeBytes { hasher.combine(bytes: $0) }
        }

        static func == (lhs: Self, rhs: Self) -> Bool {
            lhs.bytes.count == rhs.bytes.count && lhs.bytes.withUnsafeBytes { left in
                rhs.bytes.withUnsafeBytes { right in left.isEmpty || memcmp(left.baseAddress!, right.baseAddress!, left.count) == 0 }
            }
        }
    }

    struct VerifiedChain: Sendable {
        let key: P256.Signing.PublicKey
        let notBefore: Date
        let notAfter: Date
    }

    public init(rootCertificates: [Certificate]) {
        roots = CertificateStore(rootCertificates)
        rootCount = rootCertificates.count
    }

    /// The payload of `token` once its chain and signature verify; an `AppleVerificationError`
    /// naming the problem otherwise. The payload's own fields (bundle, environment) are the
    /// caller's to check.
    public func verify<Payload: AppleSignedPayload>(_ token: String, as _: Payload.Type = Payload.self) async throws(AppleVerificationError) -> Payload {
        guard token.utf8.count <= Self.maximumTokenBytes else { throw .tooLarge }
        guard rootCount > 0 else {
            throw AppleVerificationError(code: "verification-unavailable", message: "no Apple root certificates are configured (LEDGER_APPLE_ROOT_CERTS)", isRetryable: true)
        }
        let bytes = Array(token.utf8)
        let dots = bytes.indices.filter { bytes[$0] == UInt8(ascii: ".") }
        guard dots.count == 2 else { throw .malformed("a JWS has three dot-separated parts; this has \(dots.count + 1)") }
        // A header already verified (the same alg and x5c text) is known by its encoded form:
        // only the payload needs decoding. Otherwise jwt-kit parses the whole token.
        let headerKey = HeaderKey(bytes: bytes[..<dots[0]])
        let unverified: Payload
        let chain: VerifiedChain
        if let known = chains.withLock({ $0[headerKey] }) {
            guard let payload = Self.base64URLDecoded(bytes[(dots[0] + 1)..<dots[1]]) else {
                throw .malformed("the payload is not base64url JSON of a signed Apple payload")
            }
            do {
                unverified = try JSONDecoder().decode(Payload.self, from: Data(payload))
            } catch {
                throw .malformed(Self.payloadProblem(error))
            }
            try Self.checkDates(of: unverified)
            try Self.checkNoNUL(payload)
            chain = known
        } else {
            let header: JWTHeader
            do {
                (header, unverified, _) = try DefaultJWTParser().parse(bytes, as: Payload.self)
            } catch {
                // jwt-kit's words wrap the decoder's: a payload of another shape is named by its field.
                if let payload = Self.base64URLDecoded(bytes[(dots[0] + 1)..<dots[1]]) {
                    do { _ = try JSONDecoder().decode(Payload.self, from: Data(payload)) } catch let decoding as DecodingError {
                        if case .dataCorrupted = decoding {} else { throw .malformed(Self.payloadProblem(decoding)) }
                    } catch {}
                }
                throw .malformed("the token is not a JWS with a base64url JSON header and payload (\(Self.reason(error)))")
            }
            try Self.checkDates(of: unverified)
            if let payload = Self.base64URLDecoded(bytes[(dots[0] + 1)..<dots[1]]) { try Self.checkNoNUL(payload) }
            guard header.alg == "ES256" else { throw .unsupportedAlgorithm(header.alg) }
            guard let x5c = header.x5c, x5c.count == 3 else {
                throw .chain("the x5c header must hold exactly 3 certificates; it holds \(header.x5c?.count ?? 0)")
            }
            chain = try await verifiedChain(x5c, at: unverified.signedAt, cacheKey: headerKey)
        }
        let signedAt = unverified.signedAt
        guard chain.notBefore <= signedAt, signedAt <= chain.notAfter else {
            throw .chain("a certificate of the chain is not valid at signedDate \(signedAt)")
        }
        // ES256 (RFC 7518 §3.4): the raw r‖s signature over "header.payload", with the leaf's key.
        guard let signatureBytes = Self.base64URLDecoded(bytes[(dots[1] + 1)...]),
              let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureBytes),
              chain.key.isValidSignature(signature, for: SHA256.hash(data: bytes[..<dots[1]]))
        else { throw .badSignature }
        return unverified
    }

    /// The milliseconds since 1970 of the dates the ledger keeps: the years 1970 to 9999, as its
    /// events' ISO 8601 times are written.
    public static let keptDates: ClosedRange<Int64> = 0...253_402_300_799_999

    /// Refuses a payload with a date outside `keptDates`, naming it: such a date could never be
    /// stored, and Apple never signs one.
    static func checkDates(of payload: some AppleSignedPayload) throws(AppleVerificationError) {
        for (name, milliseconds) in payload.dates {
            if let milliseconds, !keptDates.contains(milliseconds) {
                throw .malformed("the payload's \(name) (\(milliseconds) ms since 1970) is outside the years 1970 to 9999")
            }
        }
    }

    /// Refuses a payload with a NUL character in a string (`\u0000`, the only way JSON writes
    /// one): PostgreSQL stores none, in text or JSON, and Apple never signs one.
    static func checkNoNUL(_ payload: [UInt8]) throws(AppleVerificationError) {
        let nul = Array(#"\u0000"#.utf8)
        var index = payload.startIndex
        while let slash = payload[index...].firstIndex(of: UInt8(ascii: "\\")) {
            if payload[slash...].starts(with: nul) {
                throw .malformed("the payload holds a NUL character (\\u0000) in a string; Apple never signs one")
            }
            // An escaped backslash is skipped whole: `\\u0000` is a backslash, then text.
            index = payload.index(slash, offsetBy: 2, limitedBy: payload.endIndex) ?? payload.endIndex
        }
    }

    /// Validates the chain at `date` and caches it under the token's encoded header.
    private func verifiedChain(_ x5c: [String], at date: Date, cacheKey: HeaderKey) async throws(AppleVerificationError) -> VerifiedChain {
        let certificates: [Certificate]
        do {
            certificates = try x5c.map { encoded in
                guard let der = Data(base64Encoded: encoded) else { throw AppleVerificationError.chain("an x5c entry is not base64") }
                return try Certificate(derEncoded: Array(der))
            }
        } catch let error as AppleVerificationError {
            throw error
        } catch {
            throw .chain("an x5c entry is not a DER certificate (\(Self.reason(error)))")
        }
        var verifier = Verifier(rootCertificates: roots) {
            RFC5280Policy(fixedExpiryValidationTime: date)
            AppleMarkerPolicy()
        }
        let result = await verifier.validate(leaf: certificates[0], intermediates: CertificateStore([certificates[1]]))
        guard case .validCertificate(let validated) = result else {
            if case .couldNotValidate(let failures) = result {
                let reasons = failures.map { $0.policyFailureReason.description }
                throw .chain(reasons.isEmpty ? "no chain to a trusted root" : Array(Set(reasons)).sorted().joined(separator: "; "))
            }
            throw .chain("no chain to a trusted root")
        }
        guard let key = P256.Signing.PublicKey(certificates[0].publicKey) else {
            throw .chain("the leaf certificate's key is not a P-256 key")
        }
        let chain = VerifiedChain(
            key: key,
            notBefore: validated.map(\.notValidBefore).max() ?? date,
            notAfter: validated.map(\.notValidAfter).min() ?? date)
        chains.withLock { cache in
            if cache.count >= Self.maximumCachedChains { cache.removeAll() }
            cache[cacheKey] = chain
        }
        return chain
    }

    /// Base64url without padding (RFC 7515 §2) to bytes; nil on any other character.
    static func base64URLDecoded(_ text: ArraySlice<UInt8>) -> [UInt8]? {
        var out: [UInt8] = []
        out.reserveCapacity(text.count * 3 / 4)
        var buffer: UInt32 = 0
        var bits = 0
        for character in text {
            let value: UInt8
            switch character {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): value = character - UInt8(ascii: "A")
            case UInt8(ascii: "a")...UInt8(ascii: "z"): value = character - UInt8(ascii: "a") + 26
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = character - UInt8(ascii: "0") + 52
            case UInt8(ascii: "-"): value = 62
            case UInt8(ascii: "_"): value = 63
            default: return nil
            }
            buffer = (buffer << 6) | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: buffer >> UInt32(bits)))
            }
        }
        return bits >= 6 ? nil : out
    }

    /// What is wrong with a payload that is not the one expected, by Apple's field names.
    static func payloadProblem(_ error: any Error) -> String {
        func path(_ context: DecodingError.Context, _ last: CodingKey? = nil) -> String {
            (context.codingPath + (last.map { [$0] } ?? [])).map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
        }
        switch error as? DecodingError {
        case .keyNotFound(let key, let context)?: return "the payload has no \(path(context, key))"
        case .typeMismatch(_, let context)? where !context.codingPath.isEmpty: return "the payload's \(path(context)) is not of the type Apple signs"
        case .valueNotFound(_, let context)? where !context.codingPath.isEmpty: return "the payload's \(path(context)) is null"
        default: return "the payload is not base64url JSON of a signed Apple payload"
        }
    }

    static func reason(_ error: any Error) -> String {
        String(describing: error).prefix(200).description
    }
}
