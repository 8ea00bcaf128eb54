import Hummingbird
import LedgerCore
import LedgerStore
import PostgresNIO

extension APIError {
    /// SQLSTATEs that mean a value sent by the caller cannot be stored: \u0000 in JSON (22P05),
    /// malformed text for a type (22P02), too long (22001), out of range (22003, 22008), a check
    /// constraint (23514), an index row too large (54000).
    static let clientDataStates: Set<String> = ["22P05", "22P02", "22001", "22003", "22008", "23514", "54000"]

    /// The API's answer for a domain error, or nil for errors that are not the caller's doing.
    static func from(_ error: any Error) -> APIError? {
        switch error {
        case let error as LedgerInputError:
            return APIError(.badRequest, code: error.code, message: error.description, details: ["field": error.field])
        case let error as OrderDecisionError:
            switch error {
            case .transitionNotAllowed(let state, let type, let allowed):
                return APIError(.conflict, code: error.code, message: error.description, details: [
                    "state": state.rawValue, "type": type.rawValue, "allowed": allowed.map(\.rawValue),
                ])
            case .orderExists:
                return APIError(.conflict, code: error.code, message: error.description)
            case .noSuchOrder:
                return APIError(.notFound, code: error.code, message: error.description)
            }
        case let error as AppendError:
            switch error {
            case .wrongExpectedVersion(_, _, let current):
                return APIError(.conflict, code: error.code, message: error.description, details: ["currentVersion": current])
            case .eventIDConflict(let id):
                return APIError(.conflict, code: error.code, message: error.description, details: ["eventId": id.description])
            case .invalidBatch:
                return APIError(.badRequest, code: error.code, message: error.description)
            }
        case let error as OrderLedgerError:
            return APIError(.conflict, code: error.code, message: error.description)
        case let error as SupportMatchError:
            let status: HTTPResponse.Status = switch error {
            case .transactionNotFound: .notFound
            case .reasonRequired: .badRequest
            default: .conflict
            }
            return APIError(status, code: error.code, message: error.description)
        case let error as PSQLError:
            // A value the checks above let through but PostgreSQL refuses: still the caller's input.
            guard let state = error.serverInfo?[.sqlState], clientDataStates.contains(state) else { return nil }
            return APIError(.badRequest, code: "invalid-input", message: "the database refused a value: \(error.serverInfo?[.message] ?? state)")
        default:
            return nil
        }
    }
}
