import Foundation

extension BenchHTTP {
    /// One measured workload: the latencies of successful requests, the failures, and the CPU
    /// time the server, the local PostgreSQL processes and the whole machine spent meanwhile.
    struct Measured {
        let latencies: LatencySummary
        let failures: Int
        /// CPU seconds of the server process and of the machine's PostgreSQL processes.
        let serverSeconds: Double
        let postgresSeconds: Double
        /// The whole machine's CPU over the measured window (client, server, PostgreSQL, kernel).
        let machine: MachineCPU

        /// CPU per successful request, in microseconds (nan without one).
        var serverMicroseconds: Double { perRequest(serverSeconds) }
        var postgresMicroseconds: Double { perRequest(postgresSeconds) }

        private func perRequest(_ seconds: Double) -> Double {
            latencies.operations > 0 ? seconds / Double(latencies.operations) * 1_000_000 : .nan
        }
    }

    /// One level's rounds: the HTTP workload, pgbench and the machine's CPU while pgbench ran.
    struct Level {
        private var rounds: [(events: Measured, baseline: LatencySummary, baselineMachine: MachineCPU)] = []
        var floor: Measured?

        mutating func add(_ events: Measured, _ baseline: LatencySummary, _ baselineMachine: MachineCPU) {
            rounds.append((events, baseline, baselineMachine))
        }

        var roundRatios: [Double] { rounds.map { $0.events.latencies.ratio(to: $0.baseline) } }

        /// All rounds as one measurement each side: counts, seconds and CPU added, latencies pooled.
        func merged() -> (events: Measured, baseline: LatencySummary, baselineMachine: MachineCPU) {
            let events = Measured(
                latencies: LatencySummary(operations: rounds.reduce(0) { $0 + $1.events.latencies.operations },
                                          seconds: rounds.reduce(0) { $0 + $1.events.latencies.seconds },
                                          latencies: rounds.flatMap(\.events.latencies.latencies)),
                failures: rounds.reduce(0) { $0 + $1.events.failures },
                serverSeconds: rounds.reduce(0) { $0 + $1.events.serverSeconds },
                postgresSeconds: rounds.reduce(0) { $0 + $1.events.postgresSeconds },
                machine: rounds.reduce(MachineCPU()) { $0 + $1.events.machine })
            let baseline = LatencySummary(
                operations: rounds.reduce(0) { $0 + $1.baseline.operations }, seconds: rounds.reduce(0) { $0 + $1.baseline.seconds },
                latencies: rounds.flatMap(\.baseline.latencies))
            return (events, baseline, rounds.reduce(MachineCPU()) { $0 + $1.baselineMachine })
        }
    }
}
