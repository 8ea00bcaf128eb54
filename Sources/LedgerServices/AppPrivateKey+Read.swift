import Foundation
import LedgerCore

extension AppPrivateKey {
    /// The key's PEM text: the stored one, or read now from where its reference points (the
    /// variable of `environment`, the process's own unless given; or the file). Read at each
    /// use, so that a rotated key is taken without a restart.
    public func pem(environment: [String: String] = ProcessInfo.processInfo.environment) throws(AppPrivateKeyUnavailable) -> String {
        switch self {
        case .stored(let pem):
            return pem
        case .reference(.environment(let name)):
            guard let pem = environment[name], !pem.isEmpty else { throw AppPrivateKeyUnavailable(reference: .environment(name), reason: "the variable is unset") }
            return pem
        case .reference(.file(let path)):
            guard let pem = try? String(contentsOfFile: path, encoding: .utf8) else {
                throw AppPrivateKeyUnavailable(reference: .file(path), reason: "the file is missing or unreadable")
            }
            return pem
        }
    }
}

/// A private key's reference that points at nothing readable, with a stable code; it names the
/// reference, never a key.
public struct AppPrivateKeyUnavailable: Error, Sendable, Equatable, CustomStringConvertible {
    public let reference: SecretReference
    public let reason: String

    public init(reference: SecretReference, reason: String) {
        self.reference = reference
        self.reason = reason
    }

    public var code: String { "app-key-unavailable" }
    public var description: String { "the App Store Server API private key at \(reference) cannot be read: \(reason)" }
}
