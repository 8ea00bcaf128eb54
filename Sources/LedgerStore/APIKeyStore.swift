import Crypto
import Foundation
import LedgerCore
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
    /// The apps the key may reach, as the apps table spells them; nil: every app, those added
    /// later too.
    public let apps: [BundleID]?
    public let createdAt: Date
    public let revokedAt: Date?

    public init(name: String, scopes: Set<APIScope>, apps: [BundleID]? = nil, createdAt: Date, revokedAt: Date? = nil) {
        self.name = name
        self.scopes = scopes
        self.apps = apps
        self.createdAt = createdAt
        self.revokedAt = revokedAt
    }

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

    /// Whether `name` may name a key: 1 to 128 characters, none a control character (the name is
    /// a line of `ledger keys list` and every event's `appendedBy`).
    public static func usableName(_ name: String) -> Bool {
        !name.isEmpty && name.count <= 128 && !name.unicodeScalars.contains { $0.properties.generalCategory == .control }
    }

    /// Creates a key and returns it: the only time it is ever shown. `apps`: the apps it may
    /// reach, each one the ledger holds (in any case); nil: every app, those added later too.
    public func create(name: String, scopes: Set<APIScope>, apps: [BundleID]? = nil) async throws -> String {
        guard Self.usableName(name) else { throw APIKeyError.invalidName }
        guard !scopes.isEmpty else { throw APIKeyError.noScopes }
        var stored: [String]?
        if let apps { stored = try await self.stored(apps) }
        var generator = SystemRandomNumberGenerator()
        let key = "ol_" + Self.hex((0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) })
        let names = scopes.map(\.rawValue).sorted()
        do {
            // A key of every app leaves `apps` out (null), as keys were written before migration 015.
            let insert: PostgresQuery = if let stored {
                "INSERT INTO api_keys (name, key_hash, scopes, apps) VALUES (\(name), \(Self.hash(key)), \(names), \(stored))"
            } else {
                "INSERT INTO api_keys (name, key_hash, scopes) VALUES (\(name), \(Self.hash(key)), \(names))"
            }
            try await database.query(insert)
        } catch let error as PSQLError where error.sqlState == .uniqueViolation {
            throw APIKeyError.nameTaken(name)
        }
        return key
    }

    /// The apps as the apps table spells them (apps are never deleted, so they stay apps); throws
    /// `unknownApps` naming those the ledger does not hold, and `noApps` for an empty list.
    func stored(_ apps: [BundleID]) async throws -> [String] {
        guard !apps.isEmpty else { throw APIKeyError.noApps }
        let rows = try await database.query(
            """
            SELECT w.name, a.bundle_id FROM unnest(\(apps.map(\.rawValue))::text[]) WITH ORDINALITY AS w (name, n)
              LEFT JOIN apps a ON lower(a.bundle_id) = lower(w.name) ORDER BY w.n
            """)
        var found: [String] = [], unknown: [String] = []
        for try await (name, stored) in rows.decode((String, String?).self) {
            if let stored { if !found.contains(stored) { found.append(stored) } } else { unknown.append(name) }
        }
        guard unknown.isEmpty else { throw APIKeyError.unknownApps(unknown) }
        return found
    }

    /// The key's record when it exists and is not revoked.
    public func find(key: String) async throws -> APIKey? {
        let rows = try await database.query(
            "SELECT name, scopes, apps, created_at, revoked_at FROM api_keys WHERE key_hash = \(Self.hash(key)) AND revoked_at IS NULL")
        return try await Self.decode(rows).first
    }

    public func list() async throws -> [APIKey] {
        let rows = try await database.query(
            "SELECT name, scopes, apps, created_at, revoked_at FROM api_keys ORDER BY name")
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
        for try await (name, scopes, apps, created, revoked) in rows.decode((String, [String], [String]?, Date, Date?).self) {
            keys.append(APIKey(
                name: name, scopes: Set(scopes.compactMap(APIScope.init(rawValue:))), apps: apps.map { $0.map(BundleID.init(unchecked:)) },
                createdAt: created, revokedAt: revoked))
        }
        return keys
    }
}

/// Why a key could not be created.
public enum APIKeyError: Error, Sendable, Equatable, CustomStringConvertible {
    case invalidName, noScopes, nameTaken(String), noApps, unknownApps([String])

    public var description: String {
        switch self {
        case .invalidName: "a key name has 1 to 128 characters, none a control character"
        case .noScopes: "a key needs at least one scope: append, read or admin"
        case .nameTaken(let name): "a key named \(name) exists already"
        case .noApps: "a key limited to apps names at least one (leave the apps out for a key of every app)"
        case .unknownApps(let names):
            "the ledger holds no app \(names.joined(separator: ", ")) (see ledger apps list; add it with ledger apps add)"
        }
    }
}
