/// What each status of Apple's verifyReceipt means for a proof: valid, send it to the other
/// environment, try again later (the proof is not at fault), or rejected for good.
public enum VerifyReceiptStatus: Equatable, Sendable {
    case valid
    /// 21007: a sandbox receipt sent to production: ask the sandbox.
    case useSandbox
    /// 21008: a production receipt sent to the sandbox: ask production.
    case useProduction
    case retryLater(code: String, message: String)
    case rejected(code: String, message: String)

    /// The meaning of one status (docs/apple.md has the same table).
    public static func meaning(of status: Int) -> VerifyReceiptStatus {
        switch status {
        case 0: .valid
        // The receipt is valid; only an auto-renewable subscription in it has expired.
        case 21006: .valid
        case 21007: .useSandbox
        case 21008: .useProduction
        case 21000: .retryLater(code: "apple-request-invalid", message: "verifyReceipt refused the ledger's request (21000): check the ledger's verifyReceipt URL")
        case 21001: .retryLater(code: "apple-status-21001", message: "verifyReceipt answered 21001 (no longer sent by Apple)")
        case 21002: .retryLater(code: "apple-receipt-data-malformed", message: "verifyReceipt could not read the receipt data or had a temporary issue (21002)")
        case 21003: .rejected(code: "receipt-not-authenticated", message: "Apple could not authenticate the receipt (21003)")
        case 21004: .retryLater(code: "apple-shared-secret-mismatch", message: "the shared secret does not match the account's (21004): check the app's (`ledger apps set --shared-secret-file`, or LEDGER_APPLE_SHARED_SECRET for the configured app)")
        case 21005: .retryLater(code: "apple-unavailable", message: "Apple's receipt server is unavailable (21005)")
        case 21009: .retryLater(code: "apple-internal-error", message: "Apple had an internal data access error (21009)")
        case 21010: .rejected(code: "apple-account-not-found", message: "the user account cannot be found or was deleted (21010)")
        case 21100...21199: .retryLater(code: "apple-internal-error", message: "Apple had an internal data access error (\(status))")
        default: .retryLater(code: "apple-status-unknown", message: "verifyReceipt answered an unknown status \(status)")
        }
    }
}
