/// What an app's `appAccountToken` names: one order (the default), or the user whose account it
/// is, as Apple documents the token (`appAccountTokens: "user"` on the app).
public enum AppAccountTokenScope: String, Codable, Sendable, CaseIterable {
    /// The token names one order; a second order with it is refused.
    case order
    /// The token names its user: several of the user's orders carry it, and a transaction with it
    /// resolves the user, never an order by itself.
    case user

    /// Reads a setting's value, naming `field` when it is neither.
    public init(setting value: String, field: String) throws(LedgerInputError) {
        guard let scope = Self(rawValue: value.lowercased()) else {
            throw LedgerInputError(field: field, problem: "is \(value.debugDescription); use order or user")
        }
        self = scope
    }
}
