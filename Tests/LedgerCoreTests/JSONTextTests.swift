import Foundation
import LedgerCore
import Testing

@Suite("JSON written directly")
struct JSONTextTests {
    @Test("strings with quotes, backslashes, control characters and non-ASCII read back as written")
    func roundTrip() throws {
        let tricky = "a\"b\\c\nd\te\u{01}f é 😀 </script>"
        var json = JSONText()
        json.add("text", tricky)
        json.add("none", nil as String?)
        json.add("yes", true)
        json.add("count", 42)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.result.utf8)) as? [String: Any])
        #expect(object["text"] as? String == tricky)
        #expect(object["none"] is NSNull)
        #expect(object["yes"] as? Bool == true)
        #expect(object["count"] as? Int == 42)
    }
}
