//! `bcd node`: renewal over mTLS (TPM-certified next keys for a TPM-joined
//! node), crash safety of the rotation, backoff, and the x509pop re-join
//! after an offline expiry, against the reference control plane and swtpm.
//! Clocks are moved (`BCD_CLOCK_OFFSET` in this failpoints build, the
//! control plane's database clock), never waited on. The backoff tests wait
//! for what a running node logs (its 1 s and 2 s steps, the shortest the
//! config allows) and check what it decided; how long it then waits is
//! measured on tokio's paused clock in `src/node.rs`'s unit tests.

use std::process::Output;
use std::time::{Duration, Instant};

use bcd::channel::OFF_ENV as CHANNEL_ENV;
use bcd::keys::TpmAccess;
use serde_json::Value;

use crate::harness::*;

/// Short retries, so that a test sees several in seconds.
fn fast_backoff(agent: &Agent) {
    let mut config = std::fs::read_to_string(&agent.config).unwrap();
    config.push_str("\n[node]\nbackoff_min = \"1s\"\nbackoff_max = \"2s\"\n");
    std::fs::write(&agent.config, config).unwrap();
}

fn node(agent: &Agent, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut all = vec!["node"];
    all.extend_from_slice(args);
    let mut cmd = agent.command(&all);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.within()
}

fn identity(agent: &Agent, tpm: Option<&Swtpm>) -> bcd::identity::Identity {
    let access = match tpm {
        Some(t) => TpmAccess::new(Some(&t.tcti())),
        None => TpmAccess::none(),
    };
    bcd::identity::Identity::load(&agent.data_dir, &access)
        .expect("the identity loads")
        .expect("an identity")
}

fn statements(id: &bcd::identity::Identity) -> Vec<String> {
    bcd::pki::NodeCert::parse(&id.chain[0]).unwrap().statements
}

fn node_row(cp: &ControlPlane, node_id: &str) -> Value {
    cp.nodes()
        .into_iter()
        .find(|n| n["nodeId"] == node_id)
        .expect("node listed")
}

#[test]
fn a_token_node_renews_over_mtls_and_says_so() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let before = identity(&agent, None);

    // Not due: one pass does nothing and exits 0.
    let out = node(&agent, &["--once"], &[]);
    assert_ok(&out);
    assert!(stderr(&out).contains("not due"), "{}", stderr(&out));
    assert_eq!(agent.status_json()["lastRenewal"], Value::Null);

    let out = node(&agent, &["--once", "--renew-now"], &[]);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("renewed the certificate"),
        "{}",
        stderr(&out)
    );
    let after = identity(&agent, None);
    assert_eq!(after.node_id, before.node_id);
    assert_ne!(after.key.spki_der(), before.key.spki_der(), "a new key");
    assert_ne!(after.chain[0], before.chain[0], "a new certificate");
    assert_eq!(
        agent.files(),
        vec!["identity.json", "journal.db", "node.key"]
    );
    let status = agent.status_json();
    assert_eq!(status["lastRenewal"]["ok"], true, "{status}");
    let text = stdout(&agent.run(&["status"]));
    assert!(
        text.contains(", last renewal ") && text.trim_end().ends_with(" ok"),
        "{text}"
    );

    // Past its renewal point (at most 60 % of 24 h: bcd's clock moved 15 h), it renews by itself.
    let out = node(&agent, &["--once"], &[("BCD_CLOCK_OFFSET", "+15h")]);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("renewed the certificate"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_refused_renewal_is_logged_and_journaled() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&["nodes", "revoke-identity", &node_id]));

    let before = std::fs::read(agent.data_dir.join("identity.json")).unwrap();
    let out = cp.refused_once(Refusal::Renew, "stale-generation", || {
        node(&agent, &["--once", "--renew-now"], &[])
    });
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(agent.data_dir.join("identity.json")).unwrap(),
        before,
        "the identity is unchanged"
    );
    let err = stderr(&out);
    assert!(
        err.contains("renewal failed")
            && err.contains("attempt=1")
            && err.contains("expiresIn=")
            && err.contains("renewal refused by the control plane (Renew refused)"),
        "{err}"
    );
    let last = &agent.status_json()["lastRenewal"];
    assert_eq!(last["ok"], false);
    assert_eq!(
        last["detail"],
        "renewal refused by the control plane (Renew refused)"
    );
    assert_eq!(
        agent.files(),
        vec!["identity.json", "journal.db", "node.key"]
    );
}

