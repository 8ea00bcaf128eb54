import Foundation

/// What kind of product a product id is, as the catalog says or, where it is silent, as Apple's
/// signed transaction says (`type`).
public enum ProductType: String, Codable, Sendable, CaseIterable {
    case consumable
    case nonConsumable = "non-consumable"
    /// Renews every period until the customer stops it; sold within a subscription group.
    case autoRenewable = "auto-renewable"
    case nonRenewing = "non-renewing"

    /// The type Apple's `type` field names (`Consumable`, `Non-Consumable`,
    /// `Auto-Renewable Subscription`, `Non-Renewing Subscription`); nil for any other text.
    public init?(appleType: String) {
        switch appleType {
        case "Consumable": self = .consumable
        case "Non-Consumable": self = .nonConsumable
        case "Auto-Renewable Subscription": self = .autoRenewable
        case "Non-Renewing Subscription": self = .nonRenewing
        default: return nil
        }
    }
}
