import Foundation

/// Where PostgreSQL's server programs are: `LEDGER_POSTGRES_BIN` (that folder or an error), else
/// the newest of Debian's `/usr/lib/postgresql/<version>/bin`, else the PATH.
public struct PostgresBinaries: Sendable {
    public let directory: String
    var initdb: String { directory + "/initdb" }
    var pgCtl: String { directory + "/pg_ctl" }
    /// pgbench beside the server programs, else the one on the PATH.
    public var pgbench: String {
        let beside = directory + "/pgbench"
        return FileManager.default.isExecutableFile(atPath: beside) ? beside : "/usr/bin/pgbench"
    }

    public static func locate(environment: [String: String] = ProcessInfo.processInfo.environment) throws -> PostgresBinaries {
        // The one named, or none: a mistyped path must not quietly run another PostgreSQL.
        if let configured = environment["LEDGER_POSTGRES_BIN"], !configured.isEmpty {
            guard FileManager.default.isExecutableFile(atPath: configured + "/initdb"),
                  FileManager.default.isExecutableFile(atPath: configured + "/pg_ctl") else {
                throw PrivateClusterError("LEDGER_POSTGRES_BIN is \(configured), which holds no initdb and pg_ctl: name the folder of PostgreSQL's server programs, or unset it")
            }
            return PostgresBinaries(directory: configured)
        }
        var candidates: [String] = []
        let debian = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: debian)) ?? [])
            .compactMap(Int.init).sorted(by: >)
        candidates += versions.map { "\(debian)/\($0)/bin" }
        candidates += (environment["PATH"] ?? "").split(separator: ":").map(String.init)
        for directory in candidates where FileManager.default.isExecutableFile(atPath: directory + "/initdb")
            && FileManager.default.isExecutableFile(atPath: directory + "/pg_ctl") {
            return PostgresBinaries(directory: directory)
        }
        throw PrivateClusterError(
            "PostgreSQL's server programs (initdb, pg_ctl) were not found: install them with `apt-get install -y postgresql`, set LEDGER_POSTGRES_BIN, or set LEDGER_DATABASE_URL")
    }
}

/// The system account that runs PostgreSQL: ourselves, or `postgres` when we are root.
struct SystemAccount: Sendable {
    let runAs: String?
    let uid: uid_t
    let gid: gid_t

    static func forPostgres() throws -> SystemAccount {
        guard geteuid() == 0 else { return SystemAccount(runAs: nil, uid: geteuid(), gid: getegid()) }
        guard let entry = getpwnam("postgres") else {
            throw PrivateClusterError("running as root, and PostgreSQL refuses to run as root: create a `postgres` system user (apt-get install -y postgresql makes one) or run as an unprivileged user")
        }
        return SystemAccount(runAs: "postgres", uid: entry.pointee.pw_uid, gid: entry.pointee.pw_gid)
    }

    func chown(_ path: String) throws {
        guard runAs != nil else { return }
        guard Glibc.chown(path, uid, gid) == 0 else {
            throw PrivateClusterError("cannot hand \(path) to the postgres user: \(String(cString: strerror(errno)))")
        }
    }
}

/// An advisory whole-file lock (`flock`), released by the kernel when the process ends.
final class FileLock: @unchecked Sendable {
    private var descriptor: Int32

    init(path: String) throws {
        descriptor = open(path, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw PrivateClusterError("cannot open \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// Takes the lock; without `wait`, returns false when another holder has it.
    @discardableResult
    func lock(wait: Bool) throws -> Bool {
        if flock(descriptor, LOCK_EX | (wait ? 0 : LOCK_NB)) == 0 { return true }
        if errno == EWOULDBLOCK { return false }
        throw PrivateClusterError("cannot lock: \(String(cString: strerror(errno)))")
    }

    func unlock() { _ = flock(descriptor, LOCK_UN) }

    func close() {
        guard descriptor >= 0 else { return }
        _ = Glibc.close(descriptor)
        descriptor = -1
    }

    deinit { close() }
}