#[test]
fn a_tpm_node_renews_with_a_certified_next_key_each_time() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::tpm_joined(&cp, &tpm);
    let first = identity(&agent, Some(&tpm));
    let statement = statements(&first);
    assert_eq!(statement.len(), 2);
    assert!(statement[0].starts_with("urn:bc:tpm-ak:sha256:"));
    assert_eq!(statement[1], "urn:bc:scope:node");
    drop(first);

    let mut keys = vec![];
    for _ in 0..3 {
        let out = node(&agent, &["--once", "--renew-now"], &[]);
        assert_ok(&out);
        assert!(stderr(&out).contains("certified=true"), "{}", stderr(&out));
        let id = identity(&agent, Some(&tpm));
        assert_eq!(statements(&id), statement, "the same AK statement");
        assert_eq!(id.key.kind().as_str(), "tpm");
        keys.push(id.key.spki_der().to_vec());
    }
    keys.dedup();
    assert_eq!(keys.len(), 3, "a new TPM key at every renewal");
    let record = std::fs::read_to_string(agent.data_dir.join("node.key")).unwrap();
    assert!(record.starts_with("-----BEGIN BCD TPM NODE KEY-----"));
}

#[test]
fn a_file_key_node_moves_into_the_tpm_at_its_next_renewal() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    assert_eq!(agent.status_json()["nodeKey"], "file");

    let tpm = Swtpm::start();
    agent.set_tpm(&tpm);
    assert_ok(&node(&agent, &["--once", "--renew-now"], &[]));
    assert_eq!(agent.status_json()["nodeKey"], "tpm");
    assert_eq!(
        statements(&identity(&agent, Some(&tpm))),
        ["urn:bc:scope:node"]
    );
}

/// Kill -9 (abort) at each step of a renewal: the next start loads a valid
/// identity, old or new, and renews again.
#[test]
fn a_crash_at_each_step_of_a_renewal_leaves_an_identity_that_loads() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    for point in [
        "renew-before-request",
        "renew-after-answer",
        "renew-between-renames",
    ] {
        let before = identity(&agent, None).key.spki_der().to_vec();
        let out = node(
            &agent,
            &["--once", "--renew-now"],
            &[("BCD_FAILPOINT", point)],
        );
        assert!(
            out.status.code().is_none(),
            "{point}: expected the process to die, got {:?}: {}",
            out.status,
            stderr(&out)
        );
        let after = identity(&agent, None);
        if point == "renew-before-request" {
            assert_eq!(after.key.spki_der(), before, "{point}: the old identity");
            // The staged key stays until the next renewal overwrites it.
            assert_eq!(
                agent.files(),
                vec!["identity.json", "journal.db", "node.key", "node.key.next"],
            );
        } else {
            assert_ne!(after.key.spki_der(), before, "{point}: the new identity");
            assert_eq!(
                agent.files(),
                vec!["identity.json", "journal.db", "node.key"],
                "{point}"
            );
        }
        let out = node(&agent, &["--once", "--renew-now"], &[]);
        assert_ok(&out);
        assert_eq!(
            agent.files(),
            vec!["identity.json", "journal.db", "node.key"],
            "{point}"
        );
    }
}

/// The same with the key in the TPM. swtpm over TCP has no resource
/// manager, so the transient objects of a killed process stay loaded until
/// the machine restarts: the test flushes them, as a reboot would.
#[test]
fn a_crash_of_a_tpm_renewal_leaves_an_identity_that_loads() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::tpm_joined(&cp, &tpm);
    for point in ["renew-after-answer", "renew-between-renames"] {
        let out = node(
            &agent,
            &["--once", "--renew-now"],
            &[("BCD_FAILPOINT", point)],
        );
        assert!(out.status.code().is_none(), "{point}: {}", stderr(&out));
        assert_ok(&tpm.tool("tpm2_flushcontext", &["-t"]));
        let out = node(&agent, &["--once"], &[]);
        assert_ok(&out);
        assert!(
            stderr(&out).contains("completed an interrupted identity rotation"),
            "{point}: {}",
            stderr(&out)
        );
        assert_ok(&node(&agent, &["--once", "--renew-now"], &[]));
    }
}

