import AppleReceipts
import LedgerCore
import LedgerStore

extension LedgerConfiguration.Apple {
    /// The app settings verification cannot go without, as Apple's own verifiers require them:
    /// once root certificates are configured (signed proofs are verified), the bundle id always,
    /// and the app's Apple id when the ledger accepts production; with an App Store Server API
    /// key, the bundle id its tokens name. Without root certificates or a key (the quickstart),
    /// nothing is required.
    public func identityProblems() -> [LedgerConfigurationProblem] {
        typealias Key = LedgerConfiguration.Key
        let verifies = !rootCertificateFiles.isEmpty
        let asksApple = apiKeyID != nil && apiIssuerID != nil && apiPrivateKeyFile != nil
        var problems: [LedgerConfigurationProblem] = []
        if bundleID == nil {
            let needs = [
                verifies ? "\(Key.appleRootCertificates) is set, and every signed proof and notification is checked against the app's bundle id" : nil,
                asksApple ? "the App Store Server API's tokens name the app (bid)" : nil,
            ].compactMap { $0 }
            if !needs.isEmpty { problems.append(.init(Key.appleBundleID, "is missing: " + needs.joined(separator: ", and "))) }
        }
        // An app is its bundle id (docs/apps.md): one Apple could not have signed is refused here.
        if let bundleID, (try? BundleID(bundleID)) == nil {
            problems.append(.init(Key.appleBundleID, "is \(bundleID); a bundle id holds only letters, digits, hyphens and periods (at most 128), starting with a letter or digit"))
        }
        if verifies, appID == nil, environments.contains(.production) {
            problems.append(.init(
                Key.appleAppID,
                "is missing: \(Key.appleRootCertificates) is set and \(Key.appleEnvironment) accepts Production, where every notification is checked against the app's Apple id"))
        }
        return problems
    }
}
