import Foundation
import LedgerCore
@testable import LedgerServer
import Testing

@Suite("Request bodies")
struct JSONBodyTests {
    /// Every accessor's answer, value or error, for one field.
    static func answers(_ body: JSONBody, _ field: String) -> [String] {
        func attempt(_ work: () throws -> String?) -> String {
            do { return try work() ?? "nil" } catch { return "error: \(error)" }
        }
        return [
            "has \(body.has(field))", "null \(body.isNull(field))",
            attempt { try body.string(field) },
            attempt { try body.requiredString(field) },
            attempt { try body.integer(field).map(String.init) },
            attempt { try body.bool(field).map(String.init) },
            attempt {
                // The object's parse written again with sorted keys: the same text for the same object.
                let object = try JSONSerialization.jsonObject(with: body.objectData(field))
                return String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
            },
        ]
    }

    @Test("a plain body read by the scanner answers as JSONSerialization's parse of it does", arguments: [
        #"{"type":"verified","eventId":"e-1","expectedVersion":3,"data":{"environment":"Sandbox","n":[1,{"a":2.5}]}}"#,
        #"{"type":7,"eventId":null,"expectedVersion":3.0,"data":[1]}"#,
        #"{"type":true,"eventId":{"a":"b"},"expectedVersion":3.5,"data":"x"}"#,
        #"{"type":"über","expectedVersion":-1,"data":null}"#,
        #"{"expectedVersion":"3","data":{},"eventId":[]}"#,
        #"{"expectedVersion":true,"type":false,"data":true,"eventId":false}"#,
        #"{"expectedVersion":-123456789012345,"type":null}"#,
        #"{"expectedVersion":123456789012345.5}"#,
        #"{"expectedVersion":-1234567890123.0}"#,
        #"{"expectedVersion":12345678901234567}"#,
        #" { } "#,
    ])
    func plainAnswersAsFoundation(text: String) throws {
        let scanned = try JSONBody(text: Data(text.utf8))
        let parsed = try JSONBody(text: Data(text.utf8), scanner: false)
        #expect(scanned.isPlain && !parsed.isPlain)
        for field in ["type", "eventId", "expectedVersion", "data", "absent"] {
            #expect(Self.answers(scanned, field) == Self.answers(parsed, field), "\(field) of \(text)")
        }
    }

    @Test("bodies the scanner does not read alone go through JSONSerialization, or are refused as it refuses them", arguments: [
        (#"{"type":"a","type":"b"}"#, "b"),
        (#"{"type":"\u0041"}"#, "A"),
        (#"{"type":"a","expectedVersion":1e2}"#, "a"),
        (#"{"type":"a","expectedVersion":10.000000000000001}"#, "a"),
        (#"{"type":"a","expectedVersion":-99999999999999.99}"#, "a"),
    ])
    func notPlain(text: String, type: String) throws {
        let body = try JSONBody(text: Data(text.utf8))
        #expect(!body.isPlain)
        #expect(try body.string("type") == type)
        for invalid in ["[1]", #"{"a":1"#, "\"text\""] {
            #expect(throws: APIError.self) { try JSONBody(text: Data(invalid.utf8)) }
        }
    }
}
