import AppleReceipts
import Foundation
import LedgerServices
import LedgerStore
import Logging

extension LedgerConfiguration {
    /// The App Store Connect API's settings for sales reports (docs/finance.md): a Team API key
    /// of the Sales or Finance role (not the In-App Purchase key) and the vendor number; all of
    /// them or none (then the ledger fetches no sales report).
    public struct AppStoreConnect: Sendable, Equatable {
        public var url = AppStoreConnectAPI.appleURL
        public var issuerID: String
        public var keyID: String
        /// The path of the key's `.p8` PEM file, read when the client is made.
        public var privateKeyFile: String
        public var vendorNumber: String
        /// The sales report's version (`LEDGER_APP_STORE_CONNECT_SALES_VERSION`, default 1_0).
        public var salesVersion = "1_0"

        public init(issuerID: String, keyID: String, privateKeyFile: String, vendorNumber: String) {
            self.issuerID = issuerID
            self.keyID = keyID
            self.privateKeyFile = privateKeyFile
            self.vendorNumber = vendorNumber
        }

        /// The client, with the key read from its file.
        public func client(logger: Logger) async throws -> AppStoreConnectAPI {
            guard let pem = try? String(contentsOfFile: privateKeyFile, encoding: .utf8) else {
                throw AppStoreConnectError(code: "app-store-connect-key-invalid", message: "\(Key.appStoreConnectPrivateKey) names \(privateKeyFile), which is missing or unreadable")
            }
            var settings = AppStoreConnectAPI.Settings(
                keyID: keyID, issuerID: issuerID, privateKeyPEM: pem, vendorNumber: vendorNumber, version: salesVersion, baseURL: url)
            settings.timeout = .seconds(60)
            return try await AppStoreConnectAPI(settings: settings, logger: logger)
        }

        /// The settings in `values`, or nil when none is given; the problems of those given.
        static func load(_ values: [String: String]) -> (AppStoreConnect?, [LedgerConfigurationProblem]) {
            let keys = [Key.appStoreConnectIssuerID, Key.appStoreConnectKeyID, Key.appStoreConnectPrivateKey, Key.appStoreConnectVendorNumber]
            let given = keys.map { values[$0] }
            var problems: [LedgerConfigurationProblem] = []
            guard given.contains(where: { $0 != nil }) else {
                for key in [Key.appStoreConnectURL, Key.appStoreConnectSalesVersion] where values[key] != nil {
                    problems.append(.init(key, "is set without the App Store Connect key: set \(keys.joined(separator: ", ")) too"))
                }
                return (nil, problems)
            }
            for (key, value) in zip(keys, given) where value == nil {
                problems.append(.init(key, "is missing: sales reports need the Team API key's issuer id, key id and key file, and the vendor number together"))
            }
            guard let issuer = given[0], let keyID = given[1], let file = given[2], let vendor = given[3] else { return (nil, problems) }
            if let problem = LedgerConfiguration.privateKeyProblem(file) {
                problems.append(.init(Key.appStoreConnectPrivateKey, problem))
            }
            if vendor.isEmpty || !vendor.allSatisfy(\.isNumber) {
                problems.append(.init(Key.appStoreConnectVendorNumber, "is \(vendor); use the vendor number App Store Connect shows (digits)"))
            }
            var settings = AppStoreConnect(issuerID: issuer, keyID: keyID, privateKeyFile: file, vendorNumber: vendor)
            if let text = values[Key.appStoreConnectURL] {
                if let url = URL(string: text), ["http", "https"].contains(url.scheme ?? ""), url.host != nil { settings.url = text } else {
                    problems.append(.init(Key.appStoreConnectURL, "is \(text), not an http(s) URL"))
                }
            }
            if let version = values[Key.appStoreConnectSalesVersion] {
                if version.range(of: #"^[0-9]+_[0-9]+$"#, options: .regularExpression) != nil { settings.salesVersion = version } else {
                    problems.append(.init(Key.appStoreConnectSalesVersion, "is \(version); use Apple's form, such as 1_0"))
                }
            }
            return (settings, problems)
        }
    }

    /// The sweeps where Apple's sales reports counted more purchases than the ledger saw.
    public func salesShortfallSweep(
        _ services: ServiceAssembly, api: LazyAppStoreServerAPI, verifier: AppleProofVerifier, logger: Logger
    ) -> SalesShortfallSweep {
        SalesShortfallSweep(
            sweep: historySweep(services, api: api, verifier: verifier), store: AppleSalesStore(database: services.database), logger: logger)
    }

    /// The sales-report fetch of these settings on `services`' database, or nil without an App Store Connect key.
    public func salesReportFetch(_ services: ServiceAssembly, logger: Logger) async throws -> SalesReportFetch? {
        guard let appStoreConnect else { return nil }
        return SalesReportFetch(api: try await appStoreConnect.client(logger: logger), store: AppleSalesStore(database: services.database), logger: logger)
    }
}
