// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "order-ledger",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "ledger", targets: ["ledger"]),
        .executable(name: "ledger-bench", targets: ["LedgerBench"]),
    ],
    dependencies: [
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.7.1"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/yaslab/CSV.swift.git", from: "2.5.2"),
        .package(url: "https://github.com/adam-fowler/compress-nio.git", from: "1.5.0"),
    ],
    targets: [
        /// The domain: events, the order state machine, the projections' rules, the reconciler's
        /// rules, typed ids. No I/O, no JSON.
        .target(name: "LedgerCore"),
        /// The SQL of `sql/`, embedded in the binary: the numbered migrations and the routines' definition files.
        .target(
            name: "LedgerSchema",
            path: "sql",
            exclude: ["README.md"],
            resources: [.embedInCode("migrations"), .embedInCode("routines")]
        ),
        /// The JSON the ledger stores and answers: event bodies written and read, times in ISO 8601.
        .target(name: "LedgerJSON", dependencies: ["LedgerCore", .product(name: "CSV", package: "CSV.swift")]),
        /// PostgreSQL, and the only module with SQL text: the connection, the writer and the
        /// append, the event store and feed, projections and their rebuild, migrations, leases,
        /// and every query the rest of the ledger needs.
        .target(
            name: "LedgerStore",
            dependencies: [
                "LedgerCore", "LedgerJSON", "LedgerSchema",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                // The pool's errors (`ConnectionPoolError`), which postgres-nio's client throws as they are.
                .product(name: "_ConnectionPoolModule", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ]
        ),
        /// The private PostgreSQL cluster `ledger serve`, the tests and the benchmarks start when
        /// no database is configured.
        .target(
            name: "PrivatePostgres",
            dependencies: [
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        /// The ledger's work with Apple and with the pool: intake of receipts and notifications,
        /// the reconciler pass, support's actions, history sweeps, refund catch-up, notification
        /// backfill, the calls to Apple. Neither HTTP nor SQL.
        .target(
            name: "LedgerServices",
            dependencies: [
                "LedgerCore", "LedgerJSON", "LedgerStore", "AppleReceipts",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        /// Verification of Apple's proofs: signed transactions and notifications (JWS with an x5c
        /// chain), legacy receipts through verifyReceipt.
        .target(
            name: "AppleReceipts",
            dependencies: [
                "LedgerCore",
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CompressNIO", package: "compress-nio"),
            ]
        ),
        /// HTTP only: routes, middleware, configuration and the application's assembly.
        .target(
            name: "LedgerServer",
            dependencies: [
                "LedgerCore", "LedgerJSON", "LedgerStore", "LedgerServices", "PrivatePostgres", "AppleReceipts",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOFoundationCompat", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                // The HTTP/1 request head before it becomes an HTTPRequest, which has no version.
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras"),
            ]
        ),
        /// The shipped executable: serve and the operator's commands.
        .executableTarget(
            name: "ledger",
            dependencies: [
                "LedgerCore", "LedgerJSON", "LedgerStore", "LedgerServices", "LedgerServer", "PrivatePostgres", "AppleReceipts",
                "AppStoreStandIn",
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        /// `ledger-bench`: the benchmarks, their load generator and CPU readers; `scripts/bench` runs it.
        .executableTarget(
            name: "LedgerBench",
            dependencies: [
                "LedgerCore", "LedgerJSON", "LedgerStore", "LedgerServices", "LedgerServer", "PrivatePostgres", "AppleReceipts",
                "AppStoreStandIn",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        /// A stand-in App Store Server API on a local port, for the tests and `ledger demo`.
        .target(
            name: "AppStoreStandIn",
            dependencies: [
                "AppleReceipts",
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CompressNIO", package: "compress-nio"),
            ]
        ),
        /// Shared test support: the test PostgreSQL and per-suite databases.
        .target(
            name: "LedgerTestSupport",
            dependencies: [
                "LedgerCore", "LedgerJSON", "LedgerStore", "LedgerServices", "PrivatePostgres", "AppleReceipts", "AppStoreStandIn",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "Tests/LedgerTestSupport"
        ),
        .testTarget(name: "LedgerCoreTests", dependencies: ["LedgerCore", "LedgerTestSupport"]),
        .testTarget(name: "LedgerJSONTests", dependencies: ["LedgerJSON", "LedgerTestSupport"]),
        .testTarget(
            name: "AppleReceiptsTests",
            dependencies: ["AppleReceipts", "LedgerTestSupport", .product(name: "JWTKit", package: "jwt-kit")]
        ),
        .testTarget(
            name: "LedgerStoreTests",
            dependencies: [
                "LedgerStore", "LedgerJSON", "LedgerTestSupport",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "_ConnectionPoolModule", package: "postgres-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        .testTarget(
            name: "LedgerServicesTests",
            dependencies: [
                "LedgerServices", "LedgerStore", "LedgerJSON", "LedgerTestSupport",
                .product(name: "PostgresNIO", package: "postgres-nio"),
            ]
        ),
        .testTarget(
            name: "PrivatePostgresTests",
            dependencies: ["PrivatePostgres", "LedgerTestSupport", .product(name: "PostgresNIO", package: "postgres-nio")]
        ),
        .testTarget(
            name: "LedgerServerTests",
            dependencies: [
                "LedgerServer", "LedgerServices", "LedgerStore", "LedgerJSON", "LedgerTestSupport",
                .product(name: "HummingbirdTesting", package: "hummingbird"),
            ]
        ),
        /// The server killed and its database stopped under load, through a `ledger` child process.
        .testTarget(
            name: "FaultTests",
            dependencies: [
                "LedgerStore", "LedgerServices", "LedgerServer", "PrivatePostgres", "LedgerTestSupport",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
