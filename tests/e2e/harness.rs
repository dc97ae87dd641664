//! Starts what a test needs and stops it when the test ends.
//!
//! What it gives, one way each:
//! - a control plane: [`ControlPlane::start`] (`init` in a temporary
//!   directory, `serve` on a free 127.0.0.1 port; `start_with_config`,
//!   `start_trusting_test_maker` for TPM joins, `init_only` + `serve_wrapped`,
//!   `restart`, `serve_on`), its CLI ([`ControlPlane::cli`], `json`,
//!   `token`, `events`, `nodes`) and its log (`log`, `wait_for_log`);
//! - a machine: [`Agent::new`] (its own config, data directory and fake
//!   sysfs, no TPM), [`Agent::with_tpm`] / [`Agent::tpm_joined`] with a
//!   [`Swtpm`] (a copy of a manufactured state: [`manufactured`]);
//!   [`Agent::run`] runs bcd, [`Agent::join_with_token`] /
//!   [`Agent::token_join`] join with a 0600 token file, [`Agent::sysfs`]
//!   writes its hardware (product UUID, MACs, DMI);
//! - a process that keeps running: [`Logged`] (its stderr [`Lines`]:
//!   `wait_for(needle, n)`), the one way to wait for what a process says;
//! - deadlines: every command goes through [`output_within`] (`cli`, `run`,
//!   `cmd.within()` for any other [`Command`]; [`Running`] for one that runs
//!   beside the test, reaped if the test fails first), every line wait
//!   through [`Lines::wait_for`], so a hang fails its test showing the output;
//! - refusals: [`ControlPlane::refused_once`] (exactly one more of that
//!   reason by that attestor, aggregated repeats counted), never the newest event row;
//!   `tests/e2e/reasons.rs` names the test of each refusal reason.
//!
//! What it assumes: root (the helper and install tests switch users and
//! mount namespaces), `swtpm`, `swtpm-tools` and `tpm2-tools` installed
//! (`scripts/lib.sh` does it), the workspace's binaries built first
//! (`cargo build --workspace --bins --features bcd/failpoints`), and free
//! ports on 127.0.0.0/8 (each control plane and swtpm binds port 0 or
//! probes). Tests run in parallel: nothing is shared but the manufactured
//! TPM states, which are copied.
//!
//! To add a test: put it in the module of what it tests (or a new module in
//! `main.rs`, behind `#[cfg(feature = "failpoints")]` if it moves the clock
//! with `BCD_CLOCK_OFFSET`, fakes sysfs or uses `BCD_FAILPOINT`), start what
//! it needs from here, move clocks (`clock set`, `BCD_CLOCK_OFFSET`) rather
//! than wait, and check what the processes decided and logged, never how
//! long they took (timing is proven on tokio's paused clock in unit tests;
//! figures belong in `scripts/bench`). A new refusal reason needs its row
//! in `tests/e2e/reasons.rs`.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

use crate::pg_cluster::{PgCluster, PgDb};

