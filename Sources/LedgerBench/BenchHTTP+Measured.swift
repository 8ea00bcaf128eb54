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

    /// One level's rounds: the HTTP workload, both baselines with the machine's CPU while they
    /// ran, and the write path alone.
    struct Level {
        private var rounds: [(events: Measured, byHand: PgbenchBaseline.Measurement, bare: PgbenchBaseline.Measurement, alone: WritePath)] = []
        var floor: Measured?

        mutating func add(_ events: Measured, byHand: PgbenchBaseline.Measurement, bare: PgbenchBaseline.Measurement, alone: WritePath) {
            rounds.append((events, byHand, bare, alone))
        }

        /// Each round's ratio against the work done by hand.
        var byHandRatios: [Double] { rounds.map { $0.events.latencies.ratio(to: $0.byHand.summary) } }

        /// All rounds as one measurement each side: counts, seconds and CPU added, latencies pooled.
        func merged() -> (events: Measured, byHand: PgbenchBaseline.Measurement, bare: PgbenchBaseline.Measurement, alone: WritePath) {
            func merge(_ baselines: [PgbenchBaseline.Measurement]) -> PgbenchBaseline.Measurement {
                (LatencySummary(combining: baselines.map(\.summary)), baselines.map(\.machine).reduce(MachineCPU(), +))
            }
            let alone = rounds.map(\.alone)
            return (
                Measured(combining: rounds.map(\.events)), merge(rounds.map(\.byHand)), merge(rounds.map(\.bare)),
                WritePath(
                    measured: Measured(combining: alone.map(\.measured)), groups: alone.reduce(0) { $0 + $1.groups },
                    writes: alone.reduce(0) { $0 + $1.writes }))
        }
    }
}

extension BenchHTTP.Measured {
    /// Several runs as one: counts, seconds and CPU added, latencies pooled.
    init(combining parts: [Self]) {
        self.init(
            latencies: LatencySummary(combining: parts.map(\.latencies)), failures: parts.reduce(0) { $0 + $1.failures },
            serverSeconds: parts.reduce(0) { $0 + $1.serverSeconds }, postgresSeconds: parts.reduce(0) { $0 + $1.postgresSeconds },
            machine: parts.map(\.machine).reduce(MachineCPU(), +))
    }
}
