import Foundation

/// One line of a team's history to import (docs/import.md): an order with its final state and
/// the Apple transaction it was granted, or, with no `orderId`, a granted transaction alone whose
/// order is gone. Its fields are named as the API names them.
public struct HistoryRecord: Sendable, Equatable {
    /// The final states an imported order may have.
    public enum State: String, Sendable, CaseIterable {
        case created, paymentAdded = "payment-added", verified, delivered, finished, failed, refunded

        /// Whether an order in this state was granted its transaction.
        public var isGranted: Bool { [.verified, .delivered, .finished, .refunded].contains(self) }
    }

    /// The columns (CSV) or members (JSON Lines) a line may have.
    public static let columns = [
        "orderId", "userId", "productId", "bundleId", "createdAt", "state", "price", "currency",
        "transactionId", "originalTransactionId", "purchaseDate", "environment", "refundedAt",
        "storefront",
    ]

    /// The date a granted transaction alone is given when its line says none (docs/import.md).
    public static let unknownDate = Date(timeIntervalSince1970: 0)
    /// The user and product of a granted transaction alone whose line names none.
    public static let unknownUser = "imported"
    public static let unknownProduct = "imported"

    /// The line of the file it came from (a CSV record's first line).
    public var line: Int
    /// Nil for a granted transaction alone.
    public var orderId: OrderID?
    public var userId: UserID?
    public var productId: ProductID?
    public var bundleId: BundleID?
    public var createdAt: Date
    public var state: State
    public var price: String?
    public var currency: String?
    public var transactionId: TransactionID?
    public var originalTransactionId: String?
    public var purchaseDate: Date?
    /// The environment the line names, in Apple's spelling; nil when it names none (the line then
    /// claims nothing against what Apple signed).
    public var givenEnvironment: String?
    /// The environment the line counts under, as Apple names it: the one it names, else `Production`.
    public var environment: String { givenEnvironment ?? "Production" }
    public var refundedAt: Date?
    /// The storefront's country as Apple names it in a transaction, ISO 3166-1 alpha-3 (`USA`).
    public var storefront: String?

