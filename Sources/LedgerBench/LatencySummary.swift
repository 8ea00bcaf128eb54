/// Throughput and latency percentiles of one benchmark run.
struct LatencySummary {
    let operations: Int
    let seconds: Double
    /// Sorted latencies in milliseconds.
    let latencies: [Double]

    init(operations: Int, seconds: Double, latencies: [Double]) {
        self.operations = operations
        self.seconds = seconds
        self.latencies = latencies.sorted()
    }

    /// Several runs as one: their operations and seconds added, their latencies pooled.
    init(combining parts: [LatencySummary]) {
        self.init(operations: parts.reduce(0) { $0 + $1.operations }, seconds: parts.reduce(0) { $0 + $1.seconds },
                  latencies: parts.flatMap(\.latencies))
    }

    var perSecond: Double { seconds > 0 ? Double(operations) / seconds : 0 }

    /// This run's throughput against `baseline`'s (nan without a baseline figure).
    func ratio(to baseline: LatencySummary) -> Double {
        baseline.perSecond > 0 ? perSecond / baseline.perSecond : .nan
    }

    /// Throughput, p50 and p99 ms, as the benchmarks' tables print them.
    var cells: [String] {
        [format(perSecond), format(percentile(50), decimals: 2), format(percentile(99), decimals: 2)]
    }

    func percentile(_ p: Double) -> Double {
        guard !latencies.isEmpty else { return .nan }
        let index = min(latencies.count - 1, Int((p / 100 * Double(latencies.count)).rounded(.up)) - 1)
        return latencies[max(0, index)]
    }
}

func format(_ value: Double, decimals: Int = 0) -> String {
    guard value.isFinite else { return "-" }
    var text = String(Int((value * pow10(decimals)).rounded()))
    guard decimals > 0 else { return text }
    let negative = text.hasPrefix("-")
    if negative { text.removeFirst() }
    while text.count <= decimals { text = "0" + text }
    text.insert(".", at: text.index(text.endIndex, offsetBy: -decimals))
    return (negative ? "-" : "") + text
}

private func pow10(_ n: Int) -> Double { (0..<n).reduce(1.0) { acc, _ in acc * 10 } }

/// A Markdown table's header: the columns, right-aligned but for those in `leftAligned`.
func printTableHeader(_ columns: [String], leftAligned: Set<Int> = []) {
    printTableRow(columns)
    print("|" + columns.indices.map { leftAligned.contains($0) ? "---|" : "---:|" }.joined())
}

/// A Markdown table's row.
func printTableRow(_ cells: [String]) {
    print("| " + cells.joined(separator: " | ") + " |")
}
