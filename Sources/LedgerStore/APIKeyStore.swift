import Crypto
import Foundation
import Logging
import PostgresNIO

/// What an API key allows.
public enum APIScope: String, Sendable, CaseIterable, Codable {
    case append, read, admin
}

/// A stored API key, without the key itself.
public struct APIKey: Sendable, Equatable {
    public let name: String
    public let scopes: Set<APIScope>
    public let createdAt: Date
    public let revokedAt: Date?

    /// `admin` includes the other scopes.
    public func allows(_ scope: APIScope) -> Bool {
        scopes.contains(scope) || scopes.contains(.admin)
    }
}

/// Creates, finds and revokes API keys; only SHA-256 hashes of keys are stored.
public struct APIKeyStore: Sendable {
    public let database: Database

    public init(database: Database) {
        self.database = database
    }

    /// Creates a key and returns it: the only time it is ever shown.
    public func create(name: String, scopes: Set<APIScope>) async throws -> String {
        guard !name.isEmpty, name.count <= 128 else { throw APIKeyError.invalidName }
        guard !scopes.isEmpty else { throw APIKeyError.noScopes }
        var generator = SystemRandomNumberGenerator()
        let key = "ol_" + Self.hex((0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) })
        let names = scopes.map(\.rawValue).sorted()
        do {
            try await database.query(
                "INSERT INTO api_keys (name, key_hash, scopes) VALUES (\(name), \(Self.hash(key)), \(names))")
        } catch let error as PSQLError where error.sqlState == .uniqueViolation {
            throw APIKeyError.nameTaken(name)
        }
        return key
    }

    /// The key's record when it exists and is not revoked.
    public func find(key: String) async throws -> APIKey? {
        let rows = try await database.query(
            "SELECT name, scopes, created_at, revoked_at FROM api_keys WHERE key_hash = \(Self.hash(key)) AND revoked_at IS NULL")
        return try await Self.decode(rows).first
    }

    public func list() async throws -> [APIKey] {
        let rows = try await database.query(
            "SELECT name, scopes, created_at, revoked_at FROM api_keys ORDER BY name")
        return try await Self.decode(rows)
    }

    /// Revokes the key named `name`; false when there is no such unrevoked key.
    public func revoke(name: String) async throws -> Bool {
        let rows = try await database.query(
            "UPDATE api_keys SET revoked_at = now() WHERE name = \(name) AND revoked_at IS NULL RETURNING name")
        for try await _ in rows.decode(String.self) { return true }
        return false
    }

    static func hash(_ key: String) -> String {
        hex(Array(SHA256.hash(data: Data(key.utf8))))
    }

    /// Lower-case hexadecimal (String(format:) goes through the locale machinery: slow).
    static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var text = [UInt8]()
        text.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            text.append(digits[Int(byte >> 4)])
            text.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: text, as: UTF8.self)
    }

    static func decode(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [APIKey] {
        var keys: [APIKey] = []
        for try await (name, scopes, created, revoked) in rows.decode((String, [String], Date, Date?).self) {
            keys.append(APIKey(name: name, scopes: Set(scopes.compactMap(APIScope.init(rawValue:))), createdAt: created, revokedAt: revoked))
        }
        return keys
    }
}

/// Why a key could not be created.
public enum APIKeyError: Error, Sendable, Equatable, CustomStringConvertible {
    case invalidName, noScopes, nameTaken(String)

    public var description: String {
        switch self {
        case .invalidName: "a key name has 1 to 128 characters"
        case .noScopes: "a key needs at least one scope: append, read or admin"
        case .nameTaken(let name): "a key named \(name) exists already"
        }
    }
}
