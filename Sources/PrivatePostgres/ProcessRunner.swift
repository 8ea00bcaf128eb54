import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Runs a command to completion, as another system user when asked, and captures its output.
///
/// Uses posix_spawn and waitpid directly: pg_ctl leaves a daemon behind, and the child must not
/// pass it any descriptor of ours (Foundation's Process then never notices pg_ctl's exit).
public struct ProcessRunner: Sendable {
    /// The result of one run: exit status and combined output.
    public struct Outcome: Sendable {
        public let status: Int32
        public let output: String
    }

    /// The system user to run PostgreSQL's programs as, or nil to run them as ourselves.
    public let user: String?
    /// Where the child runs and where its output is collected.
    public let workingDirectory: URL

    public init(user: String? = nil, workingDirectory: URL) {
        self.user = user
        self.workingDirectory = workingDirectory
    }

    /// Runs the command to its end without holding a thread: Swift's task pool has one thread
    /// per core, and initdb or `pg_ctl -w` holding one for seconds stalls every task of the
    /// process (on two cores, two such runs stalled the tests' servers into 503s).
    public func run(_ executable: String, _ arguments: [String]) async throws -> Outcome {
        let outputPath = outputPath()
        defer { unlink(outputPath) }
        let pid = try spawn(executable, arguments, outputPath: outputPath)
        // Looked for from a task of its own, which a cancelled caller does not cancel: the command
        // runs to its end (an initdb stopped half way is of no use), and the looks keep sleeping
        // between them rather than spinning.
        let status = try await Task {
            var pause = 2
            while true {
                if let status = try Self.exitStatus(ofEnded: pid) { return status }
                try await Task.sleep(for: .milliseconds(pause))
                pause = min(pause * 2, 50)
            }
        }.value
        return Self.outcome(status, outputPath)
    }

    /// Runs the command to its end, blocking the calling thread: for exit paths (`defer`,
    /// `atexit`), where nothing else waits for a thread.
    public func runBlocking(_ executable: String, _ arguments: [String]) throws -> Outcome {
        let outputPath = outputPath()
        defer { unlink(outputPath) }
        let pid = try spawn(executable, arguments, outputPath: outputPath)
        return Self.outcome(try Self.wait(for: pid), outputPath)
    }

    private func outputPath() -> String {
        workingDirectory.appendingPathComponent("command-\(getpid())-\(UUID().uuidString).out").path
    }

    private static func outcome(_ status: Int32, _ outputPath: String) -> Outcome {
        let text = (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? ""
        return Outcome(status: status, output: text.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// Starts the command with its output appended to `outputPath`, and returns its pid at once.
    public func spawn(_ executable: String, _ arguments: [String], outputPath: String, environment: [String: String] = [:]) throws -> pid_t {
        let argv = user.map { [Self.runuser, "-u", $0, "--", executable] } ?? [executable]

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outputPath, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        _ = Self.addCloseFrom?(&actions, 3)
        _ = Self.addChdir?(&actions, workingDirectory.path)

        // Swift's threads block most signals; a child inherits that mask (pgbench -T then never
        // sees its SIGALRM). Start children with nothing blocked and default handlers.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        var allSignals = sigset_t()
        sigfillset(&allSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        posix_spawnattr_setsigdefault(&attributes, &allSignals)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        var variables = ProcessInfo.processInfo.environment
        for (key, value) in environment { variables[key] = value }
        let cEnvironment = variables.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { cEnvironment.forEach { free($0) } }
        let cArguments = (argv + arguments).map { strdup($0) } + [nil]
        defer { cArguments.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, argv[0], &actions, &attributes, cArguments, cEnvironment)
        guard spawned == 0 else {
            throw PrivateClusterError("cannot run \(argv[0]): \(String(cString: strerror(spawned)))")
        }
        return pid
    }

    /// Waits for a child to end and answers its exit status (128 + signal when killed).
    public static func wait(for pid: pid_t) throws -> Int32 {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            guard errno == EINTR else { throw PrivateClusterError("waiting for \(pid): \(String(cString: strerror(errno)))") }
        }
        return exitCode(status)
    }

    /// The exit status of a child that has ended (reaped now), or nil while it runs.
    public static func exitStatus(ofEnded pid: pid_t) throws -> Int32? {
        var status: Int32 = 0
        while true {
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == 0 { return nil }
            if reaped == pid { break }
            guard errno == EINTR else { throw PrivateClusterError("waiting for \(pid): \(String(cString: strerror(errno)))") }
        }
        return exitCode(status)
    }

    /// The exit status waitpid reported (128 + signal when killed). WIFEXITED / WEXITSTATUS are
    /// macros Swift cannot import.
    private static func exitCode(_ status: Int32) -> Int32 {
        (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
    }

    /// A TCP port that was free a moment ago on 127.0.0.1.
    public static func freeLocalPort() throws -> Int {
        let (descriptor, port) = try boundLocalPort()
        close(descriptor)
        return port
    }

    /// A socket bound to a free TCP port on 127.0.0.1, not listening (a connection to it is
    /// refused while it stays open), and the port; the caller closes it.
    public static func boundLocalPort() throws -> (descriptor: Int32, port: Int) {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw PrivateClusterError("cannot open a socket: \(String(cString: strerror(errno)))") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, length) == 0 && getsockname(descriptor, $0, &length) == 0 }
        }
        guard bound else {
            close(descriptor)
            throw PrivateClusterError("cannot find a free port on 127.0.0.1")
        }
        return (descriptor, Int(UInt16(bigEndian: address.sin_port)))
    }

    // glibc's *_np spawn actions are hidden from Swift's Glibc module by feature macros.
    private typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    private typealias AddChdir = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>) -> Int32
    private static let addCloseFrom = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np")
        .map { unsafeBitCast($0, to: AddCloseFrom.self) }
    private static let addChdir = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addchdir_np")
        .map { unsafeBitCast($0, to: AddChdir.self) }

    static let runuser: String = ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"]
        .first { FileManager.default.isExecutableFile(atPath: $0) } ?? "/usr/sbin/runuser"
}
