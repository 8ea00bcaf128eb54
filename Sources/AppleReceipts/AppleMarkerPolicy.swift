import SwiftASN1
import X509

/// Apple's marker extensions: the leaf of a signing chain carries 1.2.840.113635.100.6.11.1
/// (App Store receipt signing) and the intermediate 1.2.840.113635.100.6.2.1 (Apple WWDR CA).
/// A chain from the right root without them is not an App Store signing chain.
struct AppleMarkerPolicy: VerifierPolicy {
    static let leafMarker: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 11, 1]
    static let intermediateMarker: ASN1ObjectIdentifier = [1, 2, 840, 113635, 100, 6, 2, 1]

    // The markers carry no constraint to enforce, so a chain that marks them critical is
    // refused by the verifier rather than silently accepted.
    let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = []

    func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) async -> PolicyEvaluationResult {
        guard chain.count == 3 else {
            return .failsToMeetPolicy(reason: "the chain has \(chain.count) certificates; an App Store chain has 3")
        }
        guard chain[0].extensions[oid: Self.leafMarker] != nil else {
            return .failsToMeetPolicy(reason: "the leaf certificate lacks Apple's marker \(Self.leafMarker)")
        }
        guard chain[1].extensions[oid: Self.intermediateMarker] != nil else {
            return .failsToMeetPolicy(reason: "the intermediate certificate lacks Apple's marker \(Self.intermediateMarker)")
        }
        return .meetsPolicy
    }
}
