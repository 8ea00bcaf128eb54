import Foundation
import NIOCore

/// The text of a member of a request's JSON object as the client wrote it, for an event's `data`,
/// which the ledger stores as sent. Reading it as `JSONValue` and writing it again took 12 µs of
/// the server's CPU per event; finding it in the body takes under one.
///
/// Only for a body `JSONDecoder` has accepted: this finds members, it does not check JSON. Nil
/// where the decoder and PostgreSQL could read the member otherwise than as written (a body with
/// a member given twice is refused before, by `LedgerRequestDecoder`): a key with an escape (it
/// may spell the name), two keys of one hash within the member, a number with
/// an exponent or of more than 38 characters (PostgreSQL stores it, but the ledger reads stored
/// data through `Decimal`, which may not hold it). The caller then writes the member again from
/// what the decoder read, which refuses what `Decimal` cannot hold.
enum BodyMember {
    static func text(of name: String, in body: ByteBuffer) -> Data? {
        body.withUnsafeReadableBytes { bytes in
            var scanner = Scanner(bytes: bytes)
            return scanner.member(Array(name.utf8)).map { Data(bytes[$0]) }
        }
    }

    private struct Scanner {
        let bytes: UnsafeRawBufferPointer
        var at = 0

        init(bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

        /// The range of the top-level member `name`'s value, if found once and plain.
        mutating func member(_ name: [UInt8]) -> Range<Int>? {
            skipSpace()
            guard peek == UInt8(ascii: "{") else { return nil }
            at += 1
            var found: Range<Int>?
            while true {
                skipSpace()
                guard peek == UInt8(ascii: "\"") else { return found }  // `}`
                guard let key = key() else { return nil }
                skipSpace(); at += 1; skipSpace()  // `:`
                let start = at
                let isName = bytes[key].elementsEqual(name)
                guard skipValue(checking: isName) else { return nil }
                if isName {
                    guard found == nil else { return nil }
                    found = start..<at
                }
                skipSpace()
                guard peek == UInt8(ascii: ",") else { return found }
                at += 1
            }
        }

        var peek: UInt8? { at < bytes.count ? bytes[at] : nil }

        static func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 }

        mutating func skipSpace() {
            while let byte = peek, Self.isSpace(byte) { at += 1 }
        }

        /// Past a key: its text without the quotes; nil when it holds an escape.
        mutating func key() -> Range<Int>? {
            let start = at + 1
            guard skipString() else { return nil }
            let range = start..<(at - 1)
            return bytes[range].contains(UInt8(ascii: "\\")) ? nil : range
        }

        /// Past a string; false when it holds an escape.
        @discardableResult
        mutating func skipString() -> Bool {
            var plain = true
            at += 1
            while let byte = peek, byte != UInt8(ascii: "\"") {
                if byte == UInt8(ascii: "\\") { plain = false; at += 1 }
                at += 1
            }
            at += 1
            return plain
        }

        /// Past a value; with `checking`, false where the member must be written again (see above).
        mutating func skipValue(checking: Bool) -> Bool {
            switch peek {
            case UInt8(ascii: "\""):
                skipString()
            case UInt8(ascii: "{"):
                at += 1
                // The keys' hashes: a repeat, or two keys of one hash, is written again.
                var hashes: Set<Int> = []
                while true {
                    skipSpace()
                    guard peek == UInt8(ascii: "\"") else { break }
                    let key = key()
                    if checking {
                        guard let key else { return false }
                        var hasher = Hasher()
                        hasher.combine(bytes: UnsafeRawBufferPointer(rebasing: bytes[key]))
                        guard hashes.insert(hasher.finalize()).inserted else { return false }
                    }
                    skipSpace(); at += 1; skipSpace()
                    guard skipValue(checking: checking) else { return false }
                    skipSpace()
                    guard peek == UInt8(ascii: ",") else { break }
                    at += 1
                }
                at += 1  // `}`
            case UInt8(ascii: "["):
                at += 1
                while true {
                    skipSpace()
                    guard let byte = peek, byte != UInt8(ascii: "]") else { break }
                    guard skipValue(checking: checking) else { return false }
                    skipSpace()
                    guard peek == UInt8(ascii: ",") else { break }
                    at += 1
                }
                at += 1  // `]`
            default:
                // A number, true, false or null.
                let start = at
                var exponent = false
                while let byte = peek, !(byte == UInt8(ascii: ",") || byte == UInt8(ascii: "}") || byte == UInt8(ascii: "]") || Self.isSpace(byte)) {
                    if byte == UInt8(ascii: "e") || byte == UInt8(ascii: "E") { exponent = true }
                    at += 1
                }
                let isNumber = bytes[start] != UInt8(ascii: "t") && bytes[start] != UInt8(ascii: "f") && bytes[start] != UInt8(ascii: "n")
                if checking, isNumber, exponent || at - start > 38 { return false }
            }
            return true
        }
    }
}
