#if canImport(Glibc)
import Glibc
#endif

/// A TCP socket connected to 127.0.0.1:`port` whose reads give up after `seconds`; nil when it
/// could not connect. The caller closes it. For tests that speak HTTP by hand: what a client
/// library hides (a head sent before its body, a connection reused or closed) is sent as it is.
public func connectedLocalSocket(port: Int, readTimeout seconds: Int = 30) -> Int32? {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { return nil }
    var timeout = timeval(tv_sec: seconds, tv_usec: 0)
    setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = in_port_t(UInt16(port).bigEndian)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
    guard connected else {
        close(descriptor)
        return nil
    }
    return descriptor
}
