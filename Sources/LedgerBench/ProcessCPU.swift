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
        return (user + system) / ticksPerSecond
    }

    /// The unit of /proc's CPU times.
    static let ticksPerSecond = Double(sysconf(Int32(_SC_CLK_TCK)))

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