/// Path of a workspace binary: next to `bcd`, which Cargo built for us.
/// `BCD_TEST_BCD` names another `bcd` to run instead (scripts/test runs
/// every module that needs no failpoint again with the release bcd taken
/// out of the .deb users install).
pub(crate) fn bin(name: &str) -> PathBuf {
    let bcd = PathBuf::from(env!("CARGO_BIN_EXE_bcd"));
    let path = match std::env::var_os("BCD_TEST_BCD") {
        Some(other) if name == "bcd" => PathBuf::from(other),
        _ => bcd.with_file_name(name),
    };
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` before the tests (scripts/test does)",
        path.display()
    );
    path
}

/// How long a test waits for one command it runs: far more than any command
/// takes on a loaded 2-core machine, far less than CI's limit.
pub(crate) const DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs `cmd` to completion like [`Command::output`], but kills it (SIGKILL)
/// and fails the test, showing what it printed, if it is still running
/// after `deadline`.
#[track_caller]
pub(crate) fn output_within(
    mut cmd: impl std::borrow::BorrowMut<Command>,
    deadline: std::time::Duration,
) -> Output {
    let cmd = cmd.borrow_mut();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    wait_within(child, deadline, &format!("{cmd:?}"))
}

/// Waits for `child` to end and collects what it printed; kills it
/// (SIGKILL) and fails the test if it still runs after `deadline`.
#[track_caller]
fn wait_within(child: Child, deadline: std::time::Duration, what: &str) -> Output {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (done, finished) = channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let timed_out = finished.recv_timeout(deadline) == Err(RecvTimeoutError::Timeout);
        if timed_out {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        timed_out
    });
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("waiting for {what}: {e}"));
    let _ = done.send(());
    let timed_out = watchdog.join().unwrap_or(false);
    assert!(
        !timed_out,
        "{what} still ran after {deadline:?} and was killed\nstdout: {}\nstderr: {}",
        stdout(&out),
        stderr(&out)
    );
    out
}

/// A command that runs beside the test (a join that waits for an operator,
/// say): [`Running::output`] waits for it under [`DEADLINE`], and a test
/// that fails before then kills and reaps it as the guard drops.
pub(crate) struct Running {
    child: Option<Child>,
    what: String,
}

impl Running {
    /// Starts `cmd` with stdin closed, stdout and stderr captured unless
    /// `cmd` already sends them elsewhere.
    #[track_caller]
    pub(crate) fn start(cmd: &mut Command) -> Running {
        Running::spawn(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()))
    }

    /// Starts `cmd` as it is configured (stdin closed).
    #[track_caller]
    pub(crate) fn spawn(cmd: &mut Command) -> Running {
        Running::spawn_with_stdin(cmd.stdin(Stdio::null()))
    }

    /// Starts `cmd` as it is configured, stdin too ([`Running::stdin`]).
    #[track_caller]
    pub(crate) fn spawn_with_stdin(cmd: &mut Command) -> Running {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Running {
            child: Some(child),
            what: format!("{cmd:?}"),
        }
    }

    /// Its stdin, if piped (drop it to close it).
    pub(crate) fn stdin(&mut self) -> Option<std::process::ChildStdin> {
        self.child.as_mut().expect("running").stdin.take()
    }

    /// Its process id.
    pub(crate) fn id(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Whether it has ended (without collecting its output).
    pub(crate) fn has_ended(&mut self) -> bool {
        let child = self.child.as_mut().expect("running");
        child.try_wait().expect("try_wait").is_some()
    }

    /// Waits for it to end (killed, failing the test, after [`DEADLINE`]).
    #[track_caller]
    pub(crate) fn output(mut self) -> Output {
        let child = self.child.take().expect("running");
        wait_within(child, DEADLINE, &self.what)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `cmd.within()` in place of `cmd.output()`: the same (stdin closed,
/// stdout and stderr captured), under [`DEADLINE`] ([`output_within`]).
pub(crate) trait Within {
    fn within(&mut self) -> Output;
}

impl Within for Command {
    #[track_caller]
    fn within(&mut self) -> Output {
        output_within(self.stdin(Stdio::null()), DEADLINE)
    }
}

pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
pub(crate) fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "expected success, got {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
}

/// A reference control plane: `bc-controlplane init` into a temporary
/// directory, then `serve` on 127.0.0.1 port 0. Killed on drop.
pub(crate) struct ControlPlane {
    pub dir: tempfile::TempDir,
    pub url: String,
    child: Option<Child>,
    /// The running `serve`'s log lines, as `serve.log` grows.
    lines: Option<Lines>,
    /// The PostgreSQL database `[database]` names (a fresh one per control
    /// plane, shared by its replicas), or `None` on SQLite. Dropped with the
    /// handle, after `serve` is killed.
    pub pg: Option<std::sync::Arc<PgDb>>,
}

/// The store a control plane runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    /// `DIR/controlplane.db`.
    Sqlite,
    /// A fresh database on the test process's PostgreSQL server.
    Postgres,
}

impl Backend {
    /// SQLite, or PostgreSQL for every control plane of the run when
    /// `BCD_TEST_DB=postgres` (the variable the unit tests read too).
    pub(crate) fn from_env() -> Self {
        match std::env::var("BCD_TEST_DB").as_deref() {
            Ok("postgres") => Backend::Postgres,
            _ => Backend::Sqlite,
        }
    }
}

/// The `[database]` table naming `pg` (TLS verified against the cluster's
/// CA, the password from the cluster's 0600 file; a small pool: tests run
/// several control planes at once on a server that takes 200 sessions).
pub(crate) fn database_toml(pg: &PgDb) -> String {
    format!(
        "\n[database]\nurl = {:?}\nca_file = {:?}\npassword_file = {:?}\nmax_connections = 6\n",
        pg.url,
        PgCluster::shared().ca_file(),
        pg.password_file
    )
}

impl ControlPlane {
    pub(crate) fn start() -> Self {
        ControlPlane::init_only().serve()
    }

    /// Like [`ControlPlane::start`], on `backend` whatever `BCD_TEST_DB` says.
    pub(crate) fn start_on(backend: Backend) -> Self {
        ControlPlane::init_only_on(backend).serve()
    }

    /// Like [`ControlPlane::start`], with `controlplane.toml` written first.
    pub(crate) fn start_with_config(toml: &str) -> Self {
        ControlPlane::start_with_config_on(Backend::from_env(), toml)
    }

    /// Like [`ControlPlane::start_with_config`], on `backend`.
    pub(crate) fn start_with_config_on(backend: Backend, toml: &str) -> Self {
        let cp = ControlPlane::init_only_on(backend);
        cp.write_config(toml);
        cp.serve()
    }

    /// Replaces `controlplane.toml` with `toml`, plus the `[database]` table
    /// of this control plane's PostgreSQL database if it has one.
    pub(crate) fn write_config(&self, toml: &str) {
        let mut text = toml.to_owned();
        if let Some(pg) = &self.pg {
            text.push_str(&database_toml(pg));
        }
        std::fs::write(self.path().join("controlplane.toml"), text)
            .expect("write controlplane.toml");
    }

    /// A control plane that trusts the test TPM maker (its root as the
    /// anchor, its issuing CA as a configured intermediate, `ek-roots add
    /// --intermediate`, since the manufactured TPMs carry none in NV) and asks
    /// pending machines to come back after a second.
    pub(crate) fn start_trusting_test_maker() -> Self {
        ControlPlane::start_trusting_test_maker_with("")
    }

    /// Like [`ControlPlane::start_trusting_test_maker`], with more TOML
    /// after the `[tpm]` table (e.g. a `[tpm.pcr_policy]`).
    pub(crate) fn start_trusting_test_maker_with(extra: &str) -> Self {
        ControlPlane::start_trusting_test_maker_on(Backend::from_env(), extra)
    }

    /// Like [`ControlPlane::start_trusting_test_maker_with`], on `backend`.
    pub(crate) fn start_trusting_test_maker_on(backend: Backend, extra: &str) -> Self {
        let cp = ControlPlane::start_with_config_on(
            backend,
            &format!("[tpm]\nenrollment_retry_after = \"1s\"\n{extra}"),
        );
        assert_ok(&cp.cli(&["ek-roots", "add", &fixture("ek-root.pem")]));
        assert_ok(&cp.cli(&[
            "ek-roots",
            "add",
            "--intermediate",
            &fixture("ek-intermediate.pem"),
        ]));
        cp
    }

    /// An initialised directory without a server, for CLI-only tests and for
    /// an in-process server.
    pub(crate) fn init_only() -> Self {
        ControlPlane::init_only_on(Backend::from_env())
    }

    /// Like [`ControlPlane::init_only`], on `backend`: PostgreSQL gets a
    /// fresh database, named in `controlplane.toml` before `init` opens it.
    pub(crate) fn init_only_on(backend: Backend) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let pg = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(std::sync::Arc::new(PgCluster::shared().database())),
        };
        let cp = ControlPlane {
            dir,
            url: String::new(),
            child: None,
            lines: None,
            pg,
        };
        cp.write_config("");
        assert_ok(&cp.cli(&["init"]));
        cp
    }

    /// Stops the server and starts it again on the same DIR (a new port:
    /// point agents at the new `url`). The log continues.
    pub(crate) fn restart(mut self) -> Self {
        self.stop();
        self.serve()
    }

    /// Like [`ControlPlane::start`], with `serve` run under `wrapper` (e.g.
    /// `["prlimit", "--nofile=1024:1024", "--"]`).
    pub(crate) fn start_wrapped(wrapper: &[&str]) -> Self {
        ControlPlane::init_only().serve_wrapped(wrapper)
    }

    fn serve(self) -> Self {
        self.serve_wrapped(&[])
    }

    /// Like [`ControlPlane::start_with_config`], for a config that names
    /// the server's own URL (e.g. `[cloud_iid] audience`): `toml` gets the
    /// URL it will listen on (a port picked free just before).
    #[cfg(feature = "failpoints")]
    pub(crate) fn start_with_config_for_url(toml: impl FnOnce(&str) -> String) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let cp = ControlPlane::init_only();
        let url = format!("https://127.0.0.1:{port}");
        cp.write_config(&toml(&url));
        let cp = cp.spawn_serve(&[], &format!("127.0.0.1:{port}"));
        assert_eq!(cp.url, url);
        cp
    }

    /// Starts `serve` on an initialized directory, under `wrapper`. The log
    /// continues across restarts.
    pub(crate) fn serve_wrapped(self, wrapper: &[&str]) -> Self {
        self.spawn_serve(wrapper, "127.0.0.1:0")
    }

    /// Starts `serve` again on this directory, on `listen` (e.g. the address
    /// it had before [`ControlPlane::stop`], for agents configured with it).
    #[cfg(feature = "failpoints")]
    pub(crate) fn serve_on(mut self, listen: &str) -> Self {
        self.stop();
        self.spawn_serve(&[], listen)
    }

    fn spawn_serve(self, wrapper: &[&str], listen: &str) -> Self {
        self.start_serve(wrapper, listen).listening()
    }

    /// Starts `serve` on this directory, under `wrapper`, without waiting
    /// for it to listen ([`Starting::listening`] does).
    fn start_serve(mut self, wrapper: &[&str], listen: &str) -> Starting {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path().join("serve.log"))
            .expect("log file");
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let mut command = match wrapper.split_first() {
            None => Command::new(bin("bc-controlplane")),
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin("bc-controlplane"));
                c
            }
        };
        let mut child = command
            .args(["serve", "--dir"])
            .arg(self.path())
            .args(["--listen", listen])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn bc-controlplane serve");
        // stderr goes straight to serve.log, so that `log()` has every line
        // written so far; `wait_for_log` follows the file from here.
        self.lines = Some(Lines::follow(self.path().join("serve.log"), log_start));
        let out = Lines::read(child.stdout.take().expect("stdout"));
        self.child = Some(child);
        Starting { cp: self, out }
    }

    /// Waits for the `n`th line of the running `serve`'s log containing
    /// `needle` (lines since it started), and returns it.
    #[track_caller]
    pub(crate) fn wait_for_log(&mut self, needle: &str, n: usize) -> String {
        self.lines
            .as_mut()
            .expect("serve is running")
            .wait_for(needle, n)
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `sql` (statements with no parameters) on this control plane's
    /// database, SQLite file or PostgreSQL: a test's way to set up what no
    /// command of the control plane would.
    pub(crate) fn sql(&self, sql: &str) {
        match &self.pg {
            Some(pg) => {
                pg.psql(sql);
            }
            None => {
                let db = rusqlite::Connection::open(self.path().join("controlplane.db")).unwrap();
                db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
                db.execute_batch(sql).unwrap();
            }
        }
    }

    /// `bytes` as a literal of the backend's blob type, for [`Self::sql`].
    pub(crate) fn blob_literal(&self, bytes: &[u8]) -> String {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        match self.pg {
            Some(_) => format!("'\\x{hex}'::bytea"),
            None => format!("X'{hex}'"),
        }
    }

    /// The `serve` process (for `/proc/<pid>/status`).
    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("serve is running").id()
    }

    /// The server's log (stderr).
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("serve.log")).unwrap_or_default()
    }

    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        let (cmd, rest) = split_command(args);
        let mut command = Command::new(bin("bc-controlplane"));
        command
            .args(cmd)
            .arg("--dir")
            .arg(self.path())
            .args(rest)
            .stdin(Stdio::null());
        output_within(command, DEADLINE)
    }

    /// `token create`: returns the token text.
    pub(crate) fn token(&self, role: &str, extra: &[&str]) -> String {
        let mut args = vec!["token", "create", "--role", role];
        args.extend_from_slice(extra);
        let out = self.cli(&args);
        assert_ok(&out);
        let text = stdout(&out);
        assert_eq!(
            text.lines().count(),
            1,
            "token create prints the token and nothing else: {text:?}"
        );
        text.trim().to_owned()
    }

    pub(crate) fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let out = self.cli(&args);
        assert_ok(&out);
        serde_json::from_slice(&out.stdout).expect("JSON output")
    }

    pub(crate) fn events(&self) -> Vec<Value> {
        self.json(&["events", "list"])
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn refusals(&self) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["type"] == "security.join.refused")
            .collect()
    }

    /// The refusal reasons stored so far, oldest first. Repeats within a
    /// minute are one aggregated event (`data.count`): it counts as many.
    pub(crate) fn refusal_reasons(&self) -> Vec<String> {
        self.refusals()
            .iter()
            .flat_map(|e| {
                let n = e["data"]["count"].as_u64().unwrap_or(1) as usize;
                std::iter::repeat_n(e["reason"].as_str().unwrap_or_default().to_owned(), n)
            })
            .collect()
    }

    /// The newest join refusal event with this reason (for its token,
    /// node or attestor; [`ControlPlane::refused_once`] says it happened).
    #[track_caller]
    pub(crate) fn refusal(&self, reason: &str) -> Value {
        self.refusals()
            .into_iter()
            .rfind(|e| e["reason"] == reason)
            .unwrap_or_else(|| panic!("no {reason:?} refusal"))
    }

    /// Every refusal counted so far, by (event type, reason): an
    /// aggregated event counts its `data.count`.
    pub(crate) fn refusal_counts(&self) -> std::collections::BTreeMap<(String, String), u64> {
        let mut counts = std::collections::BTreeMap::new();
        for e in self.events() {
            let kind = e["type"].as_str().unwrap_or_default();
            if REFUSAL_EVENTS.contains(&kind) {
                let key = (
                    kind.to_owned(),
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                );
                *counts.entry(key).or_insert(0) += e["data"]["count"].as_u64().unwrap_or(1);
            }
        }
        counts
    }

    /// Every refusal counted so far, by (event type, attestor, reason): an
    /// aggregated event counts its `data.count`. Renewal and site refusals
    /// have no attestor (`""`).
    fn refusal_tally(&self) -> std::collections::BTreeMap<(String, String, String), u64> {
        let mut counts = std::collections::BTreeMap::new();
        for e in self.events() {
            let kind = e["type"].as_str().unwrap_or_default();
            if REFUSAL_EVENTS.contains(&kind) {
                let key = (
                    kind.to_owned(),
                    e["attestor"].as_str().unwrap_or_default().to_owned(),
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                );
                *counts.entry(key).or_insert(0) += e["data"]["count"].as_u64().unwrap_or(1);
            }
        }
        counts
    }

    /// Runs `f` (what should be refused) and asserts that the control plane
    /// counted exactly one refusal meanwhile: `reason`, as `refusal` (a join
    /// refused by that attestor, a renewal, a site call). The way to check a
    /// refusal's reason: the newest event row proves nothing, since repeats
    /// within a minute grow the count of an older row.
    #[track_caller]
    pub(crate) fn refused_once<T>(
        &self,
        refusal: Refusal<'_>,
        reason: &str,
        f: impl FnOnce() -> T,
    ) -> T {
        let before = self.refusal_tally();
        let out = f();
        let mut expected = before.clone();
        let (event, attestor) = refusal.event();
        *expected
            .entry((event.to_owned(), attestor.to_owned(), reason.to_owned()))
            .or_insert(0) += 1;
        let after = self.refusal_tally();
        assert_eq!(
            after, expected,
            "expected exactly one more {event} {reason:?} by {attestor:?} (before: {before:?})"
        );
        out
    }

    /// POSTs `body` to `path` over HTTPS (the server pinned by its TLS CA)
    /// without a client certificate, which bcd's own client never does for
    /// an mTLS call: the answer's status and its `Error` message, which
    /// must be ACCESS_DENIED.
    #[cfg(feature = "failpoints")]
    pub(crate) fn post_without_client_certificate(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> (u16, String) {
        let ca = std::fs::read(self.path().join("tls-ca.pem")).expect("tls-ca.pem");
        let ca = ::pem::parse(ca).expect("TLS CA PEM").into_contents();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls::pki_types::CertificateDer::from(ca))
            .expect("TLS CA");
        let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .timeout(DEADLINE)
            .build()
            .expect("client");
        let url = format!("{}{path}", self.url);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let resp = client
                .post(url)
                .header("content-type", "application/x-protobuf")
                .body(body)
                .send()
                .await
                .expect("an answer");
            let status = resp.status().as_u16();
            let body = resp.bytes().await.expect("the answer's body");
            let err =
                <bc_wire::agent::Error as prost::Message>::decode(body.as_ref()).expect("an Error");
            assert_eq!(
                err.code,
                bc_wire::agent::Code::AccessDenied as i32,
                "{err:?}"
            );
            (status, err.message)
        })
    }

    pub(crate) fn nodes(&self) -> Vec<Value> {
        self.json(&["nodes", "list"])
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The agent config `agent-config` prints, for a data dir.
    pub(crate) fn agent_config(&self, data_dir: &Path) -> String {
        // A directory without a server gets an address nothing listens on.
        let api = if self.url.is_empty() {
            "https://127.0.0.1:1"
        } else {
            &self.url
        };
        let out = self.cli(&[
            "agent-config",
            "--api",
            api,
            "--data-dir",
            &data_dir.to_string_lossy(),
        ]);
        assert_ok(&out);
        stdout(&out)
    }

    /// Another `serve` on the same database: DIR copied (keys, certificates,
    /// `controlplane.toml`; not `controlplane.db`, not `serve.log`) to a new
    /// temporary directory, served there on its own port. A replica needs a
    /// shared database: this control plane must be on PostgreSQL.
    pub(crate) fn replica(&self) -> ControlPlane {
        self.replica_dir().serve()
    }

    /// A replica's directory and handle, not serving yet.
    fn replica_dir(&self) -> ControlPlane {
        let pg = self
            .pg
            .clone()
            .expect("a replica shares its database: start the control plane on PostgreSQL");
        let dir = tempfile::tempdir().expect("tempdir");
        copy_dir(self.path(), dir.path());
        ControlPlane {
            dir,
            url: String::new(),
            child: None,
            lines: None,
            pg: Some(pg),
        }
    }

    /// `n` replicas ([`ControlPlane::replica`]) whose `serve` processes are
    /// all started before any is waited for: they start at once (e.g. their
    /// event writers prune together).
    pub(crate) fn replicas(&self, n: usize) -> Vec<ControlPlane> {
        let starting: Vec<Starting> = (0..n)
            .map(|_| self.replica_dir().start_serve(&[], "127.0.0.1:0"))
            .collect();
        starting.into_iter().map(Starting::listening).collect()
    }

    /// `kill -9` of `serve` (no shutdown, no flush of anything it holds),
    /// and its exit. The handle keeps DIR and its log.
    pub(crate) fn kill9(&mut self) {
        // Child::kill is SIGKILL.
        self.stop();
    }

    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.lines = None;
    }
}

