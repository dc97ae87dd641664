//! A real PostgreSQL server for tests (docs/testing.md): one per test
//! process, a fresh database per test.
//!
//! Shared by bc-controlplane's unit tests and the e2e binary (both
//! dev-depend on bc-test-support); it uses std and rcgen only.
//!
//! The server runs from Debian's `postgresql` package (scripts/lib.sh), the
//! highest `/usr/lib/postgresql/<version>/bin`; nothing on PATH is trusted.
//! Tests run as root and initdb refuses root, so the server runs as
//! `postgres`, the user the package creates. Over TCP it speaks TLS only
//! (pg_hba `hostssl`, a certificate from a throwaway CA) and asks for the
//! superuser's password (scram-sha-256; generated at start, in a 0600 file
//! that `[database] password_file` names), so tests go through the verified
//! TLS and password path a deployment uses; psql reaches it over the Unix
//! socket, which trusts any local user (the directory is 0700), or over TCP
//! with a PGPASSFILE (never a password in argv).
//!
//! A watcher process stops the server and removes its directory when the
//! test process ends, however it ends: a static `OnceLock` never runs a
//! destructor, and a crashed or killed test runs none either.

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where Debian's packages put each major version's binaries.
const PG_LIB: &str = "/usr/lib/postgresql";
/// The superuser initdb creates; every database belongs to it.
const SUPERUSER: &str = "bcd";
/// Ports tried before giving up when another process takes the free port
/// between the probe and the server's bind.
const PORT_ATTEMPTS: usize = 10;

/// The server of this test process.
#[derive(Debug)]
pub struct PgCluster {
    bin: PathBuf,
    /// TMP: `data/`, the Unix socket, `server.log`, the certificates.
    dir: PathBuf,
    port: u16,
    /// How long initdb and the start took (printed; docs/testing.md).
    pub initdb_time: Duration,
    pub start_time: Duration,
}

/// A fresh database, dropped (with its sessions) when this is.
#[derive(Debug)]
pub struct PgDb {
    /// `postgres://bcd@127.0.0.1:PORT/NAME?sslmode=verify-full`: TLS, the
    /// server's certificate checked against [`PgCluster::ca_file`].
    pub url: String,
    pub name: String,
    /// The superuser's password (0600): `[database] password_file`.
    pub password_file: PathBuf,
    cluster: &'static PgCluster,
}

