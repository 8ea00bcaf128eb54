import AppleReceipts
import Foundation
import LedgerCore
import LedgerTestSupport
import Testing

/// The refusal code of verifying renewal info `token` against the test app, or nil.
func renewalRefusal(_ token: String, _ verifier: AppleProofVerifier, originalTransactionId: String? = nil) async -> String? {
    do {
        _ = try await verifier.renewalInfo(signed: token, app: verifier.app, originalTransactionId: originalTransactionId)
        return nil
    } catch {
        return error.code
    }
}

@Suite("Signed renewal info: Apple's JWSRenewalInfoDecodedPayload, verified as transactions are")
struct RenewalInfoTests {
    let apple: TestApple
    init() throws { apple = try TestApple() }

    @Test("renewal info signed by the chain verifies and maps to the ledger's RenewalInfo")
    func verifiesAndMaps() async throws {
        var payload = TestApple.renewalInfo("7000000001", product: "pro.monthly", autoRenew: false)
        payload.autoRenewProductId = "pro.yearly"
        payload.expirationIntent = 2
        payload.gracePeriodExpiresDate = 1_800_100_000_000
        payload.isInBillingRetryPeriod = true
        payload.priceIncreaseStatus = 1
        payload.renewalDate = 1_800_200_000_000
        let verifier = try verifier(trusting: apple)
        let verified = try await verifier.renewalInfo(signed: try await apple.sign(payload), app: verifier.app, originalTransactionId: "7000000001")
        #expect(verified.originalTransactionId == "7000000001")
        #expect(verified.environment == "Sandbox")
        #expect(verified.info == RenewalInfo(
            autoRenew: false, autoRenewProductId: "pro.yearly", productId: "pro.monthly", expirationIntent: 2,
            gracePeriodExpiresDate: Date(timeIntervalSince1970: 1_800_100_000), isInBillingRetryPeriod: true, priceIncreaseStatus: 1,
            renewalDate: Date(timeIntervalSince1970: 1_800_200_000), signedDate: Date(millisecondsSince1970: payload.signedDate)))
    }

    @Test("Apple's own JSON (the library's signedRenewalInfo.json fields) decodes")
    func applesJSON() throws {
        // From apple/app-store-server-library-swift Tests/.../models/signedRenewalInfo.json.
        let json = #"""
        {"expirationIntent": 1, "originalTransactionId": "12345", "autoRenewProductId": "com.example.product.2",
         "productId": "com.example.product", "autoRenewStatus": 1, "isInBillingRetryPeriod": true, "priceIncreaseStatus": 0,
         "gracePeriodExpiresDate": 1698148900000, "offerType": 2, "offerIdentifier": "abc.123", "signedDate": 1698148800000,
         "environment": "LocalTesting", "recentSubscriptionStartDate": 1698148800000, "renewalDate": 1698148850000,
         "currency": "USD", "renewalPrice": 9990, "offerDiscountType": "PAY_AS_YOU_GO", "eligibleWinBackOfferIds": ["eligible1"],
         "appTransactionId": "71134", "offerPeriod": "P1Y", "appAccountToken": "7e3fb20b-4cdb-47cc-936d-99d65f608138"}
        """#
        let payload = try JSONDecoder().decode(SignedRenewalInfoPayload.self, from: Data(json.utf8))
        #expect(payload.renewalInfo.autoRenew == true)
        #expect(payload.renewalInfo.expirationIntent == 1)
        #expect(payload.renewalInfo.gracePeriodExpiresDate == Date(timeIntervalSince1970: 1_698_148_900))
        #expect(payload.originalTransactionId == "12345" && payload.renewalPrice == 9990)
    }

    @Test("renewal info signed by a chain to another root is refused")
    func wrongChain() async throws {
        let stranger = try TestApple()
        let token = try await stranger.sign(TestApple.renewalInfo("7000000002"))
        #expect(await renewalRefusal(token, try verifier(trusting: apple)) == "invalid-certificate-chain")
    }

    @Test("a bad signature is refused")
    func badSignature() async throws {
        var parts = try await apple.sign(TestApple.renewalInfo("7000000003")).split(separator: ".").map(String.init)
        parts[2] = String(parts[2].reversed())
        #expect(await renewalRefusal(parts.joined(separator: "."), try verifier(trusting: apple)) == "invalid-signature")
    }

    @Test("renewal info from an environment the app does not accept, or naming none, is refused")
    func wrongEnvironment() async throws {
        let production = try await apple.sign(TestApple.renewalInfo("7000000004", environment: "Production"))
        #expect(await renewalRefusal(production, try verifier(trusting: apple)) == "wrong-environment")
        var unnamed = TestApple.renewalInfo("7000000004")
        unnamed.environment = nil
        #expect(await renewalRefusal(try await apple.sign(unnamed), try verifier(trusting: apple)) == "wrong-environment")
    }

    @Test("renewal info about another subscription than expected, or about none, is refused")
    func otherSubscription() async throws {
        let token = try await apple.sign(TestApple.renewalInfo("7000000005"))
        #expect(await renewalRefusal(token, try verifier(trusting: apple), originalTransactionId: "7000000099") == "renewal-info-mismatch")
        #expect(await renewalRefusal(token, try verifier(trusting: apple), originalTransactionId: "7000000005") == nil)
        var none = TestApple.renewalInfo("")
        none.originalTransactionId = nil
        #expect(await renewalRefusal(try await apple.sign(none), try verifier(trusting: apple)) == "malformed-token")
    }
}
