import Foundation
import LedgerCore
import LedgerJSON
import Testing

/// Reading a history to import (docs/import.md): CSV records and JSON Lines, each line's number
/// kept for the summary, and each line's problem naming its column.
@Suite("History files")
struct HistoryFileTests {
    func lines(_ text: String, _ format: HistoryFile.Format = .csv) throws -> [HistoryFile.Line] {
        Array(try HistoryFile(Data(text.utf8), format: format).lines)
    }

    @Test("CSV: quoted commas, quotes and line breaks, CRLF, blank lines; a record's number is the line it starts on")
    func csvRecords() throws {
        let text = "orderId,userId,productId\r\n\"a,1\",\"say \"\"hi\"\"\",p\r\n\r\nb,\"two\nlines\",p\nc,u\n"
        let read = try lines(text)
        #expect(read.map(\.number) == [2, 4, 6])
        #expect(try read[0].fields.get() == ["orderId": "a,1", "userId": "say \"hi\"", "productId": "p"])
        #expect(try read[1].fields.get()["userId"] == "two\nlines")
        #expect(throws: LedgerInputError.self) { try read[2].fields.get() }
    }

    @Test("a header with an unknown or repeated column refuses the file, naming it; a byte-order mark is no part of it")
    func header() throws {
        let marked = Array(try HistoryFile(Data([0xEF, 0xBB, 0xBF] + Array("orderId,userId\no-1,u-1\n".utf8)), format: .csv).lines)
        #expect(try marked.map { try $0.fields.get() } == [["orderId": "o-1", "userId": "u-1"]])
        #expect(throws: LedgerInputError(field: "coupon", problem: "is not a column of an import; use \(HistoryRecord.columns.joined(separator: ", "))")) {
            try HistoryFile(Data("orderId,coupon\n".utf8), format: .csv)
        }
        #expect(throws: LedgerInputError(field: "header", problem: "has no name for column 3 (a comma too many?)")) {
            try HistoryFile(Data("orderId,userId,\n".utf8), format: .csv)
        }
        #expect(throws: LedgerInputError(field: "orderId", problem: "is a column twice in the header")) {
            try HistoryFile(Data("orderId,orderId\n".utf8), format: .csv)
        }
        for empty in ["", "\n", " \r\n"] {
            #expect(throws: LedgerInputError(field: "header", problem: "is missing: the file is empty")) {
                try HistoryFile(Data(empty.utf8), format: .csv)
            }
        }
        #expect(throws: LedgerInputError(field: "header", problem: "is missing: the first line is blank; it must name the columns")) {
            try HistoryFile(Data("\norderId,userId\no-1,u-1\n".utf8), format: .csv)
        }
    }

    @Test("a misplaced quote, or bytes that are not UTF-8 (CSV or JSON Lines), refuse the file, naming the line, rather than end or change it unseen")
    func wholeFile() throws {
        let misquoted = "line 2 has a quoted value that does not end where it should: a quote inside quotes is written twice (\"\"), and a closing quote is followed by a comma or the line's end"
        func refusal(_ text: [UInt8]) -> String? {
            do { _ = try HistoryFile(Data(text), format: .csv) } catch { return error.description }
            return nil
        }
        #expect(refusal(Array("orderId,userId\n@1,\"u-1\"x\n@2,u-2\n".utf8)) == misquoted)
        #expect(refusal(Array("orderId,userId\r\n@1,u\r\n@2,\"u-1\n@3,u-3\n".utf8))?.hasPrefix("line 3 has a quoted value") == true)
        #expect(refusal(Array("orderId,userId\n@1,u-".utf8) + [0xFF, 0xFE] + Array("1\n".utf8)) == "line 2 is not UTF-8 text; save the file as UTF-8")
        #expect(refusal(Array("orderId,userId\r@1,u\r@2,u-".utf8) + [0xC3] + Array("\r".utf8)) == "line 3 is not UTF-8 text; save the file as UTF-8", "lines ended by CR alone")
        // JSON Lines too: its string would read as no string at all, and the line be refused for another reason.
        let jsonLine = Array("{\"orderId\":\"a\"}\n{\"userId\":\"u-".utf8) + [0xFF] + Array("\"}\n".utf8)
        #expect(throws: LedgerInputError(field: "line 2", problem: "is not UTF-8 text; save the file as UTF-8")) {
            try HistoryFile(Data(jsonLine), format: .jsonLines)
        }
        // A JSON line ends at LF alone, as the reader takes it: a CR inside a line starts none.
        let crInside = Array("{\"orderId\":\"a\"}\r{\"userId\":\"u-".utf8) + [0xFF] + Array("\"}\n".utf8)
        #expect(throws: LedgerInputError(field: "line 1", problem: "is not UTF-8 text; save the file as UTF-8")) {
            try HistoryFile(Data(crInside), format: .jsonLines)
        }
        // Quotes RFC 4180 allows, and one inside an unquoted value (a character of it).
        let fine = "orderId,userId\n\"a\"\"b\",\"two\nlines\"\nc,5\" screen\n\"\",\"\"\r\n"
        #expect(refusal(Array(fine.utf8)) == nil)
        #expect(try lines(fine).map { try $0.fields.get()["userId"] } == ["two\nlines", "5\" screen", nil])
    }

    @Test("a line's record: its state's rules, times in ISO 8601, the column of each problem")
    func records() throws {
        let order = ["orderId": "o", "userId": "u", "productId": "p", "createdAt": "2025-01-01T00:00:00Z"]
        func problem(_ changes: [String: String?]) -> String? {
            var fields = order
            for (name, value) in changes { fields[name] = value }
            do { _ = try HistoryRecord(fields, line: 1) } catch { return error.field }
            return nil
        }
        #expect(problem(["state": "created"]) == nil)
        #expect(problem(["state": "finished"]) == "transactionId")
        #expect(problem(["state": "finished", "transactionId": "1"]) == "purchaseDate")
        #expect(problem(["state": "finished", "transactionId": "1", "purchaseDate": "2025-01-01T00:00:01.5Z"]) == nil)
        #expect(problem(["state": "refunded", "transactionId": "1", "purchaseDate": "2025-01-01T00:00:01Z"]) == "refundedAt")
        #expect(problem(["state": "created", "transactionId": "1"]) == "transactionId")
        #expect(problem(["state": "created", "createdAt": "yesterday"]) == "createdAt")
        #expect(problem(["state": "created", "createdAt": "1969-12-31T23:59:59Z"]) == "createdAt")
        // Past 9999 (the ledger's JSON could not read it back: it stopped the import), or a day
        // or time no calendar has (the format style rolls it over).
        for time in ["10000-01-01T00:00:00Z", "9999-12-31T23:00:00-05:00", "2023-02-30T10:00:00Z", "2023-01-02T25:00:00Z", "2023-01-02T10:00:60Z"] {
            #expect(problem(["state": "created", "createdAt": time]) == "createdAt", "\(time)")
        }
        // A time the ledger could store, but not yet: no order was created then.
        #expect(problem(["state": "created", "createdAt": "9999-12-31T23:59:59Z"]) == "createdAt")
        #expect(problem(["state": "finished", "transactionId": "1", "purchaseDate": "2008-07-09T23:59:59Z"]) == "purchaseDate")
        #expect(problem(["state": "refunded", "transactionId": "1", "purchaseDate": "2025-01-02T00:00:00Z", "refundedAt": "2025-01-01T23:59:59Z"]) == "refundedAt")
        #expect(problem(["state": "created", "price": "1,99"]) == "price")
        #expect(problem(["state": "created", "environment": "Xcode"]) == "environment")
        #expect(problem(["state": "created", "userId": nil]) == "userId")
        #expect(problem(["state": "gone"]) == "state")
        // Ids padded as a CSV written with ", " between its fields would be: no client names them so.
        for name in ["orderId", "userId", "productId"] {
            #expect(problem(["state": "created", name: " x"]) == name)
            #expect(problem(["state": "created", name: "x\u{A0}"]) == name)
        }
        // Apple's ids as a padded export or a spreadsheet wrote them: another id than Apple's own,
        // which would be granted again.
        for id in ["7075100180001 ", " 7075100180001", "7075100180001\u{A0}", "7.00471509000800E+12", "7E12", "7e+12"] {
            #expect(problem(["state": "finished", "transactionId": id, "purchaseDate": "2025-01-01T00:00:01Z"]) == "transactionId", "\(id)")
        }
        #expect(problem(["state": "finished", "transactionId": "1", "originalTransactionId": "1 ", "purchaseDate": "2025-01-01T00:00:01Z"]) == "originalTransactionId")
        for id in ["7075100180001", "E12", "1-E2", "1.5"] {
            #expect(problem(["state": "finished", "transactionId": id, "purchaseDate": "2025-01-01T00:00:01Z"]) == nil, "\(id)")
        }
        let alone = try HistoryRecord(["transactionId": "9"], line: 3)
        #expect(alone.state == .finished && alone.purchaseDate == HistoryRecord.unknownDate && alone.orderId == nil)
    }

    @Test("JSON Lines: numbers as their decimal value, null as absent, blank lines skipped, a line that is no object named")
    func jsonLines() throws {
        // An id as a spreadsheet rounded it, written as a number: refused, not read as its digits.
        let rounded = try lines("{\"transactionId\": 7.00471509000800E+12}\n{\"transactionId\":7004715090008}\n", .jsonLines)
        #expect(throws: LedgerInputError.self) { try rounded[0].fields.get() }
        #expect(try rounded[1].fields.get() == ["transactionId": "7004715090008"])
        // However the line hides it: another member's value spelt as the key first, or the key spelt with escapes.
        let hidden = try lines(
            "{\"userId\":\"transactionId\",\"transactionId\":7.00471509000800E+12}\n{\"transaction\\u0049d\":7.00471509000800E+12}\n"
                + "{\"userId\":\"transactionId\",\"transactionId\":7004715090008}\n{\"transactionId\"\r:\r7004715090008}\n", .jsonLines)
        #expect(throws: LedgerInputError.self) { try hidden[0].fields.get() }
        #expect(throws: LedgerInputError.self) { try hidden[1].fields.get() }
        #expect(try hidden[2].fields.get() == ["userId": "transactionId", "transactionId": "7004715090008"])
        #expect(try hidden[3].fields.get() == ["transactionId": "7004715090008"], "JSON's white space around the colon")
        // A sign is no part of Apple's ids either: -0 would be read as transaction "0".
        let signed = try lines("{\"transactionId\": -0}\n{\"originalTransactionId\": -7004715090008}\n", .jsonLines)
        #expect(signed.allSatisfy { (try? $0.fields.get()) == nil }, "\(signed.map(\.fields))")
        let read = try lines("{\"orderId\":\"a\",\"price\":4.99,\"currency\":null}\n\n[1]\n{\"transactionId\":3000000003,\"price\":1e2}\n", .jsonLines)
        #expect(read.map(\.number) == [1, 3, 4])
        #expect(try read[0].fields.get() == ["orderId": "a", "price": "4.99"])
        #expect(throws: LedgerInputError(field: "line", problem: "is not a JSON object whose members are strings, numbers or null")) {
            try read[1].fields.get()
        }
        #expect(try read[2].fields.get() == ["transactionId": "3000000003", "price": "100"], "a number is its decimal value")
        // A member named twice: which value was meant cannot be known.
        let twice = try lines("{\"orderId\":\"a\",\"price\":\"1.99\",\"price\":\"0.99\"}\n", .jsonLines)
        #expect(throws: LedgerInputError(field: "price", problem: "is given more than once; give it once")) {
            try twice[0].fields.get()
        }
        // A member of another type is named; a number past 38 digits is refused, never rounded.
        let odd = try lines("{\"orderId\":\"a\",\"userId\":true}\n{\"transactionId\":12345678901234567890123456789012345678901}\n", .jsonLines)
        #expect(throws: LedgerInputError(field: "userId", problem: "must be a string, a number or null")) { try odd[0].fields.get() }
        #expect(throws: LedgerInputError(
            field: "transactionId", problem: "has 41 significant digits; the ledger keeps numbers of up to 38 exactly (send it as a string)")) {
            try odd[1].fields.get()
        }
    }
}
