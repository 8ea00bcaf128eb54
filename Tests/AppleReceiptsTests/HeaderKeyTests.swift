@testable import AppleReceipts
import Testing

/// The chain cache's key: hashed on its first bytes, equal only when every byte is.
@Suite("SignedDataVerifier's chain cache key")
struct HeaderKeyTests {
    @Test("headers alike in their hashed bytes but not after them are two keys; one header copied is one")
    func wholeHeaderDecides() {
        let shared = [UInt8](repeating: UInt8(ascii: "M"), count: SignedDataVerifier.HeaderKey.hashedBytes + 100)
        let first = SignedDataVerifier.HeaderKey(bytes: (shared + Array("AAAA".utf8))[...])
        let second = SignedDataVerifier.HeaderKey(bytes: (shared + Array("AAAB".utf8))[...])
        let copy = SignedDataVerifier.HeaderKey(bytes: Array(first.bytes)[...])
        #expect(first.hashValue == second.hashValue, "only the first bytes are hashed")
        #expect(first != second)
        #expect(first == copy)
        #expect(Set([first, second, copy]).count == 2)
        // A slice that does not start at its array's first index compares by its own bytes.
        let inner = SignedDataVerifier.HeaderKey(bytes: (Array("xx".utf8) + first.bytes)[2...])
        #expect(inner == first && inner.hashValue == first.hashValue)
        #expect(SignedDataVerifier.HeaderKey(bytes: []) == SignedDataVerifier.HeaderKey(bytes: []))
    }
}