    /// Reads a line's fields (absent and empty are the same); the first problem is thrown, naming the column.
    public init(_ fields: [String: String], line: Int) throws(LedgerInputError) {
        self.line = line
        for name in fields.keys where !Self.columns.contains(name) {
            throw LedgerInputError(field: name, problem: "is not a column of an import; use \(Self.columns.joined(separator: ", "))")
        }
        func text(_ name: String) -> String? {
            guard let value = fields[name], !value.isEmpty else { return nil }
            return value
        }
        func date(_ name: String) throws(LedgerInputError) -> Date? {
            guard let value = text(name) else { return nil }
            guard let date = Self.date(value) else {
                throw LedgerInputError(field: name, problem: "is \(value.debugDescription), not an ISO 8601 time such as 2024-05-01T12:00:00Z")
            }
            guard CalendarTime.isCalendarTime(value) else {
                throw LedgerInputError(field: name, problem: "is \(value.debugDescription), not a day and time a calendar has")
            }
            // The ledger reads no time before 1970 or after 9999 back (its JSON times): refused
            // here, not lost later.
            guard date.timeIntervalSince1970 >= 0 else {
                throw LedgerInputError(field: name, problem: "is \(value.debugDescription), before 1970")
            }
            guard date < CalendarTime.end else {
                throw LedgerInputError(field: name, problem: "is \(value.debugDescription), after 9999")
            }
            return date
        }
        func required<T>(_ name: String, _ value: T?, _ why: String) throws(LedgerInputError) -> T {
            guard let value else { throw LedgerInputError(field: name, problem: "is missing: \(why)") }
            return value
        }

        // Padded ids are refused as `POST /v1/orders` refuses them: `" u-1"` is no user's.
        orderId = try text("orderId").map { v throws(LedgerInputError) in try OrderID(given: v) }
        userId = try text("userId").map { v throws(LedgerInputError) in try UserID(given: v) }
        productId = try text("productId").map { v throws(LedgerInputError) in try ProductID(given: v) }
        bundleId = try text("bundleId").map { v throws(LedgerInputError) in try BundleID(v) }
        transactionId = try text("transactionId").map { v throws(LedgerInputError) in
            try TransactionID.checkSpelling(v, field: "transactionId")
            return try TransactionID(v)
        }
        originalTransactionId = try text("originalTransactionId").map { v throws(LedgerInputError) in
            try TransactionID.checkSpelling(v, field: "originalTransactionId")
            return try Identifier.validate(v, field: "originalTransactionId")
        }
        price = text("price")
        currency = text("currency")
        if let price, !OrderEvent.isValidPrice(price) {
            throw LedgerInputError(field: "price", problem: "is \(price.debugDescription); use a decimal string such as 0.99")
        }
        if let currency, !OrderEvent.isValidCurrency(currency) {
            throw LedgerInputError(field: "currency", problem: "is \(currency.debugDescription); use an ISO 4217 code such as USD")
        }
        purchaseDate = try date("purchaseDate")
        refundedAt = try date("refundedAt")
        givenEnvironment = try text("environment").map { given throws(LedgerInputError) in
            guard let named = OrderEvent.environmentName(given) else {
                throw LedgerInputError(field: "environment", problem: "is \(given.debugDescription); use Production or Sandbox")
            }
            return named
        }
        if let given = text("storefront") {
            let letters = given.uppercased()
            guard letters.utf8.count == 3, letters.utf8.allSatisfy({ (65...90).contains($0) }) else {
                throw LedgerInputError(field: "storefront", problem: "is \(given.debugDescription); use an ISO 3166-1 alpha-3 code such as USA")
            }
            storefront = letters
        }
        let stateName = text("state")
        var state: State?
        if let stateName {
            state = State(rawValue: stateName.lowercased())
            guard state != nil else {
                throw LedgerInputError(field: "state", problem: "is \(stateName.debugDescription); use \(State.allCases.map(\.rawValue).joined(separator: ", "))")
            }
        }

        if orderId != nil {
            _ = try required("userId", userId, "an order names its user")
            _ = try required("productId", productId, "an order names its product")
            createdAt = try required("createdAt", try date("createdAt"), "an order says when it was created")
            self.state = try required("state", state, "an order says its final state")
        } else {
            // A granted transaction alone: its order is gone.
            _ = try required("transactionId", transactionId, "a line without orderId lists a granted transaction")
            guard state == nil || state == .finished || state == .delivered else {
                throw LedgerInputError(field: "state", problem: "is \(stateName ?? ""); a line without orderId lists a granted transaction (leave state out)")
            }
            self.state = refundedAt == nil ? .finished : .refunded
            createdAt = try date("createdAt") ?? purchaseDate ?? Self.unknownDate
            purchaseDate = purchaseDate ?? createdAt
        }
        if self.state.isGranted {
            _ = try required("transactionId", transactionId, "a \(self.state.rawValue) order was granted an Apple transaction")
            _ = try required("purchaseDate", purchaseDate, "a granted transaction says when it was bought")
        } else if transactionId != nil {
            throw LedgerInputError(field: "transactionId", problem: "is given for a \(self.state.rawValue) order; an order was granted a transaction only when verified, delivered, finished or refunded")
        }
        if self.state == .refunded {
            _ = try required("refundedAt", refundedAt, "a refunded order says when")
        } else if refundedAt != nil {
            throw LedgerInputError(field: "refundedAt", problem: "is given for a \(self.state.rawValue) order; its state is then refunded")
        }
        // Times that cannot have been (a mistyped year, a column shifted): the reports would date
        // sales and refunds by them.
        let latest = Date().addingTimeInterval(86_400)
        for (field, time) in [("createdAt", createdAt), ("purchaseDate", purchaseDate), ("refundedAt", refundedAt)] {
            if let time, time > latest { throw LedgerInputError(field: field, problem: "is in the future") }
        }
        if let purchaseDate, purchaseDate != Self.unknownDate, purchaseDate < Self.appStoreOpened {
            throw LedgerInputError(field: "purchaseDate", problem: "is before the App Store opened (2008-07-10)")
        }
        if let purchaseDate, let refundedAt, refundedAt < purchaseDate {
            throw LedgerInputError(field: "refundedAt", problem: "is before purchaseDate: a purchase is refunded after it was bought")
        }
    }

    /// The App Store's first day (2008-07-10, UTC): no purchase of it is older.
    public static let appStoreOpened = Date(timeIntervalSince1970: 1_215_648_000)

    /// An ISO 8601 time, with or without fractional seconds.
    static func date(_ text: String) -> Date? {
        if let date = try? Date(text, strategy: Self.whole) { return date }
        return try? Date(text, strategy: Self.fractional)
    }

    private static let whole = Date.ISO8601FormatStyle()
    private static let fractional = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
}
