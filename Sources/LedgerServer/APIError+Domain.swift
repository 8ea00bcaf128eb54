import Hummingbird
import LedgerCore
import LedgerStore

extension APIError {
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
        default:
            return nil
        }
    }
}