/// A control plane whose `serve` was started and may not listen yet.
struct Starting {
    cp: ControlPlane,
    /// `serve`'s stdout, whose first line says where it listens.
    out: Lines,
}

impl Starting {
    /// Waits for `serve`'s first stdout line, no sleeping, and takes the URL
    /// it names.
    fn listening(mut self) -> ControlPlane {
        let first = self.out.next_line(DEADLINE);
        let url = first
            .as_deref()
            .and_then(|l| l.trim().strip_prefix("listening on "))
            .map(str::to_owned);
        match url {
            Some(url) => {
                self.cp.url = url;
                self.cp
            }
            None => {
                if let Some(child) = self.cp.child.as_mut() {
                    let _ = child.kill();
                }
                panic!(
                    "serve's first line is {first:?}, not \"listening on …\"; log: {}",
                    self.cp.log()
                )
            }
        }
    }
}

/// What a replica leaves out of DIR: the SQLite file (a replica shares the
/// PostgreSQL database) and the other process's log.
const NOT_REPLICATED: [&str; 4] = [
    "controlplane.db",
    "controlplane.db-wal",
    "controlplane.db-shm",
    "serve.log",
];

/// Copies `from` into the existing `to`, files and directories, modes kept.
fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read DIR") {
        let entry = entry.expect("a DIR entry");
        let name = entry.file_name();
        if NOT_REPLICATED.iter().any(|n| name == *n) {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        let kind = entry.file_type().expect("file type");
        if kind.is_dir() {
            std::fs::create_dir(&dst).expect("mkdir in the replica");
            std::fs::set_permissions(&dst, entry.metadata().expect("stat").permissions())
                .expect("chmod in the replica");
            copy_dir(&src, &dst);
        } else if kind.is_file() {
            // fs::copy keeps the mode (0600 keys stay 0600).
            std::fs::copy(&src, &dst).expect("copy into the replica");
        }
    }
}