impl PgCluster {
    /// The server of this test process, started on first use. Panics with
    /// what is missing (the package, the `postgres` user) or what failed.
    pub fn shared() -> &'static PgCluster {
        static CLUSTER: OnceLock<Result<PgCluster, String>> = OnceLock::new();
        match CLUSTER.get_or_init(PgCluster::start) {
            Ok(cluster) => cluster,
            Err(e) => panic!("the tests' PostgreSQL server: {e}"),
        }
    }

    /// A server of the caller's own, for a test that stops or restarts it
    /// (the shared one serves the tests running beside it): started now,
    /// and stopped and removed when the test process ends, as the shared
    /// one is. Panics as [`PgCluster::shared`] does.
    pub fn private() -> &'static PgCluster {
        match PgCluster::start() {
            Ok(cluster) => Box::leak(Box::new(cluster)),
            Err(e) => panic!("a PostgreSQL server of the test's own: {e}"),
        }
    }

    /// Restarts the server as an operator would (`pg_ctl restart`, fast
    /// shutdown: every session ends), on the same port; returns once it
    /// accepts connections again. Panics with pg_ctl's output on failure.
    pub fn restart(&self) {
        let run_as = match is_root() {
            true => Some(postgres_ids().unwrap_or_else(|e| panic!("{e}"))),
            false => None,
        };
        let data = self.dir.join("data");
        if let Err(e) = run(
            pg_command(&self.bin, "pg_ctl", &self.dir, run_as)
                .args(["-w", "-m", "fast", "-D"])
                .arg(&data)
                .arg("-l")
                .arg(self.dir.join("server.log"))
                .args(["-o", &format!("-p {}", self.port), "restart"]),
            "pg_ctl restart",
        ) {
            panic!("{e}");
        }
    }

    /// A fresh `t_<random>` database; see [`PgDb`].
    pub fn database(&'static self) -> PgDb {
        let name = format!("t_{}", random_hex());
        if let Err(e) = self.try_psql("postgres", &format!("CREATE DATABASE {name}")) {
            panic!("CREATE DATABASE {name}: {e}");
        }
        PgDb {
            url: format!(
                "postgres://{SUPERUSER}@127.0.0.1:{}/{name}?sslmode=verify-full",
                self.port
            ),
            name,
            password_file: self.password_file(),
            cluster: self,
        }
    }

    /// The superuser's password, one line, mode 0600 (the server's user
    /// owns it: initdb reads it).
    pub(crate) fn password_file(&self) -> PathBuf {
        self.dir.join("password")
    }

    /// libpq's password file for TCP connections (`PGPASSFILE`).
    #[cfg(test)]
    fn pgpass_file(&self) -> PathBuf {
        self.dir.join("pgpass")
    }

    /// The CA certificate (PEM) the server's certificate chains to: a
    /// client's `sslrootcert`, `[database] ca_file`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The directory of the server's Unix socket (`.s.PGSQL.PORT`), where
    /// any local user is trusted: a `sslmode=disable` URL's host.
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The server's TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs `sql` on database `db`, as [`PgDb::psql`] does (for a test
    /// that holds the name only, e.g. in a hook that must be `'static`).
    pub fn psql_in(&self, db: &str, sql: &str) -> String {
        match self.try_psql(db, sql) {
            Ok(out) => out,
            Err(e) => panic!("psql on {db}: {e}\n{sql}"),
        }
    }

    /// Runs `sql` on database `db` over the Unix socket; its output
    /// (unaligned, tuples only), or psql's stderr.
    fn try_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        psql(&self.bin, &self.conninfo(db), sql)
    }

    /// libpq's conninfo for database `db` over the Unix socket.
    fn conninfo(&self, db: &str) -> String {
        format!(
            "host={} port={} user={SUPERUSER} dbname={db}",
            self.dir.display(),
            self.port
        )
    }

    fn start() -> Result<PgCluster, String> {
        let bin = find_bin()?;
        let run_as = if is_root() {
            Some(postgres_ids()?)
        } else {
            None
        };
        let dir = make_dir(run_as)?;
        // First, so that a failure below leaves nothing behind either.
        spawn_watcher(&bin, &dir, run_as.is_some())?;
        write_certs(&dir, run_as)?;
        write_password(&dir, run_as)?;

        let data = dir.join("data");
        let t = Instant::now();
        run(
            pg_command(&bin, "initdb", &dir, run_as)
                .arg("-D")
                .arg(&data)
                .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C"])
                .arg(format!("--pwfile={}", dir.join("password").display())),
            "initdb",
        )?;
        let initdb_time = t.elapsed();
        configure(&dir, &data)?;

        let log = dir.join("server.log");
        let t = Instant::now();
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let logged = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
            let out = pg_command(&bin, "pg_ctl", &dir, run_as)
                .arg("-w")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(&log)
                .args(["-o", &format!("-p {port}"), "start"])
                .output()
                .map_err(|e| format!("{}: {e}", bin.join("pg_ctl").display()))?;
            if out.status.success() {
                let cluster = PgCluster {
                    bin,
                    dir,
                    port,
                    initdb_time,
                    start_time: t.elapsed(),
                };
                eprintln!(
                    "pg_cluster: PostgreSQL on 127.0.0.1:{port} (initdb {:?}, start {:?}), {}",
                    cluster.initdb_time,
                    cluster.start_time,
                    cluster.dir.display()
                );
                return Ok(cluster);
            }
            let new_log = read_from(&log, logged);
            if !new_log.contains("could not bind") {
                return Err(format!(
                    "pg_ctl start failed ({}): {}{}\n{}: {new_log}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr),
                    log.display()
                ));
            }
            last = new_log;
        }
        Err(format!(
            "no free port after {PORT_ATTEMPTS} attempts; the last: {last}"
        ))
    }
}

impl PgDb {
    /// Runs `sql` (one or more statements) in this database and returns
    /// what psql printed (unaligned, tuples only, no trailing newline), so a
    /// test can look inside. Panics with psql's stderr on an error.
    pub fn psql(&self, sql: &str) -> String {
        match self.cluster.try_psql(&self.name, sql) {
            Ok(out) => out,
            Err(e) => panic!("psql on {}: {e}\n{sql}", self.name),
        }
    }

    /// A psql command on this database reading SQL from stdin (unaligned,
    /// tuples only, stopping at the first error), for a session a test keeps
    /// open (a lock held while a control plane works); spawn it with stdin
    /// and stdout piped. The e2e tests' (tests/e2e/replicas.rs).
    pub fn psql_session(&self) -> Command {
        let mut cmd = psql_command(&self.cluster.bin);
        cmd.arg("-d").arg(self.cluster.conninfo(&self.name));
        cmd
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if let Err(e) = self.cluster.try_psql("postgres", &sql) {
            // Not a panic: Drop may run while a test already unwinds.
            eprintln!("pg_cluster: {sql}: {e}");
        }
    }
}