/// A running `bcd node ARGS`, its stderr lines as they come.
fn running(agent: &Agent, args: &[&str]) -> Logged {
    let mut all = vec!["node"];
    all.extend_from_slice(args);
    Logged::spawn(agent.command(&all))
}

#[test]
fn renewal_backs_off_while_the_control_plane_is_down_then_succeeds() {
    let mut cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    fast_backoff(&agent);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let listen = cp.url.trim_start_matches("https://").to_owned();
    cp.stop();

    let mut node = running(&agent, &["--renew-now"]);
    node.wait_for("renewal failed", 3);
    let failures: Vec<&String> = node
        .seen
        .iter()
        .filter(|l| l.contains("renewal failed"))
        .collect();
    for (i, (attempt, retry)) in [(1, "1s"), (2, "2s"), (3, "2s")].iter().enumerate() {
        let l = failures[i];
        assert!(
            l.contains(&format!("attempt={attempt}"))
                && l.contains(&format!("retryIn={retry}"))
                && l.contains("expiresIn="),
            "{l}"
        );
    }

    // The control plane comes back on the same address.
    let _cp = cp.serve_on(&listen);
    node.wait_for("renewed the certificate", 1);
    assert_eq!(agent.status_json()["lastRenewal"]["ok"], true);
}

/// A renewal inside a running node costs 7 TPM commands; the one-shot
/// `bcd node --once --renew-now` (tpmcount.rs) adds the current key's
/// derivation as it starts and the renewed key's flush as it exits.
#[test]
fn a_renewal_in_a_running_tpm_node_costs_7_tpm_commands() {
    const CREATE_PRIMARY: u32 = 0x131;
    const CERTIFY: u32 = 0x148;
    const SIGN: u32 = 0x15D;
    const FLUSH_CONTEXT: u32 = 0x165;
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::tpm_joined(&cp, &tpm);
    let before = tpm.command_codes().len();
    let mut cmd = agent.command(&["node", "--renew-now"]);
    // The command channel's handshakes (a Sign each) are not the renewal's.
    cmd.env(CHANNEL_ENV, "off");
    let mut node = Logged::spawn(cmd);
    node.wait_for("renewed the certificate", 1);
    // The old key is flushed when its last holder (the renewal's TLS
    // connection) lets go, with no log line: wait for the 8th command.
    let deadline = Instant::now() + Duration::from_secs(30);
    while tpm.command_codes().len() < before + 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Killed: nothing flushes at exit.
    drop(node);
    let codes = tpm.command_codes().split_off(before);
    assert_eq!(
        codes,
        [
            // As the node starts: the current key.
            CREATE_PRIMARY,
            // The renewal: the AK, the next key, its CSR and certification,
            // the AK out, the mTLS handshake, the old key out.
            CREATE_PRIMARY,
            CREATE_PRIMARY,
            SIGN,
            CERTIFY,
            FLUSH_CONTEXT,
            SIGN,
            FLUSH_CONTEXT,
        ],
        "{codes:x?}"
    );
}

#[test]
fn an_expired_node_rejoins_with_x509pop_within_grace_and_stops_past_it() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let generation = node_row(&cp, &node_id)["identityGeneration"].clone();
    let before = identity(&agent, None);

    // The machine was off for 25 hours: both clocks move.
    assert_ok(&cp.cli(&["clock", "set", "--offset", "25h"]));
    let out = node(&agent, &["--once"], &[("BCD_CLOCK_OFFSET", "+25h")]);
    assert_ok(&out);
    let err = stderr(&out);
    assert!(
        err.contains(&format!("re-joining with x509pop as {node_id}"))
            && err.contains("certificate expired"),
        "{err}"
    );
    let after = identity(&agent, None);
    assert_eq!(after.node_id, node_id, "the same node");
    assert_eq!(after.attestor, "x509pop");
    assert_ne!(after.key.spki_der(), before.key.spki_der());
    let row = node_row(&cp, &node_id);
    assert!(
        row["identityGeneration"].as_i64() > generation.as_i64(),
        "{row}"
    );

    // Ten days later: past the grace, the operator must act.
    let out = node(&agent, &["--once"], &[("BCD_CLOCK_OFFSET", "+11d")]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("past the 7-day grace")
            && err.contains("bcd join --reset --yes, then bcd join"),
        "{err}"
    );
}