/// How long a test waits for a line a process prints.
pub(crate) const LINE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// The lines a process writes to a pipe (or to a log file), as they come,
/// read by a thread, and those seen so far: the one way a test waits for
/// what a process says, never by sleeping.
pub(crate) struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
    /// Every line received so far, in order.
    pub seen: Vec<String>,
    /// Ends a [`Lines::follow`] thread.
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Lines {
    /// The lines of `pipe` until its end.
    pub(crate) fn read(pipe: impl std::io::Read + Send + 'static) -> Lines {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
            stop: Default::default(),
        }
    }

    /// The lines appended to the file at `path` after byte `from`, as a
    /// process writes them there (its stderr opened on the file, which
    /// keeps the file whole for readers of it): looked at every 10 ms.
    pub(crate) fn follow(path: PathBuf, from: u64) -> Lines {
        use std::io::{Read as _, Seek as _};
        use std::sync::atomic::Ordering;
        let (tx, rx) = std::sync::mpsc::channel();
        let stop: std::sync::Arc<std::sync::atomic::AtomicBool> = Default::default();
        let stopped = stop.clone();
        std::thread::spawn(move || {
            let Ok(mut file) = std::fs::File::open(&path) else {
                return;
            };
            if file.seek(std::io::SeekFrom::Start(from)).is_err() {
                return;
            }
            let mut partial = Vec::new();
            let mut buf = [0u8; 8192];
            while !stopped.load(Ordering::Relaxed) {
                match file.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                        continue;
                    }
                    Ok(n) => partial.extend_from_slice(&buf[..n]),
                }
                while let Some(end) = partial.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = partial.drain(..=end).collect();
                    let line = String::from_utf8_lossy(&line[..end]).into_owned();
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
            stop,
        }
    }

    /// The next line, if one comes within `deadline` (None at the end).
    pub(crate) fn next_line(&mut self, deadline: std::time::Duration) -> Option<String> {
        let line = self.rx.recv_timeout(deadline).ok()?;
        self.seen.push(line.clone());
        Some(line)
    }

    /// Waits (at most [`LINE_DEADLINE`]) until `n` lines contain `needle`;
    /// returns the `n`th. Fails showing every line seen.
    #[track_caller]
    pub(crate) fn wait_for(&mut self, needle: &str, n: usize) -> String {
        let deadline = std::time::Instant::now() + LINE_DEADLINE;
        loop {
            if let Some(l) = self.seen.iter().filter(|l| l.contains(needle)).nth(n - 1) {
                return l.clone();
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(e) => panic!(
                    "no {n}× {needle:?} within {LINE_DEADLINE:?} ({e}); the lines were:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// How many lines so far (without waiting) contain `needle`.
    #[cfg(feature = "failpoints")]
    pub(crate) fn count(&mut self, needle: &str) -> usize {
        while let Ok(line) = self.rx.try_recv() {
            self.seen.push(line);
        }
        self.seen.iter().filter(|l| l.contains(needle)).count()
    }

    /// Takes every line up to the end of the pipe (the process ended), for
    /// at most 10 s (a child that inherited the pipe may hold it open).
    pub(crate) fn drain(&mut self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => return,
            }
        }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A process a test keeps running and waits on the stderr lines of
/// ([`Lines`], through `Deref`: `wait_for`, `count`, `seen`). Killed on drop.
pub(crate) struct Logged {
    pub child: Child,
    lines: Lines,
}

impl Logged {
    /// Starts `cmd` with stderr piped (stdout to /dev/null).
    pub(crate) fn spawn(mut cmd: Command) -> Logged {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let lines = Lines::read(child.stderr.take().expect("stderr"));
        Logged { child, lines }
    }

    /// SIGTERM, as systemd stops a service, and its exit.
    pub(crate) fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }

    /// SIGKILL, then every line it wrote before.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.lines.drain();
    }
}

impl std::ops::Deref for Logged {
    type Target = Lines;
    fn deref(&self) -> &Lines {
        &self.lines
    }
}

impl std::ops::DerefMut for Logged {
    fn deref_mut(&mut self) -> &mut Lines {
        &mut self.lines
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The event a refused join is recorded as (`attestor` and `reason`).
pub(crate) const JOIN_REFUSED: &str = "security.join.refused";
/// A refused renewal.
pub(crate) const RENEW_REFUSED: &str = "security.renew.refused";
/// A refused site API call (lease, SecretRequest, boot entries).
pub(crate) const SITE_REFUSED: &str = "security.site.refused";
const REFUSAL_EVENTS: [&str; 3] = [JOIN_REFUSED, RENEW_REFUSED, SITE_REFUSED];

/// A refusal [`ControlPlane::refused_once`] looks for: its event type and,
/// for a join, the attestor that refused it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Refusal<'a> {
    /// A join refused by this attestor (`x509pop`, `tpm`, `join-token`...).
    Join(&'a str),
    /// A refused renewal (no attestor).
    Renew,
    /// A refused site API call (no attestor).
    #[cfg(feature = "failpoints")]
    Site,
}

impl<'a> Refusal<'a> {
    /// (event type, attestor or `""`).
    fn event(self) -> (&'static str, &'a str) {
        match self {
            Refusal::Join(attestor) => (JOIN_REFUSED, attestor),
            Refusal::Renew => (RENEW_REFUSED, ""),
            #[cfg(feature = "failpoints")]
            Refusal::Site => (SITE_REFUSED, ""),
        }
    }
}

/// `["token", "create", "--role", "node"]` → (`token create`, rest): the
/// subcommand words come before `--dir`.
fn split_command<'a>(args: &'a [&'a str]) -> (&'a [&'a str], &'a [&'a str]) {
    let n = args.iter().take_while(|a| !a.starts_with('-')).count();
    let n = match args.first() {
        Some(&"token") | Some(&"nodes") | Some(&"events") | Some(&"clock") | Some(&"requests")
        | Some(&"resolve") | Some(&"pools") | Some(&"ek-roots") | Some(&"sites")
        | Some(&"boot") | Some(&"dist") | Some(&"commands") | Some(&"images")
        | Some(&"tenants") | Some(&"leases") => n.min(2),
        Some(&"cloud") | Some(&"workflows") => n.min(3),
        _ => n.min(1),
    };
    args.split_at(n)
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A machine with bcd: its own config file and data directory.
pub(crate) struct Agent {
    pub root: tempfile::TempDir,
    pub config: PathBuf,
    pub data_dir: PathBuf,
}

impl Agent {
    /// A machine without a TPM, whatever this host has (`[tpm] tcti = "none"`).
    pub(crate) fn new(cp: &ControlPlane) -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let data_dir = root.path().join("data");
        let config = root.path().join("config.toml");
        let text = format!("{}\n[tpm]\ntcti = \"none\"\n", cp.agent_config(&data_dir));
        std::fs::write(&config, text).expect("write config");
        Agent {
            root,
            config,
            data_dir,
        }
    }

    /// Gives this machine this TPM from now on (a TPM it did not have, or
    /// another one): `[tpm] tcti` names the swtpm.
    pub(crate) fn set_tpm(&self, tpm: &Swtpm) {
        let config = std::fs::read_to_string(&self.config).expect("config");
        let mut replaced = false;
        let lines: Vec<String> = config
            .lines()
            .map(|l| {
                if l.starts_with("tcti = ") {
                    replaced = true;
                    format!("tcti = \"{}\"", tpm.tcti())
                } else {
                    l.to_owned()
                }
            })
            .collect();
        assert!(replaced, "the config has a [tpm] tcti line");
        std::fs::write(&self.config, lines.join("\n") + "\n").expect("write config");
    }

    /// Points this machine at another control plane URL (`api`).
    pub(crate) fn set_api(&self, url: &str) {
        let config = std::fs::read_to_string(&self.config).expect("config");
        let mut replaced = false;
        let lines: Vec<String> = config
            .lines()
            .map(|l| {
                if l.starts_with("api = ") {
                    replaced = true;
                    format!("api = \"{url}\"")
                } else {
                    l.to_owned()
                }
            })
            .collect();
        assert!(replaced, "the config has an api line");
        std::fs::write(&self.config, lines.join("\n") + "\n").expect("write config");
    }

    pub(crate) fn with_config(text: &str) -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let data_dir = root.path().join("data");
        let config = root.path().join("config.toml");
        std::fs::write(&config, text).expect("write config");
        Agent {
            root,
            config,
            data_dir,
        }
    }

    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("bcd"));
        cmd.args(args)
            .arg("--config")
            .arg(&self.config)
            .env_remove("BCD_JOIN_TOKEN")
            // Only a TPM the test names: never the machine's, never the caller's.
            .env_remove("TPM2TOOLS_TCTI")
            .env_remove("TCTI")
            .env("TSS2_LOG", "all+none")
            // Its own hardware (product UUID, MACs) under a fake sysfs that
            // a test may fill ([`Agent::sysfs`]; failpoints builds only; empty
            // by default), so that no two test machines claim this host's
            // product UUID.
            .env("BCD_SYSFS_ROOT", self.sysfs_root())
            .stdin(Stdio::null());
        cmd
    }

    pub(crate) fn run(&self, args: &[&str]) -> Output {
        output_within(self.command(args), DEADLINE)
    }

    /// A machine that joined with a token while the control plane's clock
    /// was `offset` (e.g. `-9d`) away, then put back: its certificate is as
    /// old as that, expired by now for an offset past -24h.
    pub(crate) fn joined_at_offset(cp: &ControlPlane, offset: &str) -> Self {
        assert_ok(&cp.cli(&["clock", "set", "--offset", offset]));
        let agent = Agent::new(cp);
        assert_ok(&agent.join_with_token(&cp.token("node", &[])));
        assert_ok(&cp.cli(&["clock", "set", "--offset", "0s"]));
        agent
    }

    /// `/proc/<pid>/environ` of `bcd ARGS` (with `envs`) once it connects to
    /// its control plane: the config is pointed at a listener that accepts
    /// and never answers, which keeps bcd running, past reading its
    /// environment, while the test looks. bcd is then killed.
    pub(crate) fn environ_at_connect(&self, args: &[&str], envs: &[(&str, &str)]) -> String {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        self.set_api(&format!("https://{}", silent.local_addr().expect("addr")));
        // Killed and reaped when this returns or fails.
        let mut child = Running::spawn(
            self.command(args)
                .envs(envs.iter().copied())
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        );
        silent.set_nonblocking(true).expect("nonblocking");
        let connected = wait_for(|| match silent.accept() {
            Ok((conn, _)) => Some(Ok(conn)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                child.has_ended().then_some(Err(()))
            }
            Err(e) => panic!("accept: {e}"),
        });
        let Ok(_conn) = connected else {
            panic!("bcd exited before connecting: {}", stderr(&child.output()));
        };
        let environ = std::fs::read(format!("/proc/{}/environ", child.id()));
        String::from_utf8_lossy(&environ.expect("read environ")).into_owned()
    }

    /// bcd's client, calling with a certificate for `uri` and a fresh key,
    /// issued with the node CA's own key: what only someone holding that key
    /// could forge, so that the site API's own checks are what refuses it.
    #[cfg(feature = "failpoints")]
    pub(crate) fn client_with_forged_certificate(
        &self,
        cp: &ControlPlane,
        uri: &str,
    ) -> bcd::client::Client {
        let ca_pem = std::fs::read_to_string(cp.path().join("node-ca.pem")).unwrap();
        let ca_key = std::fs::read_to_string(cp.path().join("node-ca.key")).unwrap();
        let issuer =
            rcgen::Issuer::from_ca_cert_pem(&ca_pem, rcgen::KeyPair::from_pem(&ca_key).unwrap())
                .unwrap();
        let key = bcd::keys::FileKey::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = vec![rcgen::SanType::URI(uri.try_into().unwrap())];
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        p.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
        p.not_after = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
        let spki =
            rcgen::SubjectPublicKeyInfo::from_der(bcd::keys::NodeKey::spki_der(&key)).unwrap();
        let leaf = p.signed_by(&spki, &issuer).unwrap().der().to_vec();
        let ca_der = ::pem::parse(ca_pem).unwrap().into_contents();
        let config = bcd::config::Config::load(&self.config).unwrap();
        bcd::client::Client::with_identity(&config, &[leaf, ca_der], std::sync::Arc::new(key))
            .unwrap()
    }

    /// Writes `token` into this machine's 0600 token file; its path, for
    /// `--token-file`.
    pub(crate) fn token_file(&self, token: &str) -> String {
        let file = self.root.path().join("token");
        std::fs::write(&file, token).expect("write token file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        file.to_string_lossy().into_owned()
    }

    /// `bcd join ARGS --token-file F` with `token` in the 0600 file: the
    /// one token-file join, as a command to add environment to and run with
    /// [`output_within`] (or [`Agent::join_with_token`] for a plain one).
    pub(crate) fn token_join(&self, token: &str, args: &[&str]) -> Command {
        let file = self.token_file(token);
        let mut all = vec!["join"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--token-file", &file]);
        self.command(&all)
    }

    /// `bcd join --token-file F` with the token in a 0600 file.
    pub(crate) fn join_with_token(&self, token: &str) -> Output {
        output_within(self.token_join(token, &[]), DEADLINE)
    }

    /// Writes `text` at `rel` (e.g. `class/dmi/id/product_uuid`) in this
    /// machine's fake sysfs: the one every bcd command of it reads
    /// (`BCD_SYSFS_ROOT`, honoured by failpoints builds only), empty until
    /// a test writes there.
    #[cfg(feature = "failpoints")]
    pub(crate) fn sysfs(&self, rel: &str, text: &str) {
        let path = self.sysfs_root().join(rel);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir in the fake sysfs");
        std::fs::write(path, text).expect("write in the fake sysfs");
    }

    /// The fake sysfs's root.
    pub(crate) fn sysfs_root(&self) -> PathBuf {
        self.root.path().join("sys")
    }

    pub(crate) fn status_json(&self) -> Value {
        let out = self.run(&["status", "--json"]);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("status --json: {e}: {}", stdout(&out)))
    }

    /// Names in the data directory (empty when it does not exist).
    pub(crate) fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = match std::fs::read_dir(&self.data_dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        names
    }

    #[track_caller]
    pub(crate) fn assert_nothing_written(&self) {
        let files = self.files();
        assert!(
            !files
                .iter()
                .any(|f| f == "identity.json" || f == "node.key"),
            "no identity may be written, found {files:?}"
        );
    }
}

/// Polls `f` until it yields, for at most 30 s: the thing waited on is a
/// row another process writes (a join request a waiting join filed).
#[track_caller]
pub(crate) fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "timed out");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[track_caller]
pub(crate) fn assert_access_denied(out: &Output) {
    assert!(
        !out.status.success(),
        "expected a refusal, got success: {}",
        stdout(out)
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(out).to_lowercase();
    assert!(
        err.contains("access denied"),
        "expected an access-denied message, got: {err}"
    );
}

/// A renewal the control plane refused, as `bcd node --once` ends: exit
/// code 1 and the refusal named on stderr (ACCESS_DENIED's message).
#[track_caller]
pub(crate) fn assert_renew_refused(out: &Output) {
    assert_eq!(out.status.code(), Some(1), "{}", stderr(out));
    assert!(
        stderr(out).contains("renewal refused by the control plane (Renew refused)"),
        "{}",
        stderr(out)
    );
}

/// The URI SANs of a DER certificate, in order.
pub(crate) fn uri_sans(der: &[u8]) -> Vec<String> {
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(der).expect("certificate");
    cert.subject_alternative_name()
        .expect("SAN")
        .expect("SAN present")
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
        .collect()
}

/// The workspace root, where `tpmsim-fixtures/` lives.
pub(crate) fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file in tpmsim-fixtures/.
pub(crate) fn fixture(name: &str) -> String {
    workspace()
        .join("tpmsim-fixtures")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// A manufactured swtpm state, made once per test run and copied for each
/// swtpm: `manufacture` takes ~0.6 s, a copy microseconds.
/// `machine` names the TPM: copies of one state are one TPM (same EK).
pub(crate) fn manufactured(machine: &'static str) -> &'static Path {
    use std::sync::OnceLock;
    static A: OnceLock<tempfile::TempDir> = OnceLock::new();
    static B: OnceLock<tempfile::TempDir> = OnceLock::new();
    static OTHER: OnceLock<tempfile::TempDir> = OnceLock::new();
    static SHA1: OnceLock<tempfile::TempDir> = OnceLock::new();
    static BOTH: OnceLock<tempfile::TempDir> = OnceLock::new();
    let (cell, maker, banks) = match machine {
        "a" => (&A, "test", "sha256"),
        "b" => (&B, "test", "sha256"),
        "sha1" => (&SHA1, "test", "sha1"),
        "both" => (&BOTH, "test", "sha1,sha256"),
        _ => (&OTHER, "other", "sha256"),
    };
    cell.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new(workspace().join("tpmsim-fixtures/manufacture"))
            .arg(dir.path())
            .args(["--maker", maker, "--pcr-banks", banks])
            .within();
        assert_ok(&out);
        dir
    })
    .path()
}

/// A swtpm on free loopback ports, from a copy of a manufactured state.
/// Stopped on drop.
pub(crate) struct Swtpm {
    pub dir: tempfile::TempDir,
    pub port: u16,
}

impl Swtpm {
    pub(crate) fn start() -> Self {
        Swtpm::start_from(manufactured("a"))
    }

    /// Another machine's TPM: another EK from the same maker.
    pub(crate) fn start_another_machine() -> Self {
        Swtpm::start_from(manufactured("b"))
    }

    /// A TPM whose EK certificate comes from a maker the control plane does not know.
    pub(crate) fn start_other_maker() -> Self {
        Swtpm::start_from(manufactured("other"))
    }

    /// A TPM of older server firmware: only a SHA-1 PCR bank (another EK
    /// from the same maker).
    pub(crate) fn start_sha1_only() -> Self {
        Swtpm::start_from(manufactured("sha1"))
    }

    /// A TPM with both a SHA-1 and a SHA-256 PCR bank (another EK from the
    /// same maker). For the measured-boot tests (failpoints builds).
    #[cfg(feature = "failpoints")]
    pub(crate) fn start_two_banks() -> Self {
        Swtpm::start_from(manufactured("both"))
    }

    fn start_from(template: &Path) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::copy(
            template.join("tpm2-00.permall"),
            dir.path().join("tpm2-00.permall"),
        )
        .expect("copy state");
        // The swtpm TCTI wants the control port at port+1. Another process can
        // take a port between our probe and swtpm's bind: try a few pairs.
        for _ in 0..10 {
            let port = free_port_pair();
            if spawn_swtpm(dir.path(), port) {
                return Swtpm { dir, port };
            }
        }
        panic!("swtpm did not start on any free port pair");
    }

    pub(crate) fn tcti(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }

    /// The command codes swtpm has executed so far, in order.
    pub(crate) fn command_codes(&self) -> Vec<u32> {
        let log = std::fs::read_to_string(self.dir.path().join("swtpm.log")).unwrap_or_default();
        let mut lines = log.lines();
        let mut codes = Vec::new();
        while let Some(l) = lines.next() {
            if !l.contains("SWTPM_IO_Read") {
                continue;
            }
            let hex: Vec<u8> = lines
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|b| u8::from_str_radix(b, 16).ok())
                .collect();
            if let Some(cc) = hex.get(6..10) {
                codes.push(u32::from_be_bytes([cc[0], cc[1], cc[2], cc[3]]));
            }
        }
        codes
    }

    /// The transient objects swtpm holds now (`tpm2_getcap
    /// handles-transient`): what a process left loaded, since nothing
    /// flushes for it on swtpm's TCP TCTI.
    pub(crate) fn transient_handles(&self) -> Vec<String> {
        let out = self.tool("tpm2_getcap", &["handles-transient"]);
        assert_ok(&out);
        stdout(&out)
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- "))
            .map(str::to_owned)
            .collect()
    }

    /// tpm2-tools against this TPM.
    pub(crate) fn tool(&self, tool: &str, args: &[&str]) -> Output {
        Command::new(tool)
            .args(args)
            .env("TPM2TOOLS_TCTI", self.tcti())
            .env("TSS2_LOG", "all+none")
            .within()
    }

    /// TPM2_Clear through the lockout hierarchy: a new owner seed (node keys
    /// derive differently), same endorsement seed (same EK and AK).
    pub(crate) fn clear(&self) {
        assert_ok(&self.tool("tpm2_clear", &["-c", "l"]));
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("swtpm.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        }
    }
}

/// swtpm on `port` (and the control port, port+1) with the state in `dir`;
/// false when it could not bind.
fn spawn_swtpm(dir: &Path, port: u16) -> bool {
    Command::new("swtpm")
        .args(["socket", "--tpm2", "--tpmstate"])
        .arg(format!("dir={}", dir.display()))
        .args([
            "--server",
            &format!("type=tcp,port={port},bindaddr=127.0.0.1"),
        ])
        .args([
            "--ctrl",
            &format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1),
        ])
        .args(["--flags", "not-need-init,startup-clear"])
        .arg("--pid")
        .arg(format!("file={}", dir.join("swtpm.pid").display()))
        .arg("--log")
        .arg(format!("file={},level=2", dir.join("swtpm.log").display()))
        // --daemon returns once the sockets listen: nothing to wait for.
        .arg("--daemon")
        .status()
        .expect("run swtpm")
        .success()
}

/// A port P such that P and P+1 were both free a moment ago.
fn free_port_pair() -> u16 {
    loop {
        let a = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = a.local_addr().expect("addr").port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

impl Agent {
    /// `bcd tpm identify --json`.
    pub(crate) fn identify(&self) -> Value {
        let out = self.run(&["tpm", "identify", "--json"]);
        assert_ok(&out);
        serde_json::from_slice(&out.stdout).expect("identify JSON")
    }

    /// Puts this machine's EK on the control plane's allow-list (`resolve
    /// add`); returns its SHA-256.
    pub(crate) fn allow_ek(&self, cp: &ControlPlane) -> String {
        let ek = self.identify()["ekSha256"]
            .as_str()
            .expect("ekSha256")
            .to_owned();
        assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek]));
        ek
    }

    /// A machine with this swtpm, allow-listed and joined with `--attestor tpm`.
    pub(crate) fn tpm_joined(cp: &ControlPlane, tpm: &Swtpm) -> Self {
        let agent = Agent::with_tpm(cp, tpm);
        agent.allow_ek(cp);
        assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
        agent
    }

    /// An agent whose config names this swtpm (`[tpm] tcti`).
    pub(crate) fn with_tpm(cp: &ControlPlane, tpm: &Swtpm) -> Self {
        let agent = Agent::new(cp);
        agent.set_tpm(tpm);
        agent
    }
}

