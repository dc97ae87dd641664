//! `bcd doctor`: the lines and exit codes on a healthy node, a TPM node, a
//! TPM-cleared node, an expired node, a file-key node on a host with a TPM,
//! with the control plane down or under another CA. (Clock skew against the
//! HTTP Date is covered by the unit tests: the control plane's `clock set`
//! moves its database time, not its Date header.)

use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use serde_json::Value;

use crate::harness::*;

/// Lets this machine's TPM join through `resolve add`.
struct Doctor {
    out: Output,
    lines: Vec<String>,
}

impl Doctor {
    fn run(agent: &Agent) -> Doctor {
        let out = agent.run(&["doctor"]);
        let lines = stdout(&out).lines().map(str::to_owned).collect();
        Doctor { out, lines }
    }

    fn code(&self) -> Option<i32> {
        self.out.status.code()
    }

    /// The line of `check` (`ok    identity: …` → `check` = "identity").
    #[track_caller]
    fn line(&self, check: &str) -> &str {
        let prefix = format!("{check}: ");
        self.lines
            .iter()
            .find(|l| l.get(6..).is_some_and(|rest| rest.starts_with(&prefix)))
            .unwrap_or_else(|| panic!("no {check} line in:\n{}", self.dump()))
    }

    fn has(&self, check: &str) -> bool {
        let prefix = format!("{check}: ");
        self.lines
            .iter()
            .any(|l| l.get(6..).is_some_and(|rest| rest.starts_with(&prefix)))
    }

    fn dump(&self) -> String {
        format!(
            "exit {:?}\n{}\nstderr: {}",
            self.code(),
            self.lines.join("\n"),
            stderr(&self.out)
        )
    }

    #[track_caller]
    fn expect(&self, check: &str, start: &str) {
        let line = self.line(check);
        assert!(
            line.starts_with(start),
            "expected {start:?}, got:\n{}",
            self.dump()
        );
    }
}

#[test]
fn a_healthy_token_joined_node() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();

    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    assert!(
        d.lines.iter().all(|l| l.starts_with("ok    ")),
        "every check ok:\n{}",
        d.dump()
    );
    let checks: Vec<&str> = d
        .lines
        .iter()
        .filter_map(|l| l.get(6..)?.split_once(": ").map(|(c, _)| c))
        .collect();
    assert_eq!(
        checks,
        [
            "config",
            "data dir",
            "identity",
            "certificate",
            "last renewal",
            "node key",
            "tpm",
            "control plane",
            "clock"
        ]
    );
    d.expect(
        "identity",
        &format!("ok    identity: node {node_id} (node) in bc.test, joined with join-token; the node key matches the certificate"),
    );
    d.expect("certificate", "ok    certificate: expires ");
    d.expect(
        "node key",
        "ok    node key: a file key (this host has no TPM)",
    );
    d.expect("tpm", "ok    tpm: none (node keys are file keys)");
    d.expect(
        "control plane",
        &format!(
            "ok    control plane: {} answers over TLS under the pinned CA",
            cp.url
        ),
    );
    d.expect("clock", "ok    clock: within ");

    let out = agent.run(&["doctor", "--json"]);
    assert_ok(&out);
    let json: Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
    assert_eq!(json["ok"], true);
    let checks = json["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 9);
    for c in checks {
        assert_eq!(c["status"], "ok", "{c}");
        assert!(c["check"].is_string() && c["message"].is_string(), "{c}");
        assert!(c["hint"].is_null(), "{c}");
    }
    assert_eq!(checks[5]["check"], "node key");

    // A loose identity file: a warning with the chmod to run, still exit 0.
    let id_file = agent.data_dir.join("identity.json");
    std::fs::set_permissions(&id_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    let line = d.line("data dir");
    assert!(line.starts_with("warn  data dir: "), "{}", d.dump());
    assert!(
        line.contains("identity.json is 0644, expected 0600")
            && line.contains(&format!("chmod 600 {}", id_file.display())),
        "{line}"
    );

    // A failed renewal in the journal: a warning with its detail.
    let mut journal = bcd::journal::Journal::open(&agent.data_dir).unwrap();
    journal
        .record(&bcd::journal::Entry {
            at: time::OffsetDateTime::now_utc()
                .replace_nanosecond(0)
                .unwrap(),
            kind: bcd::journal::Kind::RenewalFailed,
            node_id: node_id.clone(),
            detail: "cannot reach the control plane".into(),
            not_after: None,
        })
        .unwrap();
    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    let line = d.line("last renewal");
    assert!(
        line.starts_with("warn  last renewal: the last attempt failed ")
            && line.contains(": cannot reach the control plane; bcd node retries with backoff"),
        "{}",
        d.dump()
    );
}

#[test]
fn a_machine_that_never_joined() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    d.expect("data dir", "fail  data dir: ");
    assert_eq!(
        d.line("identity"),
        format!(
            "fail  identity: not joined (no identity in {}); run bcd join",
            agent.data_dir.display()
        )
    );
    d.expect(
        "certificate",
        "skip  certificate: the identity does not load",
    );
    d.expect("node key", "skip  node key: the identity does not load");
    d.expect("control plane", "ok    control plane: ");
}

