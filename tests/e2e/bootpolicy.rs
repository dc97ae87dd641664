//! The offline boot checks through the binary, on the real logs of
//! eventlog/tests/data: `eventlog show`, `eventlog verify` (PCR values, a
//! swtpm quote, a policy), `boot-policy from-log`, and a pool's
//! `--boot-policy` refused whole when its file is bad.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

use crate::harness::*;

fn data(name: &str) -> PathBuf {
    workspace().join("eventlog/tests/data").join(name)
}

fn run(args: &[&str]) -> Output {
    let mut cmd = Command::new(bin("bc-controlplane"));
    cmd.args(args).stdin(Stdio::null());
    output_within(cmd, DEADLINE)
}

fn run_p(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut cmd = Command::new(bin("bc-controlplane"));
    cmd.args(args.iter().map(|a| a.as_ref()))
        .stdin(Stdio::null());
    output_within(cmd, DEADLINE)
}

/// The `pcrs:` section of tpm2-tools' golden YAML, as `--pcrs` JSON.
fn golden_pcrs(name: &str) -> Value {
    let text = std::fs::read_to_string(data(&format!("tpm2-tools/{name}.pcrs.yaml"))).unwrap();
    let mut out = serde_json::Map::new();
    let mut bank = String::new();
    for line in text.lines().skip(1) {
        let t = line.trim();
        if let Some(b) = t.strip_suffix(':') {
            bank = b.to_owned();
            out.insert(bank.clone(), json!({}));
        } else if let Some((pcr, value)) = t.split_once(':') {
            out[&bank][pcr.trim()] = json!(value.trim().trim_start_matches("0x"));
        }
    }
    Value::Object(out)
}

fn write_json(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).unwrap();
    p
}

