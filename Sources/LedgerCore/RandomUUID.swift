import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension UUID {
    /// A random (version 4) UUID from the system's random number generator. Foundation's `UUID()`
    /// opens /dev/urandom for every UUID on Linux, which `ledger bench append` showed as 6% of the
    /// writing process; this takes the same 122 random bits from `RandomBytes`, which asks the
    /// kernel for 4 KiB at a time (`SystemRandomNumberGenerator` made one getrandom call per 8
    /// bytes: two system calls per UUID, two to four per order request).
    public static func random() -> UUID {
        var bytes = (UInt64(0), UInt64(0))
        withUnsafeMutableBytes(of: &bytes) { RandomBytes.shared.fill($0) }
        return withUnsafeMutableBytes(of: &bytes) { raw in
            raw[6] = (raw[6] & 0x0F) | 0x40  // version 4
            raw[8] = (raw[8] & 0x3F) | 0x80  // RFC 4122 variant
            return UUID(uuid: (raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7],
                               raw[8], raw[9], raw[10], raw[11], raw[12], raw[13], raw[14], raw[15]))
        }
    }
}

/// Bytes from the kernel's cryptographically secure generator, fetched in blocks and handed out
/// once each: the same bytes `SystemRandomNumberGenerator` would give, in fewer system calls.
/// The ledger never forks without exec, so no two processes share a block.
public final class RandomBytes: Sendable {
    public static let shared = RandomBytes()

    private struct Block: ~Copyable {
        var bytes = [UInt8](repeating: 0, count: RandomBytes.blockSize)
        var used = RandomBytes.blockSize
    }

    static let blockSize = 4096
    private let block = Mutex(Block())

    /// Fills `destination` with fresh random bytes.
    public func fill(_ destination: UnsafeMutableRawBufferPointer) {
        guard destination.count <= Self.blockSize / 4 else {
            Self.systemFill(destination)
            return
        }
        block.withLock { block in
            if block.used + destination.count > Self.blockSize {
                block.bytes.withUnsafeMutableBytes { Self.systemFill($0) }
                block.used = 0
            }
            block.bytes.withUnsafeBytes { source in
                destination.copyMemory(from: UnsafeRawBufferPointer(rebasing: source[block.used..<(block.used + destination.count)]))
            }
            block.used += destination.count
        }
    }

    /// The kernel's generator, straight into `destination`: getentropy, 256 bytes per call at most.
    private static func systemFill(_ destination: UnsafeMutableRawBufferPointer) {
        var filled = 0
        while filled < destination.count {
            let chunk = min(256, destination.count - filled)
            guard getentropy(destination.baseAddress! + filled, chunk) == 0 else {
                // getentropy fails only on kernels without getrandom (before 3.17); the standard
                // library's generator still works there (it reads /dev/urandom).
                var generator = SystemRandomNumberGenerator()
                for index in filled..<destination.count { destination[index] = generator.next() }
                return
            }
            filled += chunk
        }
    }
}