/// psql without the caller's environment or ~/.psqlrc: unaligned, tuples
/// only, stopping at the first error.
fn psql_command(bin: &Path) -> Command {
    let mut cmd = Command::new(bin.join("psql"));
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
        .current_dir("/");
    cmd
}

/// The highest `/usr/lib/postgresql/<version>/bin` holding initdb.
fn find_bin() -> Result<PathBuf, String> {
    let missing = || {
        format!(
            "PostgreSQL is not installed: no {PG_LIB}/<version>/bin/initdb \
             (install Debian's postgresql package: scripts/lib.sh BCD_PACKAGES)"
        )
    };
    let entries = std::fs::read_dir(PG_LIB).map_err(|_| missing())?;
    let mut best: Option<(Vec<u32>, PathBuf)> = None;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(version) = name
            .to_str()
            .and_then(|v| v.split('.').map(|p| p.parse::<u32>().ok()).collect())
        else {
            continue;
        };
        let bin = entry.path().join("bin");
        let newer = best.as_ref().is_none_or(|(v, _)| version > *v);
        if newer && bin.join("initdb").is_file() {
            best = Some((version, bin));
        }
    }
    best.map(|(_, bin)| bin).ok_or_else(missing)
}

/// The effective uid is 0: `/proc/self` belongs to the process's euid.
fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// `postgres`'s uid and gid, from /etc/passwd.
fn postgres_ids() -> Result<(u32, u32), String> {
    let missing = "no user postgres in /etc/passwd (Debian's postgresql package creates it); \
                   the tests run as root and initdb refuses root";
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|e| format!("/etc/passwd: {e}"))?;
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .ok_or(missing)?;
    let mut fields = line.split(':').skip(2);
    let id = |f: Option<&str>| f.and_then(|v| v.parse::<u32>().ok()).ok_or(missing);
    Ok((id(fields.next())?, id(fields.next())?))
}

/// TMP: a new 0700 directory owned by the server's user.
fn make_dir(run_as: Option<(u32, u32)>) -> Result<PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("bcd-pg-{}", random_hex()));
    // The socket's path, TMP/.s.PGSQL.PORT, must fit in sun_path.
    if dir.as_os_str().len() > 80 {
        return Err(format!(
            "{}: too long for a Unix socket directory (set TMPDIR)",
            dir.display()
        ));
    }
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    chown(&dir, run_as)?;
    Ok(dir)
}