#[test]
fn show_prints_the_replayed_pcrs_and_what_was_booted() {
    let log = data("tpm2-tools/event-moklisttrusted.bin");
    let out = run_p(&[&"eventlog", &"show", &"--log", &log, &"--json"]);
    assert_ok(&out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let golden = golden_pcrs("event-moklisttrusted.bin");
    assert_eq!(v["pcrs"]["sha256"], golden["sha256"], "{v}");
    assert_eq!(v["secureBoot"]["enabled"], true);
    let paths: Vec<&str> = v["bootApps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["path"].as_str())
        .collect();
    assert!(
        paths
            .iter()
            .any(|p| p.ends_with("\\EFI\\redhat\\grubx64.efi")),
        "{paths:?}"
    );
    assert!(!v["cmdlines"].as_array().unwrap().is_empty());
    let text = stdout(&run_p(&[&"eventlog", &"show", &"--log", &log]));
    assert!(
        text.contains("secure boot: on") && text.contains("pcrs sha256:"),
        "{text}"
    );
    assert!(
        text.contains(golden["sha256"]["7"].as_str().unwrap()),
        "{text}"
    );
    // Not a log: a clear error, nonzero.
    let out = run_p(&[
        &"eventlog",
        &"show",
        &"--log",
        &data("keylime/binary_bios_measurements-bogus"),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not a TCG event log"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn verify_against_pcr_values_names_the_pcr_and_bank_that_differ() {
    let tmp = tempfile::tempdir().unwrap();
    let log = data("tpm2-tools/event-bootorder.bin");
    let golden = golden_pcrs("event-bootorder.bin");
    let good = write_json(tmp.path(), "good.json", &golden);
    let out = run_p(&[&"eventlog", &"verify", &"--log", &log, &"--pcrs", &good]);
    assert_ok(&out);
    assert!(stdout(&out).contains("verified"), "{}", stdout(&out));
    // A PCR the log never extends is reported, not failed.
    let mut extra = golden.clone();
    extra["sha256"]["16"] = json!("00".repeat(32));
    let extra = write_json(tmp.path(), "extra.json", &extra);
    let out = run_p(&[&"eventlog", &"verify", &"--log", &log, &"--pcrs", &extra]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("PCR 16 in bank sha256: not extended by the log"),
        "{}",
        stdout(&out)
    );
    // One changed value: nonzero, naming PCR and bank.
    let mut bad = golden.clone();
    bad["sha1"]["4"] = json!("11".repeat(20));
    let bad = write_json(tmp.path(), "bad.json", &bad);
    let out = run_p(&[
        &"eventlog",
        &"verify",
        &"--log",
        &log,
        &"--pcrs",
        &bad,
        &"--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(e.contains("eventlog-replay: PCR 4 in bank sha1"), "{e}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["pcrs"]["mismatches"][0]["pcr"], 4);
    assert_eq!(v["pcrs"]["mismatches"][0]["bank"], "sha1");

    // The firmware that never logged its Exit Boot Services events: only
    // through the named quirk.
    let expected: Value =
        serde_json::from_slice(&std::fs::read(data("go-attestation/expected.json")).unwrap())
            .unwrap();
    let ebs = write_json(
        tmp.path(),
        "ebs.json",
        &expected["logs"]["ebs_event_missing_eventlog"]["pcrs"],
    );
    let log = data("go-attestation/ebs_event_missing_eventlog");
    let out = run_p(&[&"eventlog", &"verify", &"--log", &log, &"--pcrs", &ebs]);
    assert!(
        stderr(&out).contains("PCR 5 in bank sha1"),
        "{}",
        stderr(&out)
    );
    let out = run_p(&[
        &"eventlog",
        &"verify",
        &"--log",
        &log,
        &"--pcrs",
        &ebs,
        &"--allow-quirk",
        &"ExitBootServicesNotLogged",
    ]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("ExitBootServicesNotLogged"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_policy_from_a_log_verifies_it_and_a_stricter_one_names_reason_and_event() {
    let tmp = tempfile::tempdir().unwrap();
    let log = data("keylime/binary_bios_measurements-secureboot");
    let out = run_p(&[&"boot-policy", &"from-log", &log]);
    assert_ok(&out);
    let policy = tmp.path().join("policy.toml");
    std::fs::write(&policy, &out.stdout).unwrap();
    assert!(
        stdout(&out).contains("secure_boot = \"required\""),
        "{}",
        stdout(&out)
    );
    let out = run_p(&[&"eventlog", &"verify", &"--log", &log, &"--policy", &policy]);
    assert_ok(&out);
    assert!(stdout(&out).contains("policy: allowed"), "{}", stdout(&out));

    // The same policy on the laptop that booted with Secure Boot off.
    let off = data("keylime/binary_bios_measurements");
    let out = run_p(&[
        &"eventlog",
        &"verify",
        &"--log",
        &off,
        &"--policy",
        &policy,
        &"--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["policy"]["reason"], "boot-secure-boot", "{v}");
    assert!(v["policy"]["event"].is_u64(), "{v}");
    assert!(
        stderr(&out).contains("refused boot-secure-boot"),
        "{}",
        stderr(&out)
    );

    // A kernel command line the policy does not allow: boot-cmdline, at
    // the event that measured it.
    let text = std::fs::read_to_string(&policy).unwrap();
    let strict: String = text
        .lines()
        .map(|l| {
            if l.starts_with("cmdline = ") {
                "cmdline = [\"BOOT_IMAGE=/vmlinuz-6.1 *\"]".to_owned()
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let strict_path = tmp.path().join("strict.toml");
    std::fs::write(&strict_path, strict).unwrap();
    let out = run_p(&[
        &"eventlog",
        &"verify",
        &"--log",
        &log,
        &"--policy",
        &strict_path,
        &"--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["policy"]["reason"], "boot-cmdline", "{v}");
    assert_eq!(v["policy"]["event"], 94, "{v}");
}

#[test]
fn a_bad_boot_policy_file_changes_no_pool() {
    let cp = ControlPlane::init_only();
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.toml");
    std::fs::write(
        &bad,
        "secure_boot = \"required\"\n[[boot_app]]\ndigest = \"nothex\"\n",
    )
    .unwrap();
    let out = cp.cli(&[
        "pools",
        "update",
        "--id",
        "default",
        "--boot-policy",
        bad.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let e = stderr(&out);
    assert!(
        e.contains("boot_app[0].digest[0]") && e.contains("the pool was not changed"),
        "{e}"
    );
    let missing = tmp.path().join("dbx.toml");
    std::fs::write(&missing, "dbx_min = \"no-such-dbx.bin\"\n").unwrap();
    let out = cp.cli(&[
        "pools",
        "update",
        "--id",
        "default",
        "--boot-policy",
        missing.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no-such-dbx.bin"), "{}", stderr(&out));
    let pools = cp.json(&["pools", "list"]);
    assert_eq!(pools[0]["bootPolicy"], Value::Null, "{pools}");

    // A good one, its dbx_min read relative to the file and stored as entries.
    let dbx = data("dbx/DBXUpdate2024.bin");
    std::fs::copy(&dbx, tmp.path().join("dbx.bin")).unwrap();
    let good = tmp.path().join("good.toml");
    std::fs::write(&good, "secure_boot = \"required\"\ndbx_min = \"dbx.bin\"\n").unwrap();
    let out = cp.cli(&[
        "pools",
        "update",
        "--id",
        "default",
        "--boot-policy",
        good.to_str().unwrap(),
    ]);
    assert_ok(&out);
    assert!(stdout(&out).contains("boot_policy=set"), "{}", stdout(&out));
    let pools = cp.json(&["pools", "list"]);
    let stored = pools[0]["bootPolicy"].as_str().unwrap();
    assert!(
        stored.contains("dbx_min_entries") && !stored.contains("dbx.bin"),
        "{stored}"
    );
    let out = cp.cli(&["pools", "update", "--id", "default", "--no-boot-policy"]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("boot_policy=none"),
        "{}",
        stdout(&out)
    );
}

/// A swtpm's quote over PCR 7 after the log's events were extended into
/// it, as firmware would have: verify checks signature, nonce and digest.
#[test]
fn verify_checks_a_tpm2_quote_under_its_ak() {
    let tpm = Swtpm::start();
    let tmp = tempfile::tempdir().unwrap();
    let p = |n: &str| tmp.path().join(n).to_string_lossy().into_owned();
    let log = data("tpm2-tools/event-uefivar.bin");
    let shown: Value =
        serde_json::from_slice(&run_p(&[&"eventlog", &"show", &"--log", &log, &"--json"]).stdout)
            .unwrap();
    for e in shown["events"].as_array().unwrap() {
        if e["type"] == 3 {
            continue; // EV_NO_ACTION: never extended
        }
        let spec = format!(
            "{}:sha256={}",
            e["pcr"],
            e["digests"]["sha256"].as_str().unwrap()
        );
        assert_ok(&tpm.tool("tpm2_pcrextend", &[&spec]));
    }
    let flush = || {
        assert_ok(&tpm.tool("tpm2_flushcontext", &["-t"]));
        assert_ok(&tpm.tool("tpm2_flushcontext", &["-s"]));
    };
    assert_ok(&tpm.tool("tpm2_createek", &["-c", &p("ek.ctx"), "-G", "rsa"]));
    flush();
    assert_ok(&tpm.tool(
        "tpm2_createak",
        &[
            "-C",
            &p("ek.ctx"),
            "-c",
            &p("ak.ctx"),
            "-G",
            "ecc",
            "-g",
            "sha256",
            "-s",
            "ecdsa",
            "-u",
            &p("ak.pub"),
        ],
    ));
    flush();
    assert_ok(&tpm.tool(
        "tpm2_quote",
        &[
            "-c",
            &p("ak.ctx"),
            "-l",
            "sha256:7",
            "-q",
            "c0ffee",
            "-m",
            &p("quote.msg"),
            "-s",
            &p("quote.sig"),
            "-g",
            "sha256",
        ],
    ));
    flush();
    assert_ok(&tpm.tool(
        "tpm2_readpublic",
        &["-c", &p("ak.ctx"), "-o", &p("ak.pem"), "-f", "pem"],
    ));
    flush();
    let pcr7 = shown["pcrs"]["sha256"]["7"].clone();
    write_json(tmp.path(), "pcrs.json", &json!({"sha256": {"7": pcr7}}));
    for ak in ["ak.pub", "ak.pem"] {
        let out = run(&[
            "eventlog",
            "verify",
            "--log",
            log.to_str().unwrap(),
            "--pcrs",
            &p("pcrs.json"),
            "--quote",
            &p("quote.msg"),
            "--sig",
            &p("quote.sig"),
            "--ak",
            &p(ak),
            "--nonce",
            "c0ffee",
        ]);
        assert_ok(&out);
        assert!(
            stdout(&out).contains("quote: verifies under the AK"),
            "{ak}: {}",
            stdout(&out)
        );
    }
    // Another nonce, and PCR values the quote did not sign.
    let out = run(&[
        "eventlog",
        "verify",
        "--log",
        log.to_str().unwrap(),
        "--pcrs",
        &p("pcrs.json"),
        "--quote",
        &p("quote.msg"),
        "--sig",
        &p("quote.sig"),
        "--ak",
        &p("ak.pub"),
        "--nonce",
        "c0ffef",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("quote-nonce"), "{}", stderr(&out));
    let other = write_json(
        tmp.path(),
        "other.json",
        &json!({"sha256": {"7": "11".repeat(32)}}),
    );
    let out = run_p(&[
        &"eventlog",
        &"verify",
        &"--log",
        &log,
        &"--pcrs",
        &other,
        &"--quote",
        &p("quote.msg"),
        &"--sig",
        &p("quote.sig"),
        &"--ak",
        &p("ak.pub"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let e = stderr(&out);
    assert!(
        e.contains("quote-pcrs") && e.contains("PCR 7 in bank sha256"),
        "{e}"
    );
}
