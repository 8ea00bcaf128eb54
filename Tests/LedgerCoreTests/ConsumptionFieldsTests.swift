import Foundation
import LedgerCore
import Testing

/// What a consumption answer sends: Apple's required fields always, and only combinations Apple's
/// field rules allow (docs/apple.md, "Consumption answers").
@Suite("Consumption answer fields")
struct ConsumptionFieldsTests {
    @Test("GRANT_PRORATED is sent only with a share above 0 and below 100%; otherwise the preference it comes to, and why")
    func proratedPreference() {
        let cases: [(DeliveryStatus, Int?, RefundPreference?, Int?, ConsumptionFields.Adjustment?)] = [
            (.delivered, 40_000, .grantProrated, 40_000, nil),
            (.delivered, 0, .grantFull, 0, .nothingConsumed),
            (.delivered, 100_000, .decline, 100_000, .fullyConsumed),
            (.delivered, nil, nil, nil, .noConsumptionPercentage),
            (.serverOutage, nil, .grantFull, 0, .notDelivered),
            (.other, 30_000, .grantFull, 0, .notDelivered),
        ]
        for (status, consumed, preference, percentage, adjustment) in cases {
            let fields = ConsumptionFields(deliveryStatus: status, consumed: consumed, sampleContentProvided: true, refundPreference: .grantProrated)
            #expect(fields.refundPreference == preference && fields.consumptionPercentage == percentage && fields.preferenceAdjusted == adjustment,
                    "\(status) \(consumed.map(String.init) ?? "-"): \(fields)")
            if fields.refundPreference == .grantProrated {
                #expect((fields.consumptionPercentage ?? 0) > 0 && (fields.consumptionPercentage ?? 0) < 100_000)
            }
            if fields.deliveryStatus != .delivered { #expect(fields.consumptionPercentage == 0, "Apple asks for 0 when not delivered") }
        }
    }

    @Test("an auto-renewable subscription's transaction: never a consumptionPercentage (Apple refuses it), GRANT_PRORATED as it is")
    func autoRenewable() {
        for (status, consumed) in [(DeliveryStatus.delivered, Int?.some(40_000)), (.delivered, 0), (.delivered, nil), (.other, nil)] {
            let fields = ConsumptionFields(
                deliveryStatus: status, consumed: consumed, sampleContentProvided: true, refundPreference: .grantProrated, autoRenewable: true)
            #expect(fields.consumptionPercentage == nil && fields.refundPreference == .grantProrated && fields.preferenceAdjusted == nil, "\(fields)")
        }
    }

    @Test("other preferences are sent as the catalog says; sampleContentProvided is always sent, false when the catalog does not say")
    func catalogValues() {
        for preference in [RefundPreference.decline, .grantFull, nil] {
            for status in DeliveryStatus.allCases {
                for consumed in [nil, 0, 50_000, 100_000] {
                    let fields = ConsumptionFields(deliveryStatus: status, consumed: consumed, sampleContentProvided: nil, refundPreference: preference)
                    #expect(fields.refundPreference == preference && fields.preferenceAdjusted == nil)
                    #expect(fields.consumptionPercentage == (status == .delivered ? consumed : 0), "the share delivered, 0 when not delivered")
                    #expect(fields.sampleContentProvided == false && fields.sampleContentDefaulted)
                }
            }
        }
        let said = ConsumptionFields(deliveryStatus: .delivered, consumed: nil, sampleContentProvided: true, refundPreference: nil)
        #expect(said.sampleContentProvided && !said.sampleContentDefaulted)
    }

    @Test("a consumption-answer recorded before the fields were added still reads")
    func oldAnswerReads() throws {
        let old = #"{"notificationUUID":"00000000-0000-4000-8000-000000000001","transactionId":"1","outcome":"refused","deliveryStatus":"DELIVERED","customerConsented":true,"attempts":1,"error":"apple-api-refused","appleErrorCode":4000041}"#
        let answer = try JSONDecoder().decode(ConsumptionAnswer.self, from: Data(old.utf8))
        #expect(answer.sampleContentProvided == nil && answer.preferenceAdjusted == nil && answer.sampleContentDefaulted == nil)
        #expect(answer.appleErrorCode == 4000041)
    }
}
