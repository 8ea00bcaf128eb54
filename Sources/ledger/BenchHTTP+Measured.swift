import Foundation

extension BenchHTTP {
    /// One measured workload: the latencies of successful requests, the failures, and the CPU
    /// time the server and the local PostgreSQL processes spent per successful request.
    struct Measured {
        let latencies: LatencySummary
        let failures: Int
        let serverMicroseconds: Double
        let postgresMicroseconds: Double
        /// The whole machine's CPU over the measured window (client, server, PostgreSQL, kernel).
        let machine: MachineCPU
        /// Seconds of CPU, for merging rounds.
        var serverSeconds: Double { serverMicroseconds * Double(latencies.operations) / 1_000_000 }
        var postgresSeconds: Double { postgresMicroseconds * Double(latencies.operations) / 1_000_000 }
    }

    /// One level's rounds, merged: the HTTP workload, pgbench, and each round's ratio.
    struct Level {
        private var rounds: [(events: Measured, baseline: LatencySummary, baselineMachine: MachineCPU)] = []
        var floor: Measured?

        mutating func add(_ events: Measured, _ baseline: LatencySummary, _ baselineMachine: MachineCPU) {
            rounds.append((events, baseline, baselineMachine))
        }

        /// The whole machine's CPU while pgbench ran, all rounds.
        var baselineMachine: MachineCPU { rounds.reduce(MachineCPU()) { $0 + $1.baselineMachine } }

        var roundRatios: [Double] { rounds.map { $0.events.latencies.ratio(to: $0.baseline) } }

        var events: Measured {
            let operations = rounds.reduce(0) { $0 + $1.events.latencies.operations }
            let count = Double(max(operations, 1))
            return Measured(
                latencies: LatencySummary(operations: operations, seconds: rounds.reduce(0) { $0 + $1.events.latencies.seconds },
                                          latencies: rounds.flatMap(\.events.latencies.latencies)),
                failures: rounds.reduce(0) { $0 + $1.events.failures },
                serverMicroseconds: rounds.reduce(0) { $0 + $1.events.serverSeconds } / count * 1_000_000,
                postgresMicroseconds: rounds.reduce(0) { $0 + $1.events.postgresSeconds } / count * 1_000_000,
                machine: rounds.reduce(MachineCPU()) { $0 + $1.events.machine })
        }

        var baseline: LatencySummary {
            LatencySummary(operations: rounds.reduce(0) { $0 + $1.baseline.operations }, seconds: rounds.reduce(0) { $0 + $1.baseline.seconds },
                           latencies: rounds.flatMap(\.baseline.latencies))
        }
    }
}
