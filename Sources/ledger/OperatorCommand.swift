import AppleReceipts
import ArgumentParser
import Foundation
import LedgerServer

/// Progress on standard error ("12 of 40 users"), only when it is a terminal.
func terminalProgress(_ unit: String) -> (@Sendable (Int, Int) -> Void)? {
    guard isatty(STDERR_FILENO) == 1 else { return nil }
    return { @Sendable (done: Int, total: Int) in
        FileHandle.standardError.write(Data("\r\(done) of \(total) \(unit)".utf8))
        if done >= total { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}

/// The metadata of the events a command appends: who ran it, as `ledger <command>` and the
/// operating-system user (over HTTP, a key's name is recorded instead).
func operatorMetadata(_ command: String) throws -> Data {
    let who = "ledger \(command) (\(ProcessInfo.processInfo.environment["USER"] ?? "unknown user"))"
    return try JSONSerialization.data(withJSONObject: ["appendedBy": who])
}

extension LedgerConfiguration {
    /// The App Store Server API's settings, for a command that cannot run without them.
    func requiredAppStoreServerAPI() throws -> AppStoreServerAPI.Settings {
        guard let settings = try apple.appStoreServerAPI() else {
            throw ValidationError("the App Store Server API is not configured: set LEDGER_APPLE_API_KEY_ID, LEDGER_APPLE_API_ISSUER_ID and LEDGER_APPLE_API_PRIVATE_KEY")
        }
        return settings
    }
}
