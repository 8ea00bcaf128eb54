import Foundation
@testable import LedgerCore
import Testing

@Suite("Identifiers and expected versions")
struct IdentifierTests {
    @Test("stream ids: 1 to 256 characters, no control characters")
    func streamIDs() throws {
        #expect(try StreamID("order-42").rawValue == "order-42")
        #expect(try StreamID(String(repeating: "x", count: 256)).rawValue.count == 256)
        #expect(throws: LedgerInputError(field: "streamId", problem: "is empty")) { try StreamID("") }
        #expect(throws: LedgerInputError.self) { try StreamID(String(repeating: "x", count: 257)) }
        #expect(throws: LedgerInputError.self) { try StreamID("order-\n1") }
    }

    @Test("stream ids decode through their validation")
    func streamIDDecoding() throws {
        let decoded = try JSONDecoder().decode([StreamID].self, from: Data(#"["order-1"]"#.utf8))
        #expect(decoded == [try StreamID("order-1")])
        #expect(throws: (any Error).self) { try JSONDecoder().decode([StreamID].self, from: Data(#"[""]"#.utf8)) }
    }

    @Test("event ids are UUIDs, printed in lower case")
    func eventIDs() throws {
        let id = try EventID("6F1C2A4E-0000-4000-8000-000000000001")
        #expect(id.description == "6f1c2a4e-0000-4000-8000-000000000001")
        #expect(throws: LedgerInputError.self) { try EventID("not-a-uuid") }
        #expect(EventID() != EventID())
    }

    @Test("expected versions map to the database encoding")
    func expectedVersions() {
        #expect(ExpectedVersion.any.databaseValue == nil)
        #expect(ExpectedVersion.noStream.databaseValue == -1)
        #expect(ExpectedVersion.exact(7).databaseValue == 7)
    }

    @Test("append errors have stable codes and say the current version")
    func appendErrors() throws {
        let stream = try StreamID("order-1")
        let conflict = AppendError.wrongExpectedVersion(stream: stream, expected: .exact(1), current: 3)
        #expect(conflict.code == "wrong-expected-version")
        #expect(conflict.description == "stream order-1 is at version 3, expected 1")
        let missing = AppendError.wrongExpectedVersion(stream: stream, expected: .exact(0), current: -1)
        #expect(missing.description == "stream order-1 does not exist, expected 0")
        #expect(AppendError.eventIDConflict(EventID()).code == "event-id-conflict")
        #expect(AppendError.invalidBatch("x").code == "invalid-batch")
    }

    @Test("event types: 1 to 128 characters")
    func eventTypes() throws {
        #expect(try NewEvent(type: "created", data: Data("{}".utf8)).type == "created")
        #expect(throws: LedgerInputError.self) { try NewEvent(type: "", data: Data("{}".utf8)) }
        #expect(throws: LedgerInputError.self) { try NewEvent(type: String(repeating: "t", count: 129), data: Data("{}".utf8)) }
    }

    @Test("the control-character check refuses exactly Unicode's category Cc, for every code point")
    func controlCharactersAreCategoryCc() {
        var mismatches: [UInt32] = []
        for value in UInt32(0)...0x10FFFF {
            guard let scalar = Unicode.Scalar(value) else { continue }  // surrogates
            let refused = (try? Identifier.validate(String(Character(scalar)) + "x", field: "id")) == nil
            if refused != (scalar.properties.generalCategory == .control) { mismatches.append(value) }
        }
        #expect(mismatches.isEmpty, "differ from category Cc: \(mismatches.prefix(10).map { String($0, radix: 16) })")
    }

    @Test("ids are told apart by their bytes, as PostgreSQL tells them: two spellings of one letter, a leading combining mark")
    func bytes() throws {
        let composed = try UserID("caf\u{E9}"), decomposed = try UserID("cafe\u{301}")
        #expect(composed.rawValue == decomposed.rawValue, "Swift's String takes them for one")
        #expect(composed != decomposed && Set([composed, decomposed]).count == 2)
        #expect(try UserID("caf\u{E9}") == composed)
        // "order-" + U+0301 is one Character ending in "-" and the mark: still an order's stream.
        let marked = try OrderID("\u{301}abc")
        #expect(marked.streamID.isOrder && marked.streamID.orderID == marked)
        #expect(marked.streamID.orderID?.rawValue.unicodeScalars.first == "\u{301}")
        let transaction = TransactionID(unchecked: "\u{200D}1")
        #expect(transaction.streamID.isTransaction && transaction.streamID.transactionID == transaction)
        #expect(StreamID.subscription("\u{FE0F}9").subscriptionID == "\u{FE0F}9")
        #expect(!StreamID(unchecked: "orders-1").isOrder && StreamID(unchecked: "order-").orderID?.rawValue == "")
    }
}
