import Foundation
import X509

/// The trusted roots (`LEDGER_APPLE_ROOT_CERTS`): PEM or DER files the operator downloads from
/// Apple (Apple Root CA - G3), or a test's own root.
public enum AppleRootCertificates {
    /// Reads every certificate of each file; a file that is missing, unreadable or holds no
    /// certificate is an error naming it.
    public static func load(paths: [String]) throws -> [Certificate] {
        var roots: [Certificate] = []
        for path in paths {
            guard let data = FileManager.default.contents(atPath: path) else {
                throw AppleVerificationError(code: "root-certificate-unreadable", message: "\(path) is missing or unreadable")
            }
            do {
                roots += try parse(data)
            } catch {
                throw AppleVerificationError(code: "root-certificate-unreadable", message: "\(path) holds no PEM or DER certificate (\(error))")
            }
        }
        return roots
    }

    /// The certificates of one file's contents, PEM (one or more) or DER.
    public static func parse(_ data: Data) throws -> [Certificate] {
        if let text = String(data: data, encoding: .utf8), text.contains("-----BEGIN CERTIFICATE-----") {
            // Each block from its BEGIN line to the next END line (text around the blocks is ignored).
            let blocks = text.components(separatedBy: "-----END CERTIFICATE-----").dropLast()
            return try blocks.map { block in
                guard let begin = block.range(of: "-----BEGIN CERTIFICATE-----") else { throw AppleVerificationError.chain("a PEM block has no BEGIN line") }
                let body = block[begin.lowerBound...].trimmingCharacters(in: .whitespacesAndNewlines)
                return try Certificate(pemEncoded: body + "\n-----END CERTIFICATE-----")
            }
        }
        return [try Certificate(derEncoded: Array(data))]
    }
}
