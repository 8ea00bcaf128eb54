import Foundation
import Hummingbird
import LedgerServer
import LedgerStore
import LedgerTestSupport
import Logging
import PostgresNIO
import Testing

@Suite("docs/openapi.yaml")
struct OpenAPITests {
    /// "METHOD /path" for every operation under `paths:` (two-space path keys, four-space methods).
    func documentedRoutes() throws -> Set<String> {
        let text = try String(contentsOf: TestServer.packageRoot.appendingPathComponent("docs/openapi.yaml"), encoding: .utf8)
        var routes = Set<String>()
        var inPaths = false
        var path: String?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line == "paths:" { inPaths = true; continue }
            if inPaths, !line.isEmpty, !line.hasPrefix(" ") { break }
            if line.hasPrefix("  /"), line.hasSuffix(":"), !line.hasPrefix("   ") {
                path = String(line.dropFirst(2).dropLast())
            } else if let path, line.hasPrefix("    "), !line.hasPrefix("     "), line.hasSuffix(":") {
                let method = line.trimmingCharacters(in: .whitespaces).dropLast()
                if ["get", "post", "put", "patch", "delete", "head"].contains(String(method)) {
                    routes.insert("\(method.uppercased()) \(path)")
                }
            }
        }
        return routes
    }

    @Test("every route the router serves is documented, and nothing else is")
    func routesMatchTheSpec() throws {
        let client = PostgresClient(configuration: .init(unixSocketPath: "/nonexistent", username: "x", password: nil, database: "x"),
                                    backgroundLogger: TestServer.clientLogger)
        let router = buildRouter(database: Database(client: client, logger: TestServer.logger), migrator: Migrator(logger: TestServer.logger),
                                 apple: try LedgerConfiguration().apple.verifier(logger: TestServer.logger))
        let served = Set(router.routes.map { "\($0.method) \($0.path)" })
        let documented = try documentedRoutes()
        #expect(served.count >= 9)
        #expect(served.subtracting(documented).isEmpty, "served but not documented: \(served.subtracting(documented).sorted())")
        #expect(documented.subtracting(served).isEmpty, "documented but not served: \(documented.subtracting(served).sorted())")
    }
}
