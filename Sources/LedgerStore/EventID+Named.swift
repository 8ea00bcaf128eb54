import Crypto
import Foundation
import LedgerCore

extension EventID {
    /// A UUID named by its parts (SHA-256, version 8): the ledger's own events get the same id
    /// each time the same thing happens (the same proof, pairing or pool entry), so a repeat that
    /// races the first is stored once.
    public static func named(_ parts: String...) -> EventID {
        named(parts)
    }

    /// `named(_:)` of an array of parts.
    public static func named(_ parts: [String]) -> EventID {
        var bytes = Array(SHA256.hash(data: Data(parts.joined(separator: "\u{1F}").utf8)).prefix(16))
        bytes[6] = (bytes[6] & 0x0F) | 0x80
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        let uuid = UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                               bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
        return EventID(uuid)
    }
}

/// The SHA-256 of `parts` (joined as `EventID.named` joins them), in lower-case hex: a digest
/// that stands for a proof the ledger never saw (an imported grant's `receiptSha256`).
public func namedDigest(_ parts: String...) -> String {
    sha256Hex(Data(parts.joined(separator: "\u{1F}").utf8))
}

/// The SHA-256 of `data` in lower-case hex.
public func sha256Hex(_ data: Data) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var hex: [UInt8] = []
    hex.reserveCapacity(64)
    for byte in SHA256.hash(data: data) {
        hex.append(digits[Int(byte >> 4)])
        hex.append(digits[Int(byte & 0x0F)])
    }
    return String(decoding: hex, as: UTF8.self)
}
