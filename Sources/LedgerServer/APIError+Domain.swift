import Hummingbird
import LedgerCore
import LedgerServices
import LedgerStore

extension APIError {
    /// The API's answer for a domain error, or nil for errors that are not the caller's doing.
    static func from(_ error: any Error) -> APIError? {
        switch error {
        case let error as LedgerInputError:
            return APIError(.badRequest, code: error.code, message: error.description, details: ["field": .string(error.field)])
        case let error as OrderDecisionError:
            switch error {
            case .transitionNotAllowed(let state, let type, let allowed):
                // A client's event is told the types a client may send; the ledger's own
                // (`pairing-undone`) are not among them.
                let told = type.isWrittenByClients ? allowed.filter(\.isWrittenByClients) : allowed
                return APIError(.conflict, code: error.code,
                                message: OrderDecisionError.transitionNotAllowed(state: state, type: type, allowed: told).description, details: [
                    "state": .string(state.rawValue), "type": .string(type.rawValue), "allowed": .strings(told.map(\.rawValue)),
                ])
            case .orderExists:
                return APIError(.conflict, code: error.code, message: error.description)
            case .noSuchOrder:
                return APIError(.notFound, code: error.code, message: error.description)
            }
        case let error as AppendError:
            switch error {
            case .wrongExpectedVersion(_, _, let current):
                return APIError(.conflict, code: error.code, message: error.description, details: ["currentVersion": .integer(current)])
            case .eventIDConflict(let id):
                return APIError(.conflict, code: error.code, message: error.description, details: ["eventId": .string(id.description)])
            case .invalidBatch:
                return APIError(.badRequest, code: error.code, message: error.description)
            }
        case let error as AppCatalogError:
            let status: HTTPResponse.Status = switch error {
            case .appExists, .skuTaken: .conflict
            case .unknownApp: .notFound
            }
            return APIError(status, code: error.code, message: error.description)
        case let error as OrderLedgerError:
            if case .environmentRefused = error {
                // As a notification of that environment is answered, naming what the request said.
                return APIError(.badRequest, code: error.code, message: error.description, details: ["field": .string("data.environment")])
            }
            if case .verifiedOtherTransaction = error {
                return APIError(.conflict, code: error.code, message: error.description, details: ["field": .string("data.transactionId")])
            }
            let status: HTTPResponse.Status = switch error {
            case .bundleIDRequired, .unknownApp: .badRequest
            default: .conflict
            }
            return APIError(status, code: error.code, message: error.description)
        case let error as SupportMatchError:
            let status: HTTPResponse.Status = switch error {
            case .transactionNotFound: .notFound
            case .reasonRequired, .reasonTooLong, .conflictReasonRequired: .badRequest
            default: .conflict
            }
            return APIError(status, code: error.code, message: error.description)
        case let error as SupportUnmatchError:
            let status: HTTPResponse.Status = switch error {
            case .transactionNotFound: .notFound
            case .reasonRequired, .reasonTooLong: .badRequest
            default: .conflict
            }
            return APIError(status, code: error.code, message: error.description)
        default:
            // A value the checks above let through but PostgreSQL refuses: still the caller's input.
            guard let refused = refusedValueMessage(error) else { return nil }
            return APIError(.badRequest, code: "invalid-input", message: "the database refused a value: \(refused)")
        }
    }
}
