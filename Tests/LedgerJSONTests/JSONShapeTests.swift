import Foundation
import LedgerJSON
import Testing

@Suite("What a JSON text holds that the ledger cannot keep as sent")
struct JSONShapeTests {
    func problem(_ json: String) -> JSONShape.Problem? { JSONShape.problem(in: Data(json.utf8)) }
    func path(_ json: String) -> String? { problem(json)?.path }

    @Test("a member named twice, by its path, in objects at any depth and in arrays; escapes read as the decoder reads them")
    func twice() {
        #expect(problem(#"{"a":1,"b":2,"a":3}"#) == .init(path: "a", problem: "is given more than once; give it once"))
        #expect(path(#"{"data":{"x":"1","y":{"z":[]},"x":null}}"#) == "data.x")
        #expect(path(#"{"items":[{"id":1},{"id":2,"id":3}]}"#) == "items.id")
        #expect(path(#"{"a\u0062":1,"ab":2}"#) == "ab")
        #expect(path(#"[{"k":1},{"k":2},{"k":3,"k":4}]"#) == "k")
    }

    @Test("nesting deeper than 32 objects and arrays, named by the member that goes deeper")
    func depth() {
        let deep = #"{"type":"failed","data":{"x":"# + String(repeating: "[", count: 40) + String(repeating: "]", count: 40) + "}}"
        #expect(problem(deep) == .init(path: "data.x", problem: "is nested deeper than 32 levels of objects and arrays"))
        let atLimit = String(repeating: "[", count: 32) + String(repeating: "]", count: 32)
        #expect(problem(atLimit) == nil)
        #expect(path("[" + atLimit + "]") == "body")
    }

    @Test("a number Decimal cannot hold exactly: more than 38 significant digits, or beyond its exponent's range")
    func numbers() {
        #expect(path(#"{"n":1111111111111111111111111111111111111111}"#) == "n")
        #expect(problem(#"{"data":{"n":[0.1000000000000000000000000000000000000001]}}"#)?.path == "data.n")
        #expect(problem(#"{"quantity":1e400}"#)?.problem.contains("beyond the range") == true)
        #expect(path(#"{"q":1e-400}"#) == "q")
        // 38 significant digits, with zeros around them, are kept.
        for number in ["12345678901234567890123456789012345678", "-0.00000000000000000000000000000000000000000001",
                       "100000000000000000000000000000000000000000000000000", "0", "-0.0", "2.5", "1E+2"] {
            #expect(problem(#"{"n":\#(number)}"#) == nil, "\(number)")
        }
        // Past 38 digits written, or with an exponent: refused exactly when Foundation's parser
        // (the one the routes decode with) refuses the number.
        let grid = ["1e127", "1e128", "1e150", "9e164", "9e165", "0.1e129", "10e-129", "1.0e-128", "1e-128", "1e-129", "0e128", "0e999",
                    "99999999999999999999999999999999999999e127", "1" + String(repeating: "0", count: 165), "1" + String(repeating: "0", count: 200),
                    "0." + String(repeating: "0", count: 130) + "1", "1.5e308", "-2E-5"]
        for number in grid {
            let decodes = (try? JSONDecoder().decode(Decimal.self, from: Data(number.utf8))) != nil
            #expect((problem(#"{"n":\#(number)}"#) == nil) == decodes, "\(number): the decoder \(decodes ? "takes" : "refuses") it")
        }
        #expect(problem(#"{"n":1e150}"#) != nil, "refused, as the decoder refuses it")
    }

    @Test("what JSON has no number for (a leading zero, a point or an exponent without digits, a sign alone) is named, as Foundation's parser takes some of it as something else")
    func notNumbers() {
        for text in ["01", "00", "-01", "1.", "-", "1e", "1e+", "-.5", "1.e3", "1..2", "1e2.5", "--1", "1-2"] {
            #expect(problem(#"{"quantity":\#(text)}"#) == .init(
                path: "quantity", problem: "is \(text), which is no JSON number (RFC 8259: no leading zeros, digits after a point and in an exponent)"), "\(text)")
        }
        #expect(problem(#"{"data":{"x":[1,01]}}"#)?.path == "data.x")
        // Outside any object or array it is no JSON at all: the decoder names that (invalid-json).
        for text in ["- item", "01", "-"] { #expect(problem(text) == nil, "\(text)") }
        for text in ["0", "-0", "0.5", "-0.5e-3", "10", "1E2", "1e+2", "120.0"] {
            #expect(problem(#"{"quantity":\#(text)}"#) == nil, "\(text)")
        }
    }

    @Test("a string escaping what PostgreSQL cannot store as text (\\u0000, a lone surrogate) is named by its member")
    func escapes() {
        #expect(problem(#"{"type":"failed","data":{"reason":"r","x":"a\u0000b"}}"#) == .init(path: "data.x", problem: "holds \\u0000, which cannot be stored as text"))
        #expect(problem(#"{"data":{"x":["ok","\ud800"]}}"#)?.path == "data.x")
        #expect(problem(#"{"x":"\udc00\ud800"}"#)?.problem == "holds a lone UTF-16 surrogate (\\uDC00), which is no character")
        #expect(problem(#"{"x\u0000":1}"#)?.path == "x\u{0}")
        // A pair is one character; other escapes are text.
        #expect(problem(#"{"x":"\ud83d\ude00 \u00e9 \\u0000 \n"}"#) == nil)
        // Digits inside a bare word are no number: the decoder names such text.
        #expect(problem("signedPayload=eyJ0eXAiOiJKV1QiLCJhbGciOiJFUzI1NiJ9" + String(repeating: "1", count: 50)) == nil)
        #expect(problem("[" + String(repeating: "1", count: 50) + "]") != nil)
    }

    @Test("nothing where every object names each member once, whatever the strings hold")
    func none() {
        #expect(problem(#"{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}"#) == nil)
        #expect(problem(#"{"a":"\"a\":{,}[]","b":"a","c":["a","a"],"d":"1111111111111111111111111111111111111111"}"#) == nil)
        #expect(problem(#"{"s":"x\\","t":"{\"a\":1,\"a\":2}"}"#) == nil)
        #expect(problem(#"{}"#) == nil)
        #expect(problem(#""#) == nil)
        #expect(problem(#"{"unterminated"#) == nil)
    }
}
