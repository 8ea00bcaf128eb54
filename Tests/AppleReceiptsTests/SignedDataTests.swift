import AppleReceipts
import Foundation
import JWTKit
import LedgerCore
import LedgerTestSupport
import Testing
import X509

/// A verifier trusting `apple`'s root, for the test app in the sandbox.
func verifier(trusting apple: TestApple, bundleId: String = TestApple.bundleId, environment: AppleEnvironment = .sandbox) throws -> AppleProofVerifier {
    AppleProofVerifier(
        app: .init(bundleId: bundleId, appAppleId: TestApple.appAppleId, environment: environment),
        signedData: SignedDataVerifier(rootCertificates: try AppleRootCertificates.load(paths: [apple.rootFile])),
        verifyReceipt: nil)
}

func base64URL(_ text: String) -> String {
    Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        .replacingOccurrences(of: "=", with: "")
}

/// The refusal code of verifying `token`, or nil when it verified.
func refusal(_ token: String, _ verifier: AppleProofVerifier) async -> String? {
    do {
        _ = try await verifier.transaction(signed: token)
        return nil
    } catch {
        return error.code
    }
}

@Suite("Signed transactions: JWS with an x5c chain to the configured root")
struct SignedDataTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("a transaction signed by the chain verifies and reads as Apple wrote it")
    func verifies() async throws {
        let token = UUID()
        let payload = TestApple.transaction("2000000001", appAccountToken: token)
        let transaction = try await verifier(trusting: apple).transaction(signed: try await apple.sign(payload))
        #expect(transaction.transactionId.rawValue == "2000000001")
        #expect(transaction.productId.rawValue == "gems.100")
        #expect(transaction.appAccountToken == token)
        #expect(transaction.price == "0.99")
        #expect(transaction.environment == "Sandbox")
        #expect(transaction.format == .jws)
        // Another spelling of Apple's environment is read as Apple spells it: the reports count by name.
        var lower = TestApple.transaction("2000000002")
        lower.environment = "sandbox"
        #expect(try await verifier(trusting: apple).transaction(signed: try await apple.sign(lower)).environment == "Sandbox")
        #expect(transaction.receiptSha256.count == 64)
    }

    @Test("Apple's revocationType and revocationPercentage are read from a signed transaction, alone or in a notification")
    func revocations() async throws {
        let verifier = try verifier(trusting: apple)
        var prorated = TestApple.transaction("2000000002")
        prorated.revocationDate = 1_800_000_000_000
        prorated.revocationReason = 1
        prorated.revocationType = "REFUND_PRORATED"
        prorated.revocationPercentage = 25_000
        let expected = Revocation(date: Date(timeIntervalSince1970: 1_800_000_000), reason: 1, type: .refundProrated, percentage: 25_000)
        #expect(try await verifier.transactionAndRevocation(signed: try await apple.sign(prorated)).revocation == expected)
        #expect(try await verifier.notification(signed: try await apple.notification("REFUND", transaction: prorated)).revocation == expected)
        var family = TestApple.transaction("2000000003")
        family.revocationDate = 1_800_000_000_000
        family.revocationType = "FAMILY_REVOKE"
        family.inAppOwnershipType = "FAMILY_SHARED"
        #expect(try await verifier.transactionAndRevocation(signed: try await apple.sign(family)).revocation?.type == .familyRevoke)
        // A type the ledger does not know, or a percentage outside Apple's range, is left out: a full refund.
        prorated.revocationType = "REFUND_SOMEHOW"
        prorated.revocationPercentage = 100_001
        let unknown = try await verifier.transactionAndRevocation(signed: try await apple.sign(prorated)).revocation
        #expect(unknown?.type == nil && unknown?.percentage == nil && unknown?.date == expected.date)
        #expect(try await verifier.transactionAndRevocation(signed: try await apple.sign(TestApple.transaction("2000000004"))).revocation == nil)
    }

    @Test("the same chain verifies many tokens (cached) and each token's signature is still checked")
    func cachedChainStillChecksSignatures() async throws {
        let verifier = try verifier(trusting: apple)
        for n in 0..<20 {
            _ = try await verifier.transaction(signed: try await apple.sign(TestApple.transaction("3000\(n)")))
        }
        let good = try await apple.sign(TestApple.transaction("30009999"))
        let parts = good.split(separator: ".").map(String.init)
        let other = try await apple.sign(TestApple.transaction("30008888"))
        let forged = [parts[0], other.split(separator: ".").map(String.init)[1], parts[2]].joined(separator: ".")
        #expect(await refusal(forged, verifier) == "invalid-signature")
    }

    @Test("alg none is refused")
    func algNone() async throws {
        let header = base64URL(#"{"alg":"none","x5c":\#(String(data: try JSONEncoder().encode(try apple.chain.x5c()), encoding: .utf8)!)}"#)
        let payload = base64URL(String(data: try JSONEncoder().encode(TestApple.transaction("1")), encoding: .utf8)!)
        #expect(await refusal("\(header).\(payload).", try verifier(trusting: apple)) == "unsupported-algorithm")
    }

    @Test("HS256 is refused, even signed with a key the attacker knows")
    func hs256() async throws {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: String(repeating: "attacker-known-secret", count: 2)), digestAlgorithm: .sha256)
        // jwt-kit will not sign with an x5c that is not PEM, so this token has none: the
        // algorithm is refused before the chain is looked at.
        let token = try await keys.sign(TestApple.transaction("1"))
        #expect(await refusal(token, try verifier(trusting: apple)) == "unsupported-algorithm")
    }

    @Test("a bad signature is refused")
    func badSignature() async throws {
        let token = try await apple.sign(TestApple.transaction("1"))
        var parts = token.split(separator: ".").map(String.init)
        parts[2] = String(parts[2].reversed())
        #expect(await refusal(parts.joined(separator: "."), try verifier(trusting: apple)) == "invalid-signature")
    }

    @Test("a chain to an untrusted root is refused")
    func untrustedRoot() async throws {
        let stranger = try TestApple()
        let token = try await stranger.sign(TestApple.transaction("1"))
        #expect(await refusal(token, try verifier(trusting: apple)) == "invalid-certificate-chain")
    }

    @Test("a leaf without Apple's marker OID is refused")
    func missingLeafMarker() async throws {
        var options = ThrowawaySigningChain.Options()
        options.leafMarker = false
        let unmarked = try TestApple(options: options)
        let token = try await unmarked.sign(TestApple.transaction("1"))
        #expect(await refusal(token, try verifier(trusting: unmarked)) == "invalid-certificate-chain")
    }

    @Test("an intermediate without Apple's marker OID is refused")
    func missingIntermediateMarker() async throws {
        var options = ThrowawaySigningChain.Options()
        options.intermediateMarker = false
        let unmarked = try TestApple(options: options)
        let token = try await unmarked.sign(TestApple.transaction("1"))
        #expect(await refusal(token, try verifier(trusting: unmarked)) == "invalid-certificate-chain")
    }

    @Test("a leaf expired at signedDate is refused, also once the chain is cached")
    func expiredLeaf() async throws {
        var options = ThrowawaySigningChain.Options()
        options.leafNotBefore = Date(timeIntervalSinceNow: -86_400 * 10)
        options.leafNotAfter = Date(timeIntervalSinceNow: -86_400)
        let expired = try TestApple(options: options)
        let verifier = try verifier(trusting: expired)
        let late = try await expired.sign(TestApple.transaction("1", signedDate: Date()))
        #expect(await refusal(late, verifier) == "invalid-certificate-chain")
        // Signed while the leaf was valid: accepted (Apple's rule: validity at signedDate)...
        let early = try await expired.sign(TestApple.transaction("2", signedDate: Date(timeIntervalSinceNow: -86_400 * 2)))
        #expect(await refusal(early, verifier) == nil)
        // ...and the cached chain still refuses a payload signed after the leaf expired.
        #expect(await refusal(late, verifier) == "invalid-certificate-chain")
    }

    @Test("an x5c of two certificates is refused")
    func twoCertificates() async throws {
        let x5c = Array(try apple.chain.x5c().prefix(2))
        let token = try apple.chain.sign(TestApple.transaction("1"), x5c: x5c)
        #expect(await refusal(token, try verifier(trusting: apple)) == "invalid-certificate-chain")
    }

    @Test("a wrong bundle id is refused")
    func wrongBundle() async throws {
        let token = try await apple.sign(TestApple.transaction("1", bundleId: "com.example.other"))
        #expect(await refusal(token, try verifier(trusting: apple)) == "wrong-bundle-id")
    }

    @Test("a wrong environment is refused")
    func wrongEnvironment() async throws {
        let token = try await apple.sign(TestApple.transaction("1", environment: "Sandbox"))
        #expect(await refusal(token, try verifier(trusting: apple, environment: .production)) == "wrong-environment")
    }

    @Test("an app that accepts both environments verifies each, and checks the app id on Production-signed data only")
    func bothEnvironments() async throws {
        var app = AppleProofVerifier.App(bundleId: TestApple.bundleId, appAppleId: 42, environments: [.production, .sandbox])
        let both = AppleProofVerifier(app: app, signedData: try verifier(trusting: apple).signedData, verifyReceipt: nil)
        let sandbox = try await both.verifiedPurchase(signed: try await apple.sign(TestApple.transaction("s1", environment: "Sandbox")))
        let production = try await both.verifiedPurchase(signed: try await apple.sign(TestApple.transaction("p1", environment: "Production")))
        #expect(sandbox.environment == "Sandbox" && production.environment == "Production")
        // The test app's id is not 42: a sandbox notification passes (Apple checks the id in
        // production only), a production one is refused.
        let sandboxNote = try await apple.notification("REFUND", transaction: TestApple.transaction("s2"), environment: "Sandbox")
        #expect(try await both.notification(signed: sandboxNote).transaction?.environment == "Sandbox")
        let productionNote = try await apple.notification("REFUND", transaction: TestApple.transaction("p2", environment: "Production"), environment: "Production")
        do {
            _ = try await both.notification(signed: productionNote)
            Issue.record("a production notification of another app id was taken")
        } catch {
            #expect(error.code == "wrong-app-id")
        }
        // Xcode's and unknown environments are never accepted; nor the sandbox by a production-only app.
        #expect(await refusal(try await apple.sign(TestApple.transaction("x1", environment: "Xcode")), both) == "wrong-environment")
        app.environments = [.production]
        let productionOnly = AppleProofVerifier(app: app, signedData: both.signedData, verifyReceipt: nil)
        #expect(await refusal(try await apple.sign(TestApple.transaction("s3", environment: "Sandbox")), productionOnly) == "wrong-environment")
    }

    @Test("malformed base64 or JSON is refused", arguments: [
        "not-a-token", "a.b.c", "!!!.???.***",
        base64URL("{\"alg\":\"ES256\"") + "." + base64URL("{}") + ".sig",
        base64URL("{\"alg\":\"ES256\"}") + "." + base64URL("[1,2") + ".sig",
    ])
    func malformed(token: String) async throws {
        #expect(await refusal(token, try verifier(trusting: apple)) == "malformed-token")
    }

    @Test("a date outside the years 1970 to 9999 is refused as malformed, naming it: it could never be stored")
    func datesOutOfRange() async throws {
        let verifier = try verifier(trusting: apple)
        func message(_ change: (inout SignedTransactionPayload) -> Void) async throws -> String? {
            var payload = TestApple.transaction("2000000050")
            change(&payload)
            do {
                _ = try await verifier.transaction(signed: try await apple.sign(payload))
                return nil
            } catch let error as AppleVerificationError {
                #expect(error.code == "malformed-token")
                return error.message
            }
        }
        #expect(try await message { $0.purchaseDate = -1 } == "the payload's purchaseDate (-1 ms since 1970) is outside the years 1970 to 9999")
        #expect(try await message { $0.signedDate = 253_402_300_800_000 }?.hasPrefix("the payload's signedDate") == true)
        #expect(try await message { $0.expiresDate = 10_000_000_000_000_000 }?.hasPrefix("the payload's expiresDate") == true)
        #expect(try await message { $0.revocationDate = -10_000_000_000_000_000 }?.hasPrefix("the payload's revocationDate") == true)
        #expect(try await message { $0.purchaseDate = 253_402_300_799_999 } == nil, "the last millisecond of 9999 is kept")
        // A price below 0 and a currency that is no ISO 4217 code are no Apple's (a rebuild
        // crashed on a negative price); a currency in small letters is read in capitals.
        #expect(try await message { $0.price = -5000 } == "the transaction's price is -5000, below 0")
        #expect(try await message { $0.currency = "US$" } == "the transaction's currency is \"US$\", not an ISO 4217 code")
        #expect(try await message { $0.price = 0; $0.currency = "EUR" } == nil, "a free trial's price")
        var small = TestApple.transaction("2000000051")
        small.currency = "usd"
        #expect(try await verifier.transaction(signed: try await apple.sign(small)).currency == "USD")
        var info = TestApple.renewalInfo("2000000050")
        info.gracePeriodExpiresDate = 253_402_300_800_000
        do {
            _ = try await verifier.renewalInfo(signed: try await apple.sign(info), app: verifier.app, originalTransactionId: "2000000050")
            Issue.record("a renewal info of the year 10000 verified")
        } catch let error as AppleVerificationError {
            #expect(error.message.hasPrefix("the payload's gracePeriodExpiresDate"), "\(error)")
        }
    }

    @Test("a payload that is JSON but not Apple's shape is named by its field, whether or not its chain is known already")
    func payloadOfAnotherShape() async throws {
        struct Odd: Encodable {
            let transactionId = "2000000051", bundleId = TestApple.bundleId, productId = "gems.100", environment: String? = "Sandbox"
            let purchaseDate: Int64 = 1, signedDate: String = "yesterday"
        }
        struct NoEnvironment: Encodable {
            let transactionId = "2000000052", bundleId = TestApple.bundleId, productId = "gems.100"
            let purchaseDate: Int64 = 1, signedDate: Int64 = Date().millisecondsSince1970
        }
        for warm in [false, true] {
            let verifier = try verifier(trusting: apple)
            if warm { _ = try await verifier.transaction(signed: try await apple.sign(TestApple.transaction("2000000053"))) }
            for (token, expected) in [(try await apple.sign(Odd()), "the payload's signedDate is not of the type Apple signs"),
                                      (try await apple.sign(NoEnvironment()), "the payload has no environment")] {
                do {
                    _ = try await verifier.transaction(signed: token)
                    Issue.record("verified")
                } catch let error as AppleVerificationError {
                    #expect(error.code == "malformed-token" && error.message == expected, "chain known: \(warm): \(error)")
                }
            }
        }
    }

    @Test("an oversized token is refused before it is parsed")
    func oversized() async throws {
        let token = String(repeating: "a", count: SignedDataVerifier.maximumTokenBytes + 1)
        #expect(await refusal(token, try verifier(trusting: apple)) == "token-too-large")
    }

    @Test("with no root configured, nothing verifies and the answer is to retry later")
    func noRoots() async throws {
        let verifier = AppleProofVerifier(
            app: .init(bundleId: nil, appAppleId: nil, environment: .sandbox), signedData: SignedDataVerifier(rootCertificates: []), verifyReceipt: nil)
        do {
            _ = try await verifier.transaction(signed: try await apple.sign(TestApple.transaction("1")))
            Issue.record("verified without roots")
        } catch let error as AppleVerificationError {
            #expect(error.code == "verification-unavailable" && error.isRetryable)
        }
    }

    @Test("a missing or unreadable root file is refused by name")
    func unreadableRootFile() throws {
        #expect(throws: AppleVerificationError.self) { try AppleRootCertificates.load(paths: ["/nonexistent/root.pem"]) }
        let garbage = NSTemporaryDirectory() + "garbage-\(UUID()).pem"
        try "not a certificate".write(toFile: garbage, atomically: true, encoding: .utf8)
        do {
            _ = try AppleRootCertificates.load(paths: [garbage])
            Issue.record("loaded a file with no certificate")
        } catch let error as AppleVerificationError {
            #expect(error.message.contains(garbage))
        }
    }

    @Test("notifications verify with their nested transaction, and the app id is checked in production")
    func notifications() async throws {
        let uuid = UUID()
        let signed = try await apple.notification("REFUND", uuid: uuid, transaction: TestApple.transaction("77"))
        let notification = try await verifier(trusting: apple).notification(signed: signed)
        #expect(notification.notificationUUID == uuid)
        #expect(notification.notificationType == "REFUND")
        #expect(notification.transaction?.transactionId.rawValue == "77")
        let production = try await apple.notification("REFUND", transaction: TestApple.transaction("78", environment: "Production"), environment: "Production")
        var app = AppleProofVerifier.App(bundleId: TestApple.bundleId, appAppleId: 42, environment: .production)
        let wrongApp = AppleProofVerifier(app: app, signedData: try verifier(trusting: apple).signedData, verifyReceipt: nil)
        await #expect(throws: AppleVerificationError.self) { _ = try await wrongApp.notification(signed: production) }
        app.appAppleId = TestApple.appAppleId
        let rightApp = AppleProofVerifier(app: app, signedData: try verifier(trusting: apple).signedData, verifyReceipt: nil)
        #expect(try await rightApp.notification(signed: production).transaction?.transactionId.rawValue == "78")
    }
}