#[test]
fn join_with_x509pop_rejoins_as_itself() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);

    let out = agent.run(&["join", "--attestor", "x509pop"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no identity"), "{}", stderr(&out));

    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    for usage in [
        &["--reset", "--yes"][..],
        &["--token-file", "/dev/null"][..],
    ] {
        let mut args = vec!["join", "--attestor", "x509pop"];
        args.extend_from_slice(usage);
        assert_eq!(agent.run(&args).status.code(), Some(2), "{usage:?}");
    }

    let out = agent.run(&["join", "--attestor", "x509pop"]);
    assert_ok(&out);
    assert_eq!(stdout(&out).trim(), format!("re-joined as {node_id}"));
    assert_eq!(agent.status_json()["nodeId"], node_id.as_str());
    assert_eq!(node_row(&cp, &node_id)["attestor"], "x509pop");

    // A clock two minutes off is outside the 60 s window.
    let out = agent
        .command(&["join", "--attestor", "x509pop"])
        .env("BCD_CLOCK_OFFSET", "-2m")
        .within();
    assert_access_denied(&out);
    assert_eq!(agent.status_json()["nodeId"], node_id.as_str());
}

/// The spec's "the EK is new" recovery. TPM2_ChangeEPS gives the TPM a new
/// endorsement seed (new EK and AK) but keeps the owner seed, so the node key
/// still loads and the renewal's AK check is what fails, sending nothing.
/// Then the machine gets a new TPM: cordon and delete the old node, and join
/// again with --reset: a new node.
#[test]
fn a_new_endorsement_seed_fails_the_renewal_and_the_machine_rejoins_as_a_new_node() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::tpm_joined(&cp, &tpm);
    let old = agent.status_json()["nodeId"].as_str().unwrap().to_owned();

    assert_ok(&tpm.tool("tpm2_changeeps", &[]));
    let out = node(&agent, &["--once", "--renew-now"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("another TPM, or its endorsement seed changed"),
        "{}",
        stderr(&out)
    );
    assert!(
        !cp.events()
            .iter()
            .any(|e| e["type"] == "security.renew.refused"),
        "no fallback: nothing was sent"
    );

    let new_tpm = Swtpm::start_another_machine();
    agent.set_tpm(&new_tpm);
    agent.allow_ek(&cp);
    assert_ok(&cp.cli(&["nodes", "cordon", &old]));
    assert_ok(&cp.cli(&["nodes", "delete", &old, "--yes"]));
    assert_ok(&agent.run(&["join", "--reset", "--yes", "--attestor", "tpm"]));
    let new = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    assert_ne!(new, old, "a new node");
    assert_eq!(agent.status_json()["nodeKey"], "tpm");
    let nodes: Vec<String> = cp
        .nodes()
        .iter()
        .map(|n| n["nodeId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(nodes, vec![new]);
}

/// `retryIn=2s` (a `Duration`'s debug form) in a log line.
fn retry_in(line: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("retryIn="))
        .unwrap_or_else(|| panic!("no retryIn in {line}"))
        .to_owned()
}

/// A node 30 h past its certificate's expiry against a control plane that refuses
/// its x509pop re-join: it retries on the backoff it logs (here 1 s, 2 s,
/// 4 s: the 30 s, 60 s, 120 s scaled down), each attempt after the
/// last one's failure, with the same staged key each time, one journal
/// entry per attempt. That it waits exactly what it logs is measured on
/// tokio's paused clock (`node::tests::a_failed_attempt_waits_exactly_the_retry_it_logs`).
#[test]
fn a_refused_rejoin_waits_what_it_logs_and_reuses_its_next_key() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let mut config = std::fs::read_to_string(&agent.config).unwrap();
    config.push_str("\n[node]\nbackoff_min = \"1s\"\nbackoff_max = \"10m\"\n");
    std::fs::write(&agent.config, config).unwrap();
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let journal = || -> i64 {
        rusqlite::Connection::open(agent.data_dir.join("journal.db"))
            .unwrap()
            .query_row("SELECT COUNT(*) FROM journal", [], |r| r.get(0))
            .unwrap()
    };
    let rows_before = journal();
    // Refused: an identity revoked before the certificate expired.
    assert_ok(&cp.cli(&["nodes", "revoke-identity", &node_id]));
    assert_ok(&cp.cli(&["clock", "set", "--offset", "54h"]));

    let mut cmd = agent.command(&["node"]);
    cmd.env("BCD_CLOCK_OFFSET", "+54h");
    let mut node = Logged::spawn(cmd);
    // Three attempts: at 0, 1 and 3 s.
    node.wait_for("re-join failed", 3);
    node.kill();
    const START: &str = "re-joining the control plane with x509pop";
    const FAILED: &str = "re-join failed";
    let all: Vec<&String> = node.seen.iter().collect();
    // In the order logged: each attempt starts after the last one failed.
    let events: Vec<&String> = node
        .seen
        .iter()
        .filter(|l| l.contains(START) || l.contains(FAILED))
        .collect();
    for (i, l) in events.iter().enumerate() {
        let expected = if i % 2 == 0 { START } else { FAILED };
        assert!(
            l.contains(expected),
            "line {i} is no {expected:?}: {all:#?}"
        );
    }
    let starts: Vec<&&String> = events.iter().filter(|l| l.contains(START)).collect();
    let failures: Vec<&&String> = events.iter().filter(|l| l.contains(FAILED)).collect();
    assert!(failures.len() >= 3, "{all:#?}");
    for (i, line) in failures.iter().enumerate().take(3) {
        assert_eq!(retry_in(line), format!("{}s", 1 << i), "{line}");
        assert!(line.contains(&format!("attempt={}", i + 1)), "{line}");
    }
    // One staged key, sent at every attempt.
    let kids: std::collections::BTreeSet<&str> = starts
        .iter()
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("node_key="))
                .unwrap()
        })
        .collect();
    assert_eq!(kids.len(), 1, "{all:#?}");
    let rows = journal() - rows_before;
    // One row per attempt that ended: every failure seen, at most one per
    // attempt started (the last may have been cut short by the kill).
    let rows = usize::try_from(rows).unwrap_or(0);
    assert!(
        rows >= failures.len() && rows <= starts.len(),
        "{rows} journal rows for {} attempts, {} failures seen",
        starts.len(),
        failures.len()
    );
}

/// Each certificate has its own renewal point, 50-60 % into its lifetime,
/// that `bcd status --json` shows and `bcd node` keeps to the second.
#[test]
fn the_node_renews_at_the_point_status_shows() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let status = agent.status_json();
    let parse = |v: &Value| {
        time::OffsetDateTime::parse(
            v.as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    let renew_at = parse(&status["renewAt"]);
    let cert = identity(&agent, None).cert;
    let fraction = (renew_at - cert.not_before) / (cert.not_after - cert.not_before);
    assert!((0.5..=0.6).contains(&fraction), "{fraction}");

    let offset = |seconds: i64| {
        let to = (renew_at - time::OffsetDateTime::now_utc()).whole_seconds() + seconds;
        format!("+{to}s")
    };
    let out = node(&agent, &["--once"], &[("BCD_CLOCK_OFFSET", &offset(-30))]);
    assert_ok(&out);
    assert!(stderr(&out).contains("not due"), "{}", stderr(&out));
    let out = node(&agent, &["--once"], &[("BCD_CLOCK_OFFSET", &offset(30))]);
    assert_ok(&out);
    assert!(
        stderr(&out).contains("renewed the certificate"),
        "{}",
        stderr(&out)
    );
}
