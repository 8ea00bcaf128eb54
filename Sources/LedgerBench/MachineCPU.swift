import Foundation

/// The whole machine's CPU time (every core, from /proc/stat): busy (user, nice, system,
/// interrupts) and idle (idle, I/O wait). Busy time per operation counts everything a workload
/// makes the machine do, processes that ended included (pgbench's backends end with each run),
/// so that an HTTP event and a pgbench row compare whole: on a machine both keep busy, their
/// throughputs stand in the inverse ratio of these costs.
struct MachineCPU {
    var busy = 0.0
    var idle = 0.0

    /// Seconds so far since boot; zeros when /proc/stat cannot be read.
    static func now() -> MachineCPU {
        guard let stat = try? String(contentsOfFile: "/proc/stat", encoding: .utf8),
              let line = stat.split(separator: "\n").first, line.hasPrefix("cpu ") else { return MachineCPU() }
        let ticks = line.split(separator: " ").dropFirst().compactMap { Double($0) }
        guard ticks.count >= 7 else { return MachineCPU() }
        let perSecond = ProcessCPU.ticksPerSecond
        // user nice system idle iowait irq softirq [steal ...]: steal is the host's, not ours.
        return MachineCPU(busy: (ticks[0] + ticks[1] + ticks[2] + ticks[5] + ticks[6]) / perSecond, idle: (ticks[3] + ticks[4]) / perSecond)
    }

    static func - (later: MachineCPU, earlier: MachineCPU) -> MachineCPU {
        MachineCPU(busy: later.busy - earlier.busy, idle: later.idle - earlier.idle)
    }

    static func + (a: MachineCPU, b: MachineCPU) -> MachineCPU {
        MachineCPU(busy: a.busy + b.busy, idle: a.idle + b.idle)
    }

    /// Busy microseconds per operation.
    func microseconds(per operations: Int) -> Double {
        operations > 0 ? busy / Double(operations) * 1_000_000 : .nan
    }

    /// The idle share of the machine's time, in percent.
    var idlePercent: Double { busy + idle > 0 ? idle / (busy + idle) * 100 : .nan }
}
