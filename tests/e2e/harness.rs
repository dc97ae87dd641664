//! Starts what a test needs and stops it when the test ends: a control plane
//! in its own directory on a free loopback port, and agents with their own
//! config and data directory.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

/// Path of a workspace binary: next to `bcd`, which Cargo built for us.
pub fn bin(name: &str) -> PathBuf {
    let bcd = PathBuf::from(env!("CARGO_BIN_EXE_bcd"));
    let path = bcd.with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace --bins` before the tests (scripts/test does)",
        path.display()
    );
    path
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[track_caller]
pub fn assert_ok(out: &Output) {
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
pub struct ControlPlane {
    pub dir: tempfile::TempDir,
    pub url: String,
    child: Option<Child>,
}

impl ControlPlane {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let cp = ControlPlane {
            dir,
            url: String::new(),
            child: None,
        };
        assert_ok(&cp.cli(&["init"]));
        cp.serve()
    }

    /// An initialised directory without a server, for CLI-only tests and for
    /// an in-process server.
    pub fn init_only() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let cp = ControlPlane {
            dir,
            url: String::new(),
            child: None,
        };
        assert_ok(&cp.cli(&["init"]));
        cp
    }

    fn serve(mut self) -> Self {
        let log = std::fs::File::create(self.path().join("serve.log")).expect("log file");
        let mut child = Command::new(bin("bc-controlplane"))
            .args(["serve", "--dir"])
            .arg(self.path())
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn bc-controlplane serve");
        // The first stdout line says where it listens: wait for it, no sleeping.
        let mut line = String::new();
        let out = child.stdout.take().expect("stdout");
        BufReader::new(out)
            .read_line(&mut line)
            .expect("read listening line");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "unexpected first line from serve: {line:?}; log: {}",
                    self.log()
                )
            })
            .to_owned();
        self.url = url;
        self.child = Some(child);
        self
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log (stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path().join("serve.log")).unwrap_or_default()
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        let (cmd, rest) = split_command(args);
        Command::new(bin("bc-controlplane"))
            .args(cmd)
            .arg("--dir")
            .arg(self.path())
            .args(rest)
            .stdin(Stdio::null())
            .output()
            .expect("run bc-controlplane")
    }

    /// `token create`: returns the token text.
    pub fn token(&self, role: &str, extra: &[&str]) -> String {
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

    pub fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.push("--json");
        let out = self.cli(&args);
        assert_ok(&out);
        serde_json::from_slice(&out.stdout).expect("JSON output")
    }

    pub fn events(&self) -> Vec<Value> {
        self.json(&["events", "list"])
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub fn refusals(&self) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["type"] == "security.join.refused")
            .collect()
    }

    /// The refusal reasons stored so far, oldest first.
    pub fn refusal_reasons(&self) -> Vec<String> {
        self.refusals()
            .iter()
            .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    pub fn nodes(&self) -> Vec<Value> {
        self.json(&["nodes", "list"])
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The agent config `agent-config` prints, for a data dir.
    pub fn agent_config(&self, data_dir: &Path) -> String {
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

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `["token", "create", "--role", "node"]` → (`token create`, rest): the
/// subcommand words come before `--dir`.
fn split_command<'a>(args: &'a [&'a str]) -> (&'a [&'a str], &'a [&'a str]) {
    let n = args.iter().take_while(|a| !a.starts_with('-')).count();
    let n = match args.first() {
        Some(&"token") | Some(&"nodes") | Some(&"events") | Some(&"clock") | Some(&"requests")
        | Some(&"resolve") | Some(&"pools") | Some(&"ek-roots") => n.min(2),
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
pub struct Agent {
    pub root: tempfile::TempDir,
    pub config: PathBuf,
    pub data_dir: PathBuf,
}

impl Agent {
    pub fn new(cp: &ControlPlane) -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let data_dir = root.path().join("data");
        let config = root.path().join("config.toml");
        std::fs::write(&config, cp.agent_config(&data_dir)).expect("write config");
        Agent {
            root,
            config,
            data_dir,
        }
    }

    pub fn with_config(text: &str) -> Self {
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

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("bcd"));
        cmd.args(args)
            .arg("--config")
            .arg(&self.config)
            .env_remove("BCD_JOIN_TOKEN")
            .env("TSS2_LOG", "all+none")
            .stdin(Stdio::null());
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run bcd")
    }

    /// `bcd join --token-file F` with the token in a 0600 file.
    pub fn join_with_token(&self, token: &str) -> Output {
        let file = self.root.path().join("token");
        std::fs::write(&file, token).expect("write token file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        self.run(&["join", "--token-file", &file.to_string_lossy()])
    }

    pub fn status_json(&self) -> Value {
        let out = self.run(&["status", "--json"]);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("status --json: {e}: {}", stdout(&out)))
    }

    /// Names in the data directory (empty when it does not exist).
    pub fn files(&self) -> Vec<String> {
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
    pub fn assert_nothing_written(&self) {
        let files = self.files();
        assert!(
            !files
                .iter()
                .any(|f| f == "identity.json" || f == "node.key"),
            "no identity may be written, found {files:?}"
        );
    }
}

#[track_caller]
pub fn assert_access_denied(out: &Output) {
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
