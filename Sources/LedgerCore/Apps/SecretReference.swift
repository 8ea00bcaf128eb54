/// Where a secret is read when it is used, instead of being stored: `env:NAME`, an environment
/// variable of the ledger's process, or `file:PATH`, a file on its machine. The reference is
/// not secret; what it names is.
public enum SecretReference: Sendable, Hashable, CustomStringConvertible {
    case environment(String)
    case file(String)

    /// Reads `env:NAME` (NAME: a letter or underscore, then letters, digits, underscores; up to
    /// 128) or `file:PATH` (up to 1024 characters, no control characters).
    public init(_ text: String, field: String) throws(LedgerInputError) {
        if text.hasPrefix("env:") {
            let name = String(text.dropFirst(4))
            let bytes = Array(name.utf8)
            let letter = { (b: UInt8) in (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x5F }
            guard let first = bytes.first, letter(first), bytes.count <= 128, bytes.allSatisfy({ letter($0) || ($0 >= 0x30 && $0 <= 0x39) }) else {
                throw LedgerInputError(field: field, problem: "names no environment variable: write env:NAME, NAME of letters, digits and underscores, not starting with a digit")
            }
            self = .environment(name)
        } else if text.hasPrefix("file:") {
            let path = String(text.dropFirst(5))
            do {
                self = .file(try Identifier.validate(path, field: field, maximumLength: 1024))
            } catch {
                throw LedgerInputError(field: field, problem: "names no file: write file:PATH (\(error.problem))")
            }
        } else {
            throw LedgerInputError(field: field, problem: "must be env:NAME (an environment variable) or file:PATH (a file)")
        }
    }

    /// `env:NAME` or `file:PATH`, as stored and shown.
    public var description: String {
        switch self {
        case .environment(let name): "env:\(name)"
        case .file(let path): "file:\(path)"
        }
    }
}
