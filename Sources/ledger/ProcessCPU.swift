import Foundation

/// CPU time from /proc, for the benchmarks' per-request figures: a run's throughput on a shared
/// 2-core VM swings by half from run to run, the CPU one request costs much less.
enum ProcessCPU {
    /// User and system CPU seconds a process has used so far (0 when it cannot be read).
    static func seconds(of pid: pid_t) -> Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return 0 }
        // After the command name: state is field 3, utime and stime fields 14 and 15.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }

    /// CPU seconds used so far by every process of this machine named `postgres` (the server's
    /// backends, its WAL writer, checkpointer and autovacuum); 0 for a database elsewhere.
    static func postgresSeconds() -> Double {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.reduce(0) { total, entry in
            guard let pid = pid_t(entry),
                  let name = try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8),
                  name.trimmingCharacters(in: .newlines) == "postgres" else { return total }
            return total + seconds(of: pid)
        }
    }
}

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
        let perSecond = Double(sysconf(Int32(_SC_CLK_TCK)))
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