fn chown(path: &Path, run_as: Option<(u32, u32)>) -> Result<(), String> {
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(|e| format!("chown {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The watcher: once this process is gone, an immediate stop and TMP
/// removed. `tail --pid` waits without polling in the test; setsid keeps it
/// out of the test's process group (a Ctrl-C would end it first).
fn spawn_watcher(bin: &Path, dir: &Path, as_postgres: bool) -> Result<(), String> {
    let script = r#"tail --pid="$1" -f /dev/null; dir=$2; shift 2; "$@" -D "$dir/data" -m immediate stop >/dev/null 2>&1; rm -rf -- "$dir""#;
    let mut cmd = Command::new("setsid");
    cmd.args(["sh", "-c", script, "sh"])
        .arg(std::process::id().to_string())
        .arg(dir);
    if as_postgres {
        cmd.args(["runuser", "-u", "postgres", "--"]);
    }
    cmd.arg(bin.join("pg_ctl"))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd.spawn()
        .map(drop)
        .map_err(|e| format!("the watcher (setsid sh, tail --pid): {e}"))
}

/// A generated superuser password: TMP/password for initdb and
/// `password_file`, TMP/pgpass for psql over TCP; both 0600. Hex, so that
/// neither file needs escaping.
fn write_password(dir: &Path, run_as: Option<(u32, u32)>) -> Result<(), String> {
    let password = format!("{}{}", random_hex(), random_hex());
    for (name, text) in [
        ("password", format!("{password}\n")),
        ("pgpass", format!("127.0.0.1:*:*:{SUPERUSER}:{password}\n")),
    ] {
        let path = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        chown(&path, run_as)?;
    }
    Ok(())
}

/// A throwaway CA and the server's certificate for 127.0.0.1 and localhost:
/// TMP/ca.crt for clients, TMP/server.{crt,key} for the server.
fn write_certs(dir: &Path, run_as: Option<(u32, u32)>) -> Result<(), String> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let gen = |what: &str, e: rcgen::Error| format!("{what}: {e}");
    let ca_key = KeyPair::generate().map_err(|e| gen("the test CA key", e))?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "bcd tests' PostgreSQL CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).map_err(|e| gen("the test CA", e))?;
    let issuer = Issuer::new(ca, &ca_key);
    let key = KeyPair::generate().map_err(|e| gen("the server key", e))?;
    let mut server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .map_err(|e| gen("the server certificate", e))?;
    server
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = server
        .signed_by(&key, &issuer)
        .map_err(|e| gen("the server certificate", e))?;
    for (name, text, mode) in [
        ("ca.crt", ca_cert.pem(), 0o644),
        ("server.crt", cert.pem(), 0o644),
        ("server.key", key.serialize_pem(), 0o600),
    ] {
        let path = dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        chown(&path, run_as)?;
    }
    Ok(())
}

/// Settings for a disposable server, and pg_hba: the socket for psql, TLS
/// only over TCP, loopback only.
fn configure(dir: &Path, data: &Path) -> Result<(), String> {
    let mut conf = String::from("\n# pg_cluster.rs\n");
    for (key, value) in [
        ("listen_addresses", "127.0.0.1".to_owned()),
        ("unix_socket_directories", dir.display().to_string()),
        ("fsync", "off".to_owned()),
        ("synchronous_commit", "off".to_owned()),
        ("full_page_writes", "off".to_owned()),
        ("ssl", "on".to_owned()),
        (
            "ssl_cert_file",
            dir.join("server.crt").display().to_string(),
        ),
        ("ssl_key_file", dir.join("server.key").display().to_string()),
        ("max_connections", "200".to_owned()),
    ] {
        if value.contains(['\'', '\\', '\n']) {
            return Err(format!("{key}: {value:?} cannot be quoted"));
        }
        let _ = writeln!(conf, "{key} = '{value}'");
    }
    let write = |path: PathBuf, text: &str, append: bool| {
        std::fs::OpenOptions::new()
            .append(append)
            .write(true)
            .truncate(!append)
            .open(&path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    write(data.join("postgresql.conf"), &conf, true)?;
    write(
        data.join("pg_hba.conf"),
        "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n",
        false,
    )
}

/// A port nothing listens on now (the server may still lose it to a race:
/// the caller retries).
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("a free port on 127.0.0.1: {e}"))
}

/// `bin/prog` as the server's user, in TMP (postgres cannot read the
/// test's working directory), with no PG* variables from the environment.
fn pg_command(bin: &Path, prog: &str, dir: &Path, run_as: Option<(u32, u32)>) -> Command {
    let mut cmd = Command::new(bin.join(prog));
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir(dir)
        .stdin(Stdio::null());
    if let Some((uid, gid)) = run_as {
        // std drops root's supplementary groups when it sets the uid.
        cmd.uid(uid).gid(gid);
    }
    cmd
}

/// psql with `sql` on stdin: stop at the first error, tuples only.
fn psql(bin: &Path, conninfo: &str, sql: &str) -> Result<String, String> {
    psql_with(psql_command(bin).args(["-d", conninfo]), sql)
}

/// `cmd` (a [`psql_command`]) with `sql` on stdin.
fn psql_with(cmd: &mut Command, sql: &str) -> Result<String, String> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("psql: {e}"))?;
    // Fed from a thread, so that output filling its pipe cannot block the
    // input; a write error (psql gave up early) leaves its stderr to say why.
    let feeder = child.stdin.take().map(|mut stdin| {
        let sql = sql.to_owned();
        std::thread::spawn(move || stdin.write_all(sql.as_bytes()))
    });
    let out = child.wait_with_output().map_err(|e| format!("psql: {e}"))?;
    if let Some(feeder) = feeder {
        let _ = feeder.join();
    }
    if !out.status.success() {
        return Err(format!(
            "psql ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .trim_end_matches('\n')
        .to_owned())
}

fn run(cmd: &mut Command, what: &str) -> Result<Output, String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out)
}

/// What `path` holds past byte `from`.
fn read_from(path: &Path, from: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        use std::io::Seek as _;
        let _ = f.seek(std::io::SeekFrom::Start(from));
        let _ = f.read_to_string(&mut text);
    }
    text
}