#[test]
fn a_config_that_does_not_load() {
    let cp = ControlPlane::init_only();
    let agent = Agent::new(&cp);
    let config = std::fs::read_to_string(&agent.config)
        .unwrap()
        .replace("https://127.0.0.1:1", "http://127.0.0.1:1");
    std::fs::write(&agent.config, config).unwrap();
    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    let line = d.line("config");
    assert!(
        line.starts_with(&format!("fail  config: {}:", agent.config.display())),
        "{}",
        d.dump()
    );
    assert!(line.contains(": api: expected an https URL"), "{line}");
    d.expect(
        "control plane",
        "skip  control plane: the config does not load",
    );
}

#[test]
fn a_tpm_joined_node_and_its_ek_roots() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));

    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(0), "warnings alone exit 0: {}", d.dump());
    assert_eq!(d.line("node key"), "ok    node key: in the TPM");
    d.expect(
        "tpm",
        "warn  tpm: a software TPM: keys in it prove nothing about hardware (TPM 2.0 by IBM",
    );
    assert!(d.line("tpm").contains(&tpm.tcti()), "{}", d.dump());
    d.expect(
        "ek certificate",
        "ok    ek certificate: joins as nv: from NV 0x01c00002, issued by ",
    );
    d.expect("identity", "ok    identity: ");
    assert!(
        d.line("identity").contains("joined with tpm"),
        "{}",
        d.dump()
    );

    // [tpm] ek_roots: the maker's root and issuing CA chain the EK certificate.
    let base = std::fs::read_to_string(&agent.config).unwrap();
    let roots = agent.root.path().join("ek-roots.pem");
    let maker = [fixture("ek-root.pem"), fixture("ek-intermediate.pem")]
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<String>();
    std::fs::write(&roots, maker).unwrap();
    // [tpm] is the config's last table.
    let with_roots = |file: &std::path::Path| format!("{base}ek_roots = \"{}\"\n", file.display());
    std::fs::write(&agent.config, with_roots(&roots)).unwrap();
    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    d.expect(
        "ek certificate",
        "ok    ek certificate: joins as nv: from NV 0x01c00002, issued by ",
    );
    assert!(
        d.line("ek certificate")
            .contains(&format!("in {}", roots.display())),
        "{}",
        d.dump()
    );

    // The root alone: this TPM carries no intermediate, so the path stops short.
    let root_only = agent.root.path().join("root-only.pem");
    std::fs::copy(fixture("ek-root.pem"), &root_only).unwrap();
    std::fs::write(&agent.config, with_roots(&root_only)).unwrap();
    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    d.expect(
        "ek certificate",
        &format!(
            "fail  ek certificate: does not chain to {}: no path: the issuer C=XX, O=BCD Test TPM Manufacturer, CN=BCD Test EK Issuing CA 01 is missing",
            root_only.display()
        ),
    );

    // Another maker's CA.
    let other = agent.root.path().join("other.pem");
    std::fs::copy(fixture("other-maker.pem"), &other).unwrap();
    std::fs::write(&agent.config, with_roots(&other)).unwrap();
    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    d.expect("ek certificate", "fail  ek certificate: does not chain to ");
}

