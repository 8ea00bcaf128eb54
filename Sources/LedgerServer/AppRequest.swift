import AppleReceipts
import LedgerCore

/// The body of `POST /v1/apps` and `PATCH /v1/apps/{bundleId}`: the members given, each checked
/// (a member left out is left as it is; `null` clears what may be cleared). A member the API
/// does not know is refused, so that a misspelt one is not silently ignored.
struct AppRequest: Decodable {
    static let fields = [
        "bundleId", "appAppleId", "environments", "refundPreference", "appAccountTokens", "sku", "retired", "sharedSecret", "apiKey",
    ]
    static let keyFields = ["issuerId", "keyId", "privateKey", "privateKeyRef"]

    var bundleId: BundleID?
    var changes = AppChanges()

    struct Member: CodingKey {
        let stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    init(from decoder: any Decoder) throws {
        let json = try decoder.container(keyedBy: Member.self)
        for key in json.allKeys where !Self.fields.contains(key.stringValue) {
            throw LedgerInputError(field: key.stringValue, problem: "is not a member of an app; use \(Self.fields.joined(separator: ", "))")
        }
        func given(_ name: String) -> Member? { json.contains(Member(stringValue: name)) ? Member(stringValue: name) : nil }
        func isNull(_ key: Member) throws -> Bool { try json.decodeNil(forKey: key) }
        func notNull(_ key: Member, _ what: String) throws {
            if try isNull(key) { throw LedgerInputError(field: key.stringValue, problem: "cannot be null; \(what)") }
        }

        if let key = given("bundleId") { bundleId = try json.decode(BundleID.self, forKey: key) }
        if let key = given("appAppleId") {
            if try isNull(key) {
                changes.appAppleId = .some(nil)
            } else {
                // A fraction or a number past Int64 is refused by the decoder without naming the member.
                guard let id = try? json.decode(Int64.self, forKey: key) else {
                    throw LedgerInputError(field: "appAppleId", problem: "must be Apple's numeric app id, a whole number above 0")
                }
                changes.appAppleId = .some(try App.appleId(id))
            }
        }
        if let key = given("environments") {
            try notNull(key, "name Production and/or Sandbox")
            changes.environments = try App.Environment.list(json.decode([String].self, forKey: key), field: "environments")
        }
        if let key = given("refundPreference") {
            if try isNull(key) {
                changes.refundPreference = .some(nil)
            } else {
                let text = try json.decode(String.self, forKey: key)
                guard let preference = RefundPreference(rawValue: text) else {
                    throw LedgerInputError(field: "refundPreference", problem: "must be DECLINE, GRANT_FULL or GRANT_PRORATED")
                }
                changes.refundPreference = .some(preference)
            }
        }
        if let key = given("appAccountTokens") {
            try notNull(key, "use order or user")
            changes.appAccountTokens = try AppAccountTokenScope(setting: json.decode(String.self, forKey: key), field: "appAccountTokens")
        }
        if let key = given("sku") {
            changes.sku = try isNull(key) ? .some(nil) : .some(try App.sku(json.decode(String.self, forKey: key)))
        }
        if let key = given("retired") {
            try notNull(key, "use true or false")
            changes.retired = try json.decode(Bool.self, forKey: key)
        }
        if let key = given("sharedSecret") {
            changes.sharedSecret = try isNull(key) ? .some(nil) : .some(try AppCredentials.sharedSecret(json.decode(String.self, forKey: key)))
        }
        if let key = given("apiKey") {
            changes.apiKey = try isNull(key) ? .some(nil) : .some(try Self.apiKey(json.nestedContainer(keyedBy: Member.self, forKey: key)))
        }
    }

    /// `{issuerId, keyId, privateKey | privateKeyRef}`: the key whole, its private key as the
    /// `.p8` file's PEM text (stored) or as a reference (`env:NAME`, `file:PATH`) read where it
    /// is used. The private key is never repeated in an error.
    static func apiKey(_ json: KeyedDecodingContainer<Member>) throws -> AppCredentials.APIKey {
        for key in json.allKeys where !keyFields.contains(key.stringValue) {
            throw LedgerInputError(field: "apiKey.\(key.stringValue)", problem: "is not a member of an API key; use \(keyFields.joined(separator: ", "))")
        }
        func text(_ name: String) throws -> String? {
            let key = Member(stringValue: name)
            guard json.contains(key), try !json.decodeNil(forKey: key) else { return nil }
            return try json.decode(String.self, forKey: key)
        }
        guard let issuer = try text("issuerId") else { throw LedgerInputError(field: "apiKey.issuerId", problem: "is missing") }
        guard let keyID = try text("keyId") else { throw LedgerInputError(field: "apiKey.keyId", problem: "is missing") }
        let privateKey: AppPrivateKey
        switch (try text("privateKey"), try text("privateKeyRef")) {
        case (let pem?, nil):
            privateKey = .stored(pem: try checkedPrivateKeyPEM(pem, field: "apiKey.privateKey"))
        case (nil, let reference?):
            privateKey = .reference(try SecretReference(reference, field: "apiKey.privateKeyRef"))
        case (nil, nil):
            throw LedgerInputError(field: "apiKey.privateKey", problem: "is missing: give privateKey (the .p8 file's text) or privateKeyRef (env:NAME or file:PATH)")
        case (_?, _?):
            throw LedgerInputError(field: "apiKey.privateKeyRef", problem: "cannot be given with privateKey: give one of them")
        }
        return try .checked(issuerId: issuer, keyId: keyID, privateKey: privateKey, field: "apiKey")
    }
}

/// `pem` when it holds an In-App Purchase key (a P-256 private key in PEM); otherwise an error
/// naming `field`, which never repeats the text.
public func checkedPrivateKeyPEM(_ pem: String, field: String) throws(LedgerInputError) -> String {
    guard pem.utf8.count <= 16_384, (try? AppStoreServerAPI.key(pem)) != nil else {
        throw LedgerInputError(field: field, problem: "holds no P-256 private key in PEM (the text of Apple's .p8 key file)")
    }
    return pem
}
