import Foundation

/// What a workload's requests cost, added over its rounds: the server's CPU, PostgreSQL's, and
/// the whole machine's (the load generator's included), as `bench http` counts them.
struct RequestCost {
    var server = 0.0
    var postgres = 0.0
    var machine = MachineCPU()

    /// Runs `body` (one round's requests) and adds what it cost.
    mutating func measure<Answer>(server pid: pid_t, _ body: () async throws -> Answer) async rethrows -> Answer {
        let (serverStart, postgresStart, machineStart) = (ProcessCPU.seconds(of: pid), ProcessCPU.postgresSeconds(), MachineCPU.now())
        let answer = try await body()
        server += ProcessCPU.seconds(of: pid) - serverStart
        postgres += ProcessCPU.postgresSeconds() - postgresStart
        machine = machine + (MachineCPU.now() - machineStart)
        return answer
    }

    /// Server, PostgreSQL and busy machine µs per request, and the idle share.
    func cells(per requests: Int) -> [String] {
        let per = { (seconds: Double) in format(requests > 0 ? seconds / Double(requests) * 1_000_000 : .nan) }
        return [per(server), per(postgres), format(machine.microseconds(per: requests)), format(machine.idlePercent)]
    }
}
