import Foundation
import Hummingbird
import LedgerCore

/// A request's JSON object, read with a size limit, with typed accessors that name the field
/// that is missing or wrong.
struct JSONBody {
    /// The largest body the API reads.
    static let maximumBytes = 256 * 1024

    let object: [String: Any]
    /// The body as it came.
    let text: Data

    static func read(_ request: Request, context: LedgerRequestContext) async throws -> JSONBody {
        let buffer: ByteBuffer
        do {
            buffer = try await request.body.collect(upTo: maximumBytes)
        } catch {
            throw APIError(.contentTooLarge, code: "body-too-large", message: "the body is larger than \(maximumBytes / 1024) KiB")
        }
        guard buffer.readableBytes > 0 else {
            throw APIError(.badRequest, code: "invalid-json", message: "the body is empty; send a JSON object")
        }
        let text = Data(buffer: buffer)
        let parsed = try? JSONSerialization.jsonObject(with: text, options: [.fragmentsAllowed])
        guard let parsed else {
            throw APIError(.badRequest, code: "invalid-json", message: "the body is not valid JSON")
        }
        guard let object = parsed as? [String: Any] else {
            throw APIError(.badRequest, code: "invalid-json", message: "the body must be a JSON object")
        }
        return JSONBody(object: object, text: text)
    }

    func string(_ field: String) throws(LedgerInputError) -> String? {
        guard let value = object[field], !(value is NSNull) else { return nil }
        guard let text = value as? String else { throw LedgerInputError(field: field, problem: "must be a string") }
        return text
    }

    func requiredString(_ field: String) throws(LedgerInputError) -> String {
        guard let text = try string(field) else { throw LedgerInputError(field: field, problem: "is missing") }
        return text
    }

    func integer(_ field: String) throws(LedgerInputError) -> Int64? {
        guard let value = object[field], !(value is NSNull) else { return nil }
        guard let number = value as? NSNumber, !Self.isBoolean(number), number.doubleValue == number.doubleValue.rounded(),
              let integer = Int64(exactly: number.doubleValue) else {
            throw LedgerInputError(field: field, problem: "must be an integer")
        }
        return integer
    }

    /// A nested JSON object, as JSON text: as the body wrote it when it can be cut out for sure,
    /// else written again from the parsed value.
    func objectData(_ field: String) throws(LedgerInputError) -> Data {
        guard let value = object[field], !(value is NSNull) else { throw LedgerInputError(field: field, problem: "is missing") }
        guard value is [String: Any] else { throw LedgerInputError(field: field, problem: "must be a JSON object") }
        if let data = StoredJSON.objectMember(field, of: text) { return data }
        guard let data = try? JSONSerialization.data(withJSONObject: value) else {
            throw LedgerInputError(field: field, problem: "must be a JSON object")
        }
        return data
    }

    /// JSON's true and false arrive as NSNumber too; their type name tells them apart.
    static func isBoolean(_ number: NSNumber) -> Bool {
        String(describing: type(of: number)).contains("Boolean")
    }
}
