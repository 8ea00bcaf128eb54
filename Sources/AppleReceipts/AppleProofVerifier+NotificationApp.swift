extension AppleProofVerifier {
    /// Checks a notification against the app, by whichever part names it (Apple's
    /// SignedDataVerifier.verifyAndDecodeNotification): the bundle id, the environment (one the
    /// app accepts), and for Production-signed data the app's Apple id. A notification that
    /// names no app is refused: there is nothing to tell it from another app's. `onlyFor`: the
    /// bundle id the notification must name, whatever its case (a per-app URL's). Answers the
    /// app checked against.
    func checkApp(of payload: SignedNotificationPayload, onlyFor: String? = nil) async throws(AppleVerificationError) -> App {
        guard let named = payload.namedApp else {
            throw AppleVerificationError(
                code: "notification-without-app",
                message: "the notification carries none of data, summary, externalPurchaseToken or appData, so it names no app to check")
        }
        if let onlyFor, named.bundleId?.lowercased() != onlyFor.lowercased() {
            throw AppleVerificationError(
                code: "wrong-bundle-id",
                message: "the notification's \(named.part) is for bundle \"\(named.bundleId ?? "")\", and this URL takes \(onlyFor)'s only")
        }
        let app = try await heldApp(for: named.bundleId, environment: named.environment, part: "the notification's \(named.part) is")
        // Whatever the case, as a transaction's bundle id is checked: the app was found so.
        if let expected = app.bundleId, named.bundleId?.lowercased() != expected.lowercased() {
            throw AppleVerificationError(
                code: "wrong-bundle-id", message: "the notification's \(named.part) is for bundle \"\(named.bundleId ?? "")\", not \"\(expected)\"")
        }
        guard app.accepts(named.environment) else {
            throw AppleVerificationError(
                code: "wrong-environment",
                message: "the notification's \(named.part) is from the \(named.environment ?? "unnamed") environment; \(app.accepting)")
        }
        if app.checksAppAppleId(named.environment), let expected = app.appAppleId, named.appAppleId != expected {
            throw AppleVerificationError(
                code: "wrong-app-id",
                message: "the notification's \(named.part) is for app id \(named.appAppleId.map(String.init) ?? "none"), not \(expected)")
        }
        return app
    }
}
