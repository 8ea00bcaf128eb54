import Foundation
import NIOSSL
import PostgresNIO

/// A parsed `postgres://user:password@host:port/database?sslmode=…` URL.
///
/// `host` may also be given as a query item `host=/path/to/socket/dir`, as libpq allows, to
/// connect through a Unix socket.
public struct DatabaseURL: Sendable, Equatable, CustomStringConvertible {
    public enum SSLMode: String, Sendable {
        case disable, prefer, require
    }

    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    public var sslMode: SSLMode

    public init(_ text: String) throws(LedgerConfigurationProblem) {
        guard let components = URLComponents(string: text),
              let scheme = components.scheme, ["postgres", "postgresql"].contains(scheme)
        else {
            throw LedgerConfigurationProblem("LEDGER_DATABASE_URL", "is not a postgres:// URL")
        }
        let items = Dictionary((components.queryItems ?? []).map { ($0.name, $0.value ?? "") }, uniquingKeysWith: { $1 })
        host = items["host"] ?? components.host ?? ""
        guard !host.isEmpty else { throw LedgerConfigurationProblem("LEDGER_DATABASE_URL", "names no host") }
        port = components.port ?? 5432
        guard (1...65535).contains(port) else {
            throw LedgerConfigurationProblem("LEDGER_DATABASE_URL", "has port \(port); a port is 1 to 65535")
        }
        guard let user = components.user, !user.isEmpty else {
            throw LedgerConfigurationProblem("LEDGER_DATABASE_URL", "names no user")
        }
        username = user.removingPercentEncoding ?? user
        password = components.password.map { $0.removingPercentEncoding ?? $0 }
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        database = path.isEmpty ? username : path
        let mode = items["sslmode"] ?? (host.hasPrefix("/") ? "disable" : "prefer")
        guard let sslMode = SSLMode(rawValue: mode) else {
            throw LedgerConfigurationProblem("LEDGER_DATABASE_URL", "has sslmode \(mode); use disable, prefer or require")
        }
        self.sslMode = sslMode
    }

    /// The same server, another database.
    public func with(database: String) -> DatabaseURL {
        var copy = self
        copy.database = database
        return copy
    }

    public var clientConfiguration: PostgresClient.Configuration {
        if host.hasPrefix("/") {
            return .init(unixSocketPath: "\(host)/.s.PGSQL.\(port)", username: username, password: password, database: database)
        }
        let tls: PostgresClient.Configuration.TLS = switch sslMode {
        case .disable: .disable
        case .prefer: .prefer(.makeClientConfiguration())
        case .require: .require(.makeClientConfiguration())
        }
        return .init(host: host, port: port, username: username, password: password, database: database, tls: tls)
    }

    /// The same server for a single connection of its own (the health probe's), with TLS as
    /// `sslmode` says; throws when TLS is asked for and no TLS context can be made.
    public func connectionConfiguration() throws -> PostgresConnection.Configuration {
        if host.hasPrefix("/") {
            return .init(unixSocketPath: "\(host)/.s.PGSQL.\(port)", username: username, password: password, database: database)
        }
        let tls: PostgresConnection.Configuration.TLS = switch sslMode {
        case .disable: .disable
        case .prefer: .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
        case .require: .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
        }
        return .init(host: host, port: port, username: username, password: password, database: database, tls: tls)
    }

    /// The URL with the password hidden, for logs.
    public var description: String {
        "postgres://\(username)\(password == nil ? "" : ":***")@\(host.hasPrefix("/") ? "" : host):\(port)/\(database)"
    }
}

/// One bad or missing setting, naming it.
public struct LedgerConfigurationProblem: Error, Sendable, Equatable, CustomStringConvertible {
    public let setting: String
    public let problem: String

    public init(_ setting: String, _ problem: String) {
        self.setting = setting
        self.problem = problem
    }

    public var description: String { "\(setting) \(problem)" }
}

extension PostgresClient.Configuration {
    /// This configuration as a `LEDGER_DATABASE_URL` (a Unix socket as `?host=<folder>`), for
    /// handing a database to a child process.
    public var url: String {
        let database = self.database ?? username
        let user = username.addingPercentEncoding(withAllowedCharacters: .urlUserAllowed) ?? username
        let password = self.password.map { ":" + ($0.addingPercentEncoding(withAllowedCharacters: .urlPasswordAllowed) ?? $0) } ?? ""
        if let socket = unixSocketPath {
            return "postgres://\(user)\(password)@/\(database)?host=\(URL(fileURLWithPath: socket).deletingLastPathComponent().path)"
        }
        return "postgres://\(user)\(password)@\(host ?? "localhost"):\(port ?? 5432)/\(database)"
    }
}

extension Duration {
    /// The duration in seconds, fractions included.
    public var inSeconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