#[test]
fn a_tpm_cleared_node_fails_with_the_specs_hint() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    tpm.clear();

    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    assert_eq!(
        d.line("identity"),
        "fail  identity: the node key does not match the node certificate: the TPM derives another key from node.key (was the TPM cleared?); join again: bcd join --reset --yes, then bcd join"
    );
    d.expect("node key", "skip  node key: ");
    // The TPM itself is fine: only the owner seed changed.
    d.expect("tpm", "warn  tpm: a software TPM");
    d.expect("control plane", "ok    control plane: ");

    let out = agent.run(&["doctor", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let json: Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
    assert_eq!(json["ok"], false);
    let identity = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "identity")
        .unwrap()
        .clone();
    assert_eq!(identity["status"], "fail");
    assert_eq!(
        identity["hint"],
        "join again: bcd join --reset --yes, then bcd join"
    );
}

#[test]
fn a_file_key_on_a_host_with_a_tpm_is_a_warning() {
    let cp = ControlPlane::start();
    let tpm = Swtpm::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    assert_eq!(agent.status_json()["nodeKey"], "file");
    agent.set_tpm(&tpm);

    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(0), "{}", d.dump());
    assert_eq!(
        d.line("node key"),
        "warn  node key: a file key on a host with a TPM; the next renewal moves it into the TPM (through bcd helper when bcd node runs unprivileged)"
    );
}

#[test]
fn an_expired_node_within_and_past_the_x509pop_grace() {
    let cp = ControlPlane::start();
    let agent = Agent::joined_at_offset(&cp, "-25h");
    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    let line = d.line("certificate");
    assert!(
        line.starts_with("fail  certificate: expired "),
        "{}",
        d.dump()
    );
    assert!(
        line.contains("; within 7 days of expiry bcd node re-joins with x509pop by itself: start bcd node before "),
        "{line}"
    );
    d.expect("identity", "ok    identity: ");

    let late = Agent::joined_at_offset(&cp, "-9d");
    let d = Doctor::run(&late);
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    let line = d.line("certificate");
    assert!(
        line.contains("past the 7 days in which bcd node re-joins with x509pop; join again: bcd join --reset --yes, then bcd join"),
        "{line}"
    );
}

#[test]
fn the_control_plane_down() {
    let mut cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    cp.stop();

    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    d.expect(
        "control plane",
        &format!(
            "fail  control plane: cannot reach {}: connection refused; check that the control plane runs",
            cp.url
        ),
    );
    d.expect("clock", "skip  clock: the control plane is unreachable");
    // Everything local still checks out.
    d.expect("identity", "ok    identity: ");
    d.expect("certificate", "ok    certificate: ");
}

#[test]
fn a_control_plane_under_another_ca_is_a_tls_failure() {
    let cp = ControlPlane::start();
    let other = ControlPlane::start();
    let agent = Agent::new(&cp);
    let config = std::fs::read_to_string(&agent.config)
        .unwrap()
        .replace(&cp.url, &other.url);
    std::fs::write(&agent.config, config).unwrap();

    let d = Doctor::run(&agent);
    assert_eq!(d.code(), Some(1), "{}", d.dump());
    let line = d.line("control plane");
    assert!(
        line.starts_with(&format!(
            "fail  control plane: TLS with {} failed: ",
            other.url
        )),
        "{}",
        d.dump()
    );
    assert!(
        line.contains("pins.server_ca must be the control plane's CA"),
        "{line}"
    );
    assert!(!d.has("ek certificate"), "no TPM, no EK line");
}

/// This host's clock moved against the control plane's (bcd's clock, in a
/// failpoints build): x509pop allows 60 s, so doctor warns past 10 s and fails
/// past 60 s.
#[cfg(feature = "failpoints")]
#[test]
fn a_skewed_clock() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    for (offset, status, code) in [
        ("+0s", "ok", 0),
        ("+20s", "warn", 0),
        ("+2m", "fail", 1),
        ("-2m", "fail", 1),
    ] {
        let out = agent
            .command(&["doctor"])
            .env("BCD_CLOCK_OFFSET", offset)
            .within();
        let d = Doctor {
            lines: stdout(&out).lines().map(str::to_owned).collect(),
            out,
        };
        d.expect("clock", status);
        assert_eq!(d.code(), Some(code), "{offset}: {}", d.dump());
        if status == "fail" {
            assert!(
                d.line("clock").contains("x509pop allows 60 s"),
                "{}",
                d.dump()
            );
        }
    }
}
