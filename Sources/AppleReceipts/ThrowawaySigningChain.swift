import Crypto
import Foundation
import JWTKit
import SwiftASN1
import X509

/// A root → intermediate → leaf chain made on the spot and the signer for it: what tests, the
/// benchmark and `ledger demo` sign "Apple" data with. Trusted only where its root is passed in
/// explicitly; `ledger serve` never trusts one.
public struct ThrowawaySigningChain: Sendable {
    /// What to leave out or change, for tests of the refusals.
    public struct Options: Sendable {
        public var leafMarker = true
        public var intermediateMarker = true
        public var leafNotBefore = Date(timeIntervalSinceNow: -86_400 * 365)
        public var leafNotAfter = Date(timeIntervalSinceNow: 86_400 * 365)
        public init() {}
    }

    public let root: Certificate
    public let intermediate: Certificate
    public let leaf: Certificate
    let leafKey: P256.Signing.PrivateKey

    public init(name: String = "Order Ledger throwaway", options: Options = Options()) throws {
        let rootKey = P256.Signing.PrivateKey()
        let intermediateKey = P256.Signing.PrivateKey()
        leafKey = P256.Signing.PrivateKey()
        let rootName = try DistinguishedName { CommonName("\(name) Root CA") }
        let intermediateName = try DistinguishedName { CommonName("\(name) Intermediate CA") }
        let leafName = try DistinguishedName { CommonName("\(name) Signing") }
        let long = (Date(timeIntervalSinceNow: -86_400 * 3650), Date(timeIntervalSinceNow: 86_400 * 3650))
        root = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(rootKey.publicKey),
            notValidBefore: long.0, notValidAfter: long.1, issuer: rootName, subject: rootName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                KeyUsage(keyCertSign: true, cRLSign: true)
            },
            issuerPrivateKey: .init(rootKey))
        intermediate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(intermediateKey.publicKey),
            notValidBefore: long.0, notValidAfter: long.1, issuer: rootName, subject: intermediateName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                KeyUsage(keyCertSign: true, cRLSign: true)
                if options.intermediateMarker { Self.marker(AppleMarkerPolicy.intermediateMarker) }
            },
            issuerPrivateKey: .init(rootKey))
        leaf = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(leafKey.publicKey),
            notValidBefore: options.leafNotBefore, notValidAfter: options.leafNotAfter, issuer: intermediateName, subject: leafName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                KeyUsage(digitalSignature: true)
                if options.leafMarker { Self.marker(AppleMarkerPolicy.leafMarker) }
            },
            issuerPrivateKey: .init(intermediateKey))
    }

    /// Apple's marker extensions hold an ASN.1 NULL.
    static func marker(_ oid: ASN1ObjectIdentifier) -> Certificate.Extension {
        Certificate.Extension(oid: oid, critical: false, value: [0x05, 0x00])
    }

    /// The root as PEM, for a roots file.
    public func rootPEM() throws -> String { try root.serializeAsPEM().pemString }

    /// The chain as a JWS `x5c` header holds it: base64 DER, leaf first.
    public func x5c() throws -> [String] {
        try [leaf, intermediate, root].map { certificate in
            var serializer = DER.Serializer()
            try serializer.serialize(certificate)
            return Data(serializer.serializedBytes).base64EncodedString()
        }
    }

    /// `payload` signed with ES256 by the leaf, with the chain in `x5c` (or `x5c` as given, which
    /// may be wrong on purpose). Written out here rather than through jwt-kit's signer, which
    /// insists on a chain that verifies: tests need tokens that do not.
    public func sign(_ payload: some Encodable, x5c: [String]? = nil, alg: String = "ES256") throws -> String {
        let header: [String: AnyEncodable] = ["alg": AnyEncodable(alg), "typ": AnyEncodable("JWT"), "x5c": AnyEncodable(try x5c ?? self.x5c())]
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let input = Self.base64URL(try encoder.encode(header)) + "." + Self.base64URL(try encoder.encode(payload))
        let signature = try leafKey.signature(for: Data(input.utf8))
        return input + "." + Self.base64URL(signature.rawRepresentation)
    }

    static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }
}

/// A value of any encodable type, for a JSON object of mixed values.
struct AnyEncodable: Encodable {
    let encodeValue: (any Encoder) throws -> Void
    init(_ value: some Encodable) { encodeValue = value.encode }
    func encode(to encoder: any Encoder) throws { try encodeValue(encoder) }
}
