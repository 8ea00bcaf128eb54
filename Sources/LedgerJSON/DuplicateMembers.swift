import Foundation

/// The first member a JSON text names twice in one object. Foundation's decoders keep one of the
/// two values without a word; a body or an import line that names a member twice is refused by
/// name instead (which value the sender meant cannot be known).
public enum DuplicateMembers {
    /// The duplicated member as a path from the outermost object (`data.productId`), or nil when
    /// no object names a member twice. Reads the structure only: text that is not JSON gives
    /// nil or a guess, and is left to the decoder to refuse.
    public static func first(in bytes: UnsafeRawBufferPointer) -> String? {
        // One frame per open object or array: an object's member names so far, and the name of
        // the member it is the value of (nil for an element of an array).
        struct Frame {
            var names: Set<String>?
            var name: String?
        }
        var frames: [Frame] = []
        var expectingName = false
        var lastName: String?
        var index = 0
        let count = bytes.count
        while index < count {
            switch bytes[index] {
            case UInt8(ascii: "\""):
                let start = index + 1
                var end = start
                var escaped = false
                while end < count, bytes[end] != UInt8(ascii: "\"") {
                    if bytes[end] == UInt8(ascii: "\\") { escaped = true; end += 1 }
                    end += 1
                }
                if expectingName, frames.last?.names != nil {
                    let raw = UnsafeRawBufferPointer(rebasing: bytes[start..<min(end, count)])
                    let name = escaped ? unescaped(raw) : String(decoding: raw, as: UTF8.self)
                    guard frames[frames.count - 1].names!.insert(name).inserted else {
                        return (frames.compactMap(\.name) + [name]).joined(separator: ".")
                    }
                    lastName = name
                    expectingName = false
                }
                index = end + 1
                continue
            case UInt8(ascii: "{"):
                frames.append(Frame(names: [], name: frames.last?.names != nil ? lastName : nil))
                expectingName = true
            case UInt8(ascii: "["):
                frames.append(Frame(names: nil, name: frames.last?.names != nil ? lastName : nil))
            case UInt8(ascii: "}"), UInt8(ascii: "]"):
                if !frames.isEmpty { frames.removeLast() }
                expectingName = false
            case UInt8(ascii: ","):
                expectingName = frames.last?.names != nil
            default:
                break
            }
            index += 1
        }
        return nil
    }

    public static func first(in data: Data) -> String? {
        data.withUnsafeBytes { first(in: $0) }
    }

    /// A name written with escapes (`\u0061`), as the decoder reads it.
    private static func unescaped(_ raw: UnsafeRawBufferPointer) -> String {
        let quoted = Data([UInt8(ascii: "\"")] + raw + [UInt8(ascii: "\"")])
        return (try? JSONDecoder().decode(String.self, from: quoted)) ?? String(decoding: raw, as: UTF8.self)
    }
}
