import Foundation
import LedgerJSON
import Testing

@Suite("A JSON member named twice")
struct DuplicateMembersTests {
    func first(_ json: String) -> String? { DuplicateMembers.first(in: Data(json.utf8)) }

    @Test("found by its path, in objects at any depth and in arrays; escapes read as the decoder reads them")
    func found() {
        #expect(first(#"{"a":1,"b":2,"a":3}"#) == "a")
        #expect(first(#"{"data":{"x":"1","y":{"z":[]},"x":null}}"#) == "data.x")
        #expect(first(#"{"items":[{"id":1},{"id":2,"id":3}]}"#) == "items.id")
        #expect(first(#"{"a\u0062":1,"ab":2}"#) == "ab")
        #expect(first(#"[{"k":1},{"k":2},{"k":3,"k":4}]"#) == "k")
    }

    @Test("none where every object names each member once, whatever the strings hold")
    func none() {
        #expect(first(#"{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}"#) == nil)
        #expect(first(#"{"a":"\"a\":{,}[]","b":"a","c":["a","a"]}"#) == nil)
        #expect(first(#"{"s":"x\\","t":"{\"a\":1,\"a\":2}"}"#) == nil)
        #expect(first(#"{}"#) == nil)
        #expect(first(#""#) == nil)
        #expect(first(#"{"unterminated"#) == nil)
    }
}
