import Foundation
import LedgerCore
import LedgerServices
import Testing

@Suite("An app's private key, stored or read where its reference points")
struct AppPrivateKeyTests {
    @Test("a stored key is its text; env:NAME and file:PATH are read at use; what points at nothing is named, with no key in the message")
    func reads() throws {
        let pem = "-----BEGIN PRIVATE KEY-----\nQUJD\n-----END PRIVATE KEY-----"
        #expect(try AppPrivateKey.stored(pem: pem).pem() == pem)
        let variable = try SecretReference("env:GAME_IAP_KEY", field: "ref")
        #expect(try AppPrivateKey.reference(variable).pem(environment: ["GAME_IAP_KEY": pem]) == pem)
        #expect(throws: AppPrivateKeyUnavailable(reference: variable, reason: "the variable is unset")) {
            try AppPrivateKey.reference(variable).pem(environment: [:])
        }
        let file = NSTemporaryDirectory() + "app-key-\(UUID()).p8"
        try pem.write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let onDisk = try SecretReference("file:\(file)", field: "ref")
        #expect(try AppPrivateKey.reference(onDisk).pem() == pem)
        try FileManager.default.removeItem(atPath: file)
        do {
            _ = try AppPrivateKey.reference(onDisk).pem()
            Issue.record("a missing file was read")
        } catch {
            #expect(error.code == "app-key-unavailable" && error.description.contains(file))
        }
        for bad in ["vault:x", "env:", "env:1X", "env:A-B", "file:", "GAME_IAP_KEY"] {
            #expect(throws: LedgerInputError.self, "\(bad)") { try SecretReference(bad, field: "ref") }
        }
        #expect(!"\(AppPrivateKey.stored(pem: pem))".contains("QUJD"))
    }
}
