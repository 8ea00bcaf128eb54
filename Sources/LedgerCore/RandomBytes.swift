import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Bytes from the system's cryptographically secure generator, fetched in blocks and handed out
/// once each: the same kind of bytes `SystemRandomNumberGenerator` gives, in fewer system calls
/// (on Linux it makes one getrandom call per 8 bytes). The ledger never forks without exec, so
/// no two processes share a block.
final class RandomBytes: Sendable {
    static let shared = RandomBytes()

    /// Noncopyable so that a block can only be used in place, under the lock: a copy would hand
    /// the same bytes out twice.
    private struct Block: ~Copyable {
        var bytes = [UInt8](repeating: 0, count: RandomBytes.blockSize)
        /// Bytes handed out; a new block starts used up, so the first draw fills it.
        var used = RandomBytes.blockSize
    }

    static let blockSize = 4096
    /// Larger draws go straight to the system: a block serves at least four of them.
    static let largestBlockDraw = blockSize / 4
    private let block = Mutex(Block())

    /// Fills `destination` with fresh random bytes.
    func fill(_ destination: UnsafeMutableRawBufferPointer) {
        guard destination.count <= Self.largestBlockDraw else {
            Self.systemFill(destination)
            return
        }
        // The refill happens under the lock (16 system calls, a few microseconds, once per 256
        // UUIDs): other draws wait for it rather than make system calls of their own.
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

    /// The system's generator, straight into `destination`: on Linux getentropy (getrandom),
    /// 256 bytes per call at most; elsewhere the standard library's generator (arc4random on
    /// Apple's systems, no system call per draw).
    private static func systemFill(_ destination: UnsafeMutableRawBufferPointer) {
        var filled = 0
        #if canImport(Glibc)
        while filled < destination.count {
            let chunk = min(256, destination.count - filled)
            // getentropy fails only on kernels without getrandom (before 3.17): the standard
            // library's generator, below, still works there (it reads /dev/urandom).
            guard getentropy(destination.baseAddress! + filled, chunk) == 0 else { break }
            filled += chunk
        }
        #endif
        var generator = SystemRandomNumberGenerator()
        while filled < destination.count {
            var word: UInt64 = generator.next()
            let count = min(8, destination.count - filled)
            withUnsafeBytes(of: &word) { destination.baseAddress!.advanced(by: filled).copyMemory(from: $0.baseAddress!, byteCount: count) }
            filled += count
        }
    }
}
