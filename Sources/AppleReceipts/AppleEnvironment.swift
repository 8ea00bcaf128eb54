/// The App Store environment a transaction or notification comes from, as Apple names it.
public enum AppleEnvironment: String, Codable, Sendable, CaseIterable {
    case production = "Production"
    case sandbox = "Sandbox"
    case xcode = "Xcode"
    case localTesting = "LocalTesting"

    /// Reads an environment case-insensitively (`production`, `Production`, `PRODUCTION`).
    public init?(name: String) {
        guard let match = Self.allCases.first(where: { $0.rawValue.lowercased() == name.lowercased() }) else { return nil }
        self = match
    }
}