/// 16 hex digits from the kernel (names only: a database, TMP).
fn random_hex() -> String {
    let mut bytes = [0u8; 8];
    if let Err(e) = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)) {
        panic!("/dev/urandom: {e}");
    }
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_databases_are_distinct() {
        let cluster = PgCluster::shared();
        let (a, b) = (cluster.database(), cluster.database());
        assert_ne!(a.name, b.name);
        assert_ne!(a.url, b.url);
        let port = cluster.port();
        assert!(
            a.url
                .starts_with(&format!("postgres://bcd@127.0.0.1:{port}/t_")),
            "{}",
            a.url
        );
        assert_eq!(a.psql("SELECT current_database()"), a.name);
        assert_eq!(b.psql("SELECT current_database()"), b.name);
    }

    #[test]
    fn a_table_made_in_one_is_not_in_the_other() {
        let cluster = PgCluster::shared();
        let (a, b) = (cluster.database(), cluster.database());
        a.psql("CREATE TABLE t (x BIGINT); INSERT INTO t VALUES (7)");
        assert_eq!(a.psql("SELECT x FROM t"), "7");
        let count = "SELECT count(*) FROM pg_tables WHERE tablename = 't'";
        assert_eq!(a.psql(count), "1");
        assert_eq!(b.psql(count), "0");
    }

    #[test]
    fn a_dropped_database_is_gone() {
        let cluster = PgCluster::shared();
        let db = cluster.database();
        // An open session does not keep it (WITH (FORCE)).
        db.psql("CREATE TABLE t (x BIGINT)");
        let name = db.name.clone();
        let exists = format!("SELECT count(*) FROM pg_database WHERE datname = '{name}'");
        assert_eq!(cluster.try_psql("postgres", &exists).unwrap(), "1");
        drop(db);
        assert_eq!(cluster.try_psql("postgres", &exists).unwrap(), "0");
    }

    #[test]
    #[should_panic(expected = "relation \"no_such_table\" does not exist")]
    fn psql_panics_with_its_stderr() {
        PgCluster::shared()
            .database()
            .psql("SELECT 1; SELECT * FROM no_such_table");
    }

    #[test]
    fn psql_returns_every_statement_s_output_however_long() {
        let db = PgCluster::shared().database();
        // More than a pipe holds, both ways.
        let values: Vec<String> = (0..20_000).map(|i| format!("({i})")).collect();
        let sql = format!(
            "CREATE TABLE n (i BIGINT); INSERT INTO n VALUES {};\n\
             SELECT count(*) FROM n; SELECT i FROM n ORDER BY i",
            values.join(",")
        );
        let out = db.psql(&sql);
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("20000"));
        assert_eq!(lines.count(), 20_000);
    }

    #[test]
    fn tcp_is_tls_only_with_the_cluster_ca_and_the_password() {
        let cluster = PgCluster::shared();
        let db = cluster.database();
        let tcp = |extra: &str, pgpass: Option<&Path>| {
            let conninfo = format!(
                "{}&sslrootcert={}{extra}",
                db.url,
                cluster.ca_file().display()
            );
            let mut cmd = psql_command(&cluster.bin);
            cmd.args(["-w", "-d", &conninfo]);
            if let Some(p) = pgpass {
                cmd.env("PGPASSFILE", p);
            }
            psql_with(
                &mut cmd,
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            )
        };
        let pgpass = cluster.pgpass_file();
        // verify-full: the certificate chains to ca.crt and names 127.0.0.1.
        assert_eq!(tcp("", Some(&pgpass)).unwrap(), "t");
        let plain = tcp("&sslmode=disable", Some(&pgpass)).unwrap_err();
        assert!(plain.contains("no pg_hba.conf entry"), "{plain}");
        assert!(plain.contains("no encryption"), "{plain}");
        // scram-sha-256: no password, no session; a wrong one neither.
        let none = tcp("", None).unwrap_err();
        assert!(none.contains("no password supplied"), "{none}");
        let wrong = cluster.dir.join(format!("pgpass-wrong-{}", random_hex()));
        std::fs::write(&wrong, "127.0.0.1:*:*:bcd:not-the-password\n").unwrap();
        std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
        let refused = tcp("", Some(&wrong)).unwrap_err();
        assert!(
            refused.contains("password authentication failed"),
            "{refused}"
        );
        assert!(!refused.contains("not-the-password"), "{refused}");
        std::fs::remove_file(&wrong).unwrap();
        // The password file is private.
        let mode = std::fs::metadata(cluster.password_file())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
