import Foundation
import Hummingbird
import LedgerCore
import LedgerJSON
import LedgerServices

/// `POST /v1/imports` (admin scope, every app's key): a small batch of a team's history, as
/// `ledger import` takes a file (docs/import.md). The body is the file's text: CSV with a header
/// (`Content-Type: text/csv`) or JSON Lines (`application/x-ndjson` or `application/jsonl`);
/// `source` names it in each event's metadata. The answer is the import's summary, each refused
/// line with its number and reason.
struct ImportsController {
    let history: HistoryImport
    /// The most lines one request takes: a larger history is `ledger import`'s.
    static let maximumLines = 10_000

    func addRoutes(to router: Router<LedgerRequestContext>) {
        router.post("/v1/imports") { request, context in
            let type = request.headers[.contentType]?.split(separator: ";").first?.trimmingCharacters(in: .whitespaces).lowercased() ?? ""
            let format: HistoryFile.Format
            switch type {
            case "text/csv": format = .csv
            case "application/x-ndjson", "application/jsonl", "application/jsonlines": format = .jsonLines
            default:
                throw APIError(.unsupportedMediaType, code: "unsupported-media-type",
                               message: "send the history as text/csv (with a header) or application/x-ndjson (JSON Lines), not \(type.isEmpty ? "no Content-Type" : type)")
            }
            let buffer = try await LedgerRequestDecoder.body(
                of: request, context: context,
                empty: APIError(.badRequest, code: "invalid-input", message: "the body is empty; send the history's lines (CSV with its header, or JSON Lines)",
                                details: ["field": .string("body")]))
            let file = try HistoryFile(Data(buffer: buffer), format: format)
            let lines = Array(file.lines)
            guard lines.count <= Self.maximumLines else {
                throw APIError(.contentTooLarge, code: "too-many-lines",
                               message: "the body has \(lines.count) lines; a request takes at most \(Self.maximumLines): import larger histories with ledger import")
            }
            let source = try Identifier.validate(request.uri.queryParameters.get("source") ?? "POST /v1/imports", field: "source", maximumLength: 256)
            return Answer(try await history.run(lines, source: source))
        }
    }
}
