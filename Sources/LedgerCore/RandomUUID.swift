import Foundation

extension UUID {
    /// A random (version 4) UUID from the system's random number generator. Foundation's `UUID()`
    /// opens /dev/urandom for every UUID on Linux, which `ledger bench append` showed as 6% of the
    /// writing process; this takes the same 122 random bits from `RandomBytes`, which asks the
    /// kernel for 4 KiB at a time (`SystemRandomNumberGenerator` made one getrandom call per 8
    /// bytes: two system calls per UUID, two to four per order request). It calls the system from
    /// `LedgerCore`, I/O-free otherwise, because the domain makes its event ids and tokens.
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
