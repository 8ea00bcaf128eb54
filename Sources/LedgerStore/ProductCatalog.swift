import Foundation
import LedgerCore
import Logging
import PostgresNIO

/// The product catalog (`products`): which product ids are sold, which are retired, at what price.
public struct ProductCatalog: Sendable {
    public let database: Database
    /// The typings read outside a transaction, kept a while (nil: each is read).
    let typings: TypingCopy?

    /// `keepingTypesFor`: how long a product's type read outside a transaction is used again
    /// (`typing(of:bundleId:)`; nil: not kept). What this catalog sets is read again at once.
    public init(database: Database, keepingTypesFor age: Duration? = nil) {
        self.database = database
        self.typings = age.map(TypingCopy.init)
    }

    public enum Status: String, Codable, Sendable, CaseIterable {
        case active, retired
    }

    public struct Product: Sendable, Equatable {
        public var productId: ProductID
        public var status: Status
        public var price: String?
        public var currency: String?
        /// Consumption answers: whether the app offers a free sample or trial of it (absent: not sent).
        public var sampleContentProvided: Bool?
        /// Consumption answers: the refund the operator would like Apple to grant (absent: not sent).
        public var refundPreference: RefundPreference?
        public var updatedAt: Date
        /// The app that sells it (product ids are per app); nil only in a ledger that holds no app.
        public var bundleId: BundleID? = nil
        /// What kind of product it is (nil: the catalog is silent, and Apple's signed `type` decides).
        public var type: ProductType? = nil
        /// An auto-renewable subscription's group (Apple's `subscriptionGroupIdentifier`).
        public var subscriptionGroup: String? = nil
    }

    /// Refuses an entry's values before anything is stored, naming the field (`fields` maps the
    /// catalog's names to the caller's, such as a command's options).
    public static func check(
        price: String?, currency: String?, type: ProductType?, subscriptionGroup: String?, fields: [String: String] = [:]
    ) throws(LedgerInputError) {
        func field(_ name: String) -> String { fields[name] ?? name }
        if let price, !OrderEvent.isValidPrice(price) {
            throw LedgerInputError(field: field("price"), problem: "must be a decimal string such as \"0.99\"")
        }
        if let currency, !OrderEvent.isValidCurrency(currency) {
            throw LedgerInputError(field: field("currency"), problem: "must be an ISO 4217 code such as \"USD\"")
        }
        if let subscriptionGroup {
            // A renewal is checked against its subscription's group; no other type is sold in one.
            guard type == .autoRenewable else {
                throw LedgerInputError(field: field("subscriptionGroup"), problem: "is only for an auto-renewable product (type auto-renewable)")
            }
            _ = try Identifier.validate(subscriptionGroup, field: field("subscriptionGroup"))
        }
    }

    /// Creates or replaces a product's entry in app `bundleId` (nil: the ledger's first app, or
    /// none while it holds no app). Only an auto-renewable product has a `subscriptionGroup`.
    @discardableResult
    public func set(
        _ id: ProductID, status: Status, price: String?, currency: String?, sampleContentProvided: Bool? = nil,
        refundPreference: RefundPreference? = nil, bundleId: BundleID? = nil, type: ProductType? = nil, subscriptionGroup: String? = nil
    ) async throws -> Product {
        try Self.check(price: price, currency: currency, type: type, subscriptionGroup: subscriptionGroup)
        // Whatever the answer, this catalog's copy of the types is read again.
        defer { typings?.forget() }
        let rows = try await database.query(
            """
            INSERT INTO products (product_id, status, price, currency, sample_content_provided, refund_preference, updated_at, bundle_id,
                                  type, subscription_group)
            VALUES (\(id.rawValue), \(status.rawValue), \(price)::numeric, \(currency), \(sampleContentProvided), \(refundPreference?.rawValue), now(),
                    coalesce(\(bundleId?.rawValue)::text, (SELECT f.bundle_id FROM ledger_first_app f)), \(type?.rawValue), \(subscriptionGroup))
            ON CONFLICT ((coalesce(bundle_id, '')), product_id) DO UPDATE SET status = EXCLUDED.status, price = EXCLUDED.price,
                currency = EXCLUDED.currency, sample_content_provided = EXCLUDED.sample_content_provided,
                refund_preference = EXCLUDED.refund_preference, updated_at = EXCLUDED.updated_at, type = EXCLUDED.type,
                subscription_group = EXCLUDED.subscription_group
            RETURNING \(unescaped: Self.columns)
            """)
        guard let product = try await Self.decode(rows).first else { throw OrderDecisionError.noSuchOrder }
        return product
    }

    /// Every product; with `apps` (an API key's), those of these apps alone.
    public func list(apps: [BundleID]? = nil) async throws -> [Product] {
        let apps = apps?.map(\.rawValue)
        let rows = try await database.query(
            """
            SELECT \(unescaped: Self.columns) FROM products
             WHERE \(apps)::text[] IS NULL OR bundle_id = ANY(\(apps)::text[]) ORDER BY bundle_id, product_id
            """)
        return try await Self.decode(rows)
    }

    /// A product of one app (product ids are per app).
    public struct AppProduct: Hashable, Sendable {
        public let bundleId: BundleID?
        public let productId: ProductID
        public init(_ bundleId: BundleID?, _ productId: ProductID) {
            self.bundleId = bundleId
            self.productId = productId
        }
    }

    /// The active products and their prices (price, currency): what the reconciler may create a
    /// recovery order for. None of a retired app: it takes no new order.
    public func activePrices() async throws -> [AppProduct: (price: String?, currency: String?)] {
        let rows = try await database.query(
            """
            SELECT p.bundle_id, p.product_id, p.price::text, p.currency FROM products p
             WHERE p.status = 'active' AND NOT EXISTS (SELECT FROM apps a WHERE a.bundle_id = p.bundle_id AND a.retired)
            """)
        var products: [AppProduct: (price: String?, currency: String?)] = [:]
        for try await (bundle, id, price, currency) in rows.decode((String?, String, String?, String?).self) {
            products[AppProduct(bundle.map(BundleID.init(unchecked:)), ProductID(unchecked: id))] = (price, currency)
        }
        return products
    }

    static let columns = """
        product_id, status, price::text, currency, sample_content_provided, refund_preference, updated_at, bundle_id, type, subscription_group
        """

    static func decode(_ rows: some AsyncSequence<PostgresRow, any Error>) async throws -> [Product] {
        var products: [Product] = []
        for try await (id, status, price, currency, sample, preference, updated, bundle, type, group)
            in rows.decode((String, String, String?, String?, Bool?, String?, Date, String?, String?, String?).self) {
            products.append(Product(productId: ProductID(unchecked: id), status: Status(rawValue: status) ?? .active,
                                    price: price, currency: currency, sampleContentProvided: sample,
                                    refundPreference: preference.flatMap(RefundPreference.init), updatedAt: updated,
                                    bundleId: bundle.map(BundleID.init(unchecked:)), type: type.flatMap(ProductType.init(rawValue:)),
                                    subscriptionGroup: group))
        }
        return products
    }
}