/// An HTTPS server in the test process (`bc_controlplane::http::serve`
/// with `router` on a free loopback port), for control planes that
/// misbehave or record on purpose; stopped when dropped.
pub(crate) struct InProcessServer {
    pub url: String,
    rt: Option<tokio::runtime::Runtime>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// A runtime for an in-process server and a listener on a free loopback
/// port (bound in that runtime), with the port.
fn loopback_runtime(workers: usize) -> (tokio::runtime::Runtime, tokio::net::TcpListener, u16) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let port = listener.local_addr().expect("local addr").port();
    (rt, listener, port)
}

impl InProcessServer {
    pub(crate) fn start(tls: std::sync::Arc<rustls::ServerConfig>, router: axum::Router) -> Self {
        let (rt, listener, port) = loopback_runtime(2);
        let url = format!("https://127.0.0.1:{port}");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(bc_controlplane::http::serve(listener, tls, router, async {
            let _ = stopped.await;
        }));
        InProcessServer {
            url,
            rt: Some(rt),
            stop: Some(stop),
        }
    }
}

impl Drop for InProcessServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A plain-HTTP server in the test process (`router` on a free loopback
/// port), for the link-local services a VM talks to without TLS (a cloud's
/// metadata service); stopped when dropped.
#[cfg(feature = "failpoints")]
pub(crate) struct PlainServer {
    pub url: String,
    rt: Option<tokio::runtime::Runtime>,
}

#[cfg(feature = "failpoints")]
impl PlainServer {
    pub(crate) fn start(router: axum::Router) -> Self {
        let (rt, listener, port) = loopback_runtime(1);
        let url = format!("http://127.0.0.1:{port}");
        rt.spawn(async move { axum::serve(listener, router).await });
        PlainServer { url, rt: Some(rt) }
    }
}

#[cfg(feature = "failpoints")]
impl Drop for PlainServer {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A CSR for a fresh P-256 key nobody keeps: for requests the test sends
/// itself, where only the evidence matters.
pub(crate) fn throwaway_csr() -> Vec<u8> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    rcgen::CertificateParams::default()
        .serialize_request(&key)
        .expect("csr")
        .der()
        .to_vec()
}

/// A test that fails while a [`Running`] command runs leaves no process
/// behind: the guard kills and reaps it as the panic unwinds (a bare
/// `Child` would run on, and an unreaped one stay a zombie).
#[test]
fn a_running_command_is_reaped_when_its_test_fails() {
    let mut pid = 0;
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let sleeper = Running::start(Command::new("sleep").arg("600"));
        pid = sleeper.id();
        panic!("an assertion fails mid-test");
    }));
    assert!(failed.is_err());
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "sleep 600 (pid {pid}) outlived its test"
    );
}
