import Hummingbird
import LedgerCore
import LedgerStore
import PostgresNIO

extension APIError {
    /// SQLSTATEs that mean a value sent by the caller cannot be stored: \u0000 in JSON, malformed
    /// text for a type, too long, out of range, a check constraint, an index row too large.
    static let clientDataStates: [PostgresError.Code] = [
        .untranslatableCharacter, .invalidTextRepresentation, .stringDataRightTruncationException, .numericValueOutOfRange,
        .datetimeFieldOverflow, .checkViolation, .programLimitExceeded,
    ]

    /// The API's answer for a domain error, or nil for errors that are not the caller's doing.
    static func from(_ error: any Error) -> APIError? {
        switch error {
        case let error as LedgerInputError:
            return APIError(.badRequest, code: error.code, message: error.description, details: ["field": .string(error.field)])
        case let error as OrderDecisionError:
            switch error {
            case .transitionNotAllowed(let state, let type, let allowed):
                return APIError(.conflict, code: error.code, message: error.description, details: [
                    "state": .string(state.rawValue), "type": .string(type.rawValue), "allowed": .strings(allowed.map(\.rawValue)),
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
        case let error as OrderLedgerError:
            return APIError(.conflict, code: error.code, message: error.description)
        case let error as SupportMatchError:
            let status: HTTPResponse.Status = switch error {
            case .transactionNotFound: .notFound
            case .reasonRequired: .badRequest
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
        case let error as PSQLError:
            // A value the checks above let through but PostgreSQL refuses: still the caller's input.
            guard let state = error.sqlState, clientDataStates.contains(state) else { return nil }
            return APIError(.badRequest, code: "invalid-input", message: "the database refused a value: \(error.serverInfo?[.message] ?? state.raw)")
        default:
            return nil
        }
    }
}
