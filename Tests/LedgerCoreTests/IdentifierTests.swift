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

    @Test("random UUIDs are version 4, RFC 4122 variant, and do not repeat")
    func randomUUIDs() {
        let uuids = (0..<2_000).map { _ in UUID.random() }
        #expect(Set(uuids).count == uuids.count)
        for uuid in uuids.prefix(100) {
            let text = uuid.uuidString
            #expect(Array(text)[14] == "4", "version nibble of \(text)")
            #expect("89AB".contains(Array(text)[19]), "variant of \(text)")
        }
        // Every other bit varies: OR-ing and AND-ing all of them leaves only the fixed bits.
        var any = [UInt8](repeating: 0, count: 16), all = [UInt8](repeating: 0xFF, count: 16)
        for uuid in uuids {
            withUnsafeBytes(of: uuid.uuid) { raw in
                for i in 0..<16 { any[i] |= raw[i]; all[i] &= raw[i] }
            }
        }
        #expect(any == [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x4F, 0xFF, 0xBF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF])
        #expect(all == [0, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 0])
    }

    @Test("random bytes come from blocks handed out once, also to concurrent callers and across refills")
    func randomBytesAreNeverHandedOutTwice() async {
        // 8 tasks × 300 UUIDs cross several 4 KiB blocks (256 UUIDs each) while other tasks draw.
        let drawn = await withTaskGroup(of: [UUID].self) { group in
            for _ in 0..<8 { group.addTask { (0..<300).map { _ in UUID.random() } } }
            return await group.reduce(into: [UUID]()) { $0 += $1 }
        }
        #expect(Set(drawn).count == 2_400)
        // Draws at and past the largest a block serves, one that ends a block exactly, and one
        // that needs the next: no two share a byte run (a block handed out twice would repeat
        // one), and none is left as zeros.
        let bytes = RandomBytes()
        var draws: [[UInt8]] = []
        for size in [RandomBytes.largestBlockDraw, RandomBytes.largestBlockDraw + 1, 1_024, 1_024, 1_024 - 7, 7, 16, 8_192] {
            var draw = [UInt8](repeating: 0, count: size)
            draw.withUnsafeMutableBytes { bytes.fill($0) }
            draws.append(draw)
        }
        let runs = draws.flatMap { draw in stride(from: 0, to: draw.count - 7, by: 8).map { Array(draw[$0..<($0 + 8)]) } }
        #expect(Set(runs).count == runs.count, "an 8-byte run of random bytes came twice")
        #expect(draws.allSatisfy { $0.contains { $0 != 0 } })
        #expect(Set(draws[7]).count > 200, "8 KiB of random bytes hold nearly every byte value")
    }
}
