import Foundation
import Hummingbird
@testable import LedgerServer
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

    /// The query parameters of every operation that has any, by "METHOD /path", as the spec
    /// lists them (inline, `- name:` then `in: query`, or a `$ref` to `components/parameters`).
    func documentedQueries() throws -> [String: Set<String>] {
        let text = try String(contentsOf: TestServer.packageRoot.appendingPathComponent("docs/openapi.yaml"), encoding: .utf8)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        func queryName(_ lines: ArraySlice<String>) -> String? {
            guard let first = lines.first else { return nil }
            if let match = first.firstMatch(of: /name: (\w+), in: query/) { return String(match.1) }
            if let match = first.firstMatch(of: /- name: (\w+)$/), lines.dropFirst().first?.trimmingCharacters(in: .whitespaces) == "in: query" {
                return String(match.1)
            }
            return nil
        }
        // components/parameters: a four-space key, then its name and `in`.
        var shared = [String: String]()
        if let start = lines.firstIndex(of: "  parameters:") {
            var key: String?
            for index in lines.indices.dropFirst(start + 1) {
                let line = lines[index]
                if !line.hasPrefix("    ") { break }
                if !line.hasPrefix("     ") { key = String(line.dropFirst(4).dropLast()); continue }
                if let key, let match = line.firstMatch(of: /^      name: (\w+)$/), lines[index + 1] == "      in: query" {
                    shared[key] = String(match.1)
                }
            }
        }
        var queries = [String: Set<String>]()
        var (path, operation): (String?, String?) = (nil, nil)
        for index in lines.indices {
            let line = lines[index]
            if line == "components:" { break }
            if line.hasPrefix("  /"), !line.hasPrefix("   ") {
                (path, operation) = (String(line.dropFirst(2).dropLast()), nil)
            } else if let path, line.hasPrefix("    "), !line.hasPrefix("     "), line.hasSuffix(":") {
                operation = "\(line.trimmingCharacters(in: .whitespaces).dropLast().uppercased()) \(path)"
            } else if let operation {
                if let name = queryName(lines[index...]) {
                    queries[operation, default: []].insert(name)
                } else if let match = line.firstMatch(of: /\$ref: "#\/components\/parameters\/(\w+)"/), let name = shared[String(match.1)] {
                    queries[operation, default: []].insert(name)
                }
            }
        }
        return queries
    }

    @Test("the query check takes exactly the query parameters the spec lists, and every route it guards documents its 400")
    func queriesMatchTheSpec() throws {
        let documented = try documentedQueries()
        let checked = Dictionary(QueryParameterMiddleware.parameters.map { rule in
            ("\(rule.method) /" + rule.pattern.joined(separator: "/"), Set(rule.names))
        }, uniquingKeysWith: { first, _ in first })
        #expect(checked.count == QueryParameterMiddleware.parameters.count, "a route listed twice in the query check")
        #expect(documented.count >= 12 && documented["GET /v1/users/{userId}/subscriptions"] == ["bundleId"], "\(documented)")
        #expect(checked == documented, "the query check: \(checked.sorted { $0.key < $1.key }); the spec: \(documented.sorted { $0.key < $1.key })")
        // Any /v1/ route but Apple's notifications may refuse a query it does not take.
        let text = try String(contentsOf: TestServer.packageRoot.appendingPathComponent("docs/openapi.yaml"), encoding: .utf8)
        var missing = [String]()
        var (operation, has400): (String?, Bool) = (nil, false)
        var path: String?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) + ["components:"] {
            let startsOperation = line.hasPrefix("    ") && !line.hasPrefix("     ") && line.hasSuffix(":")
            let startsPath = line.hasPrefix("  /") && !line.hasPrefix("   ")
            if startsOperation || startsPath || line == "components:" {
                if let operation, !has400, operation.contains(" /v1/"), !operation.contains("/v1/notifications") { missing.append(operation) }
                (operation, has400) = (nil, false)
            }
            if line == "components:" { break }
            if startsPath { path = String(line.dropFirst(2).dropLast()) }
            if startsOperation, let path { operation = "\(line.trimmingCharacters(in: .whitespaces).dropLast().uppercased()) \(path)" }
            if line.hasPrefix("        \"400\":") { has400 = true }
        }
        #expect(missing.isEmpty, "no 400 documented: \(missing)")
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
