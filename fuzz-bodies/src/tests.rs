//! The regression corpus on stable, and the seeds it started from.

use std::path::{Path, PathBuf};

use super::*;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

/// Every file of `fuzz/corpus/<target>/` through its target's body: what
/// the fuzzer kept (and every crash it found) must not panic.
#[test]
fn corpus_replays_without_panic() {
    let mut total = 0;
    for (name, body) in TARGETS {
        let dir = corpus_dir().join(name);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e} (every target has a corpus)", dir.display()));
        let mut n = 0;
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| body(&data));
            assert!(outcome.is_ok(), "{name}: {} panics", path.display());
            n += 1;
        }
        assert!(n > 0, "{name}: empty corpus");
        total += n;
    }
    eprintln!("{total} corpus inputs replayed");
}

fn seed(target: &str, name: &str) -> Vec<u8> {
    std::fs::read(corpus_dir().join(target).join(format!("seed-{name}"))).unwrap()
}

/// The seeds pass the checks their fixtures are made for (a captured TPM's
/// hello is challenged, its certified next key renews, a signed answer is
/// accepted), so the fuzzer starts deep; a fixture that drifts shows here
/// rather than as a fuzzer that silently stops at the first check.
#[test]
fn seeds_reach_past_the_first_checks() {
    let (challenged, renewed) = controlplane::harness_outcomes(
        &seed("join_request", "tpm-hello"),
        &seed("renew_request", "tpm"),
    )
    .unwrap();
    assert!(challenged && renewed);

    let node_spki = fixtures::node_spki();
    let expected = bcd::client::answer::Expected {
        signing_key: fixtures::service_key().verifying_key(),
        csr_sha256: bc_wire::sha256(fixtures::AGENT_CSR),
        node_spki,
        trust_domain: fixtures::TRUST_DOMAIN,
    };
    let body = seed("join_answer", "joined-body");
    let opened = bcd::client::answer::read_body(&body[1..], &expected).unwrap();
    bcd::client::answer::verify_final(opened, &expected).unwrap();

    let evidence =
        bc_wire::x509pop::Evidence::from_json(&seed("x509pop_evidence", "proof")).unwrap();
    evidence
        .verify(node_spki, &bc_wire::sha256(fixtures::AGENT_CSR))
        .unwrap();
    let ek = seed("ek_cert", "captured");
    let [cert, public] = split_parts(&ek);
    let mut roots =
        bc_controlplane::attestors::tpm::ek::parse_roots_pem(fixtures::EK_ROOT_PEM).unwrap();
    roots.extend(
        bc_controlplane::attestors::tpm::ek::parse_roots_pem(fixtures::EK_INTERMEDIATE_PEM)
            .unwrap(),
    );
    bc_controlplane::attestors::tpm::ek::verify_ek(
        cert,
        public,
        &bc_controlplane::attestors::tpm::ek::EkTrust::anchors(roots),
        &[],
        fixtures::captured_at(),
    )
    .unwrap();
}

/// A target without a body, or a body without a target, would go unfuzzed
/// or untested.
#[test]
fn every_fuzz_target_has_a_body() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/fuzz_targets");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut names: Vec<String> = TARGETS.iter().map(|(n, _)| format!("{n}.rs")).collect();
    names.sort();
    assert_eq!(files, names);
}

#[test]
fn parts_split_as_joined() {
    let joined = join_parts(&[b"ab", b"", b"cde"]);
    assert_eq!(split_parts::<3>(&joined), [&b"ab"[..], b"", b"cde"]);
    assert_eq!(split_parts::<3>(&[0, 9, 1]), [&[1u8][..], b"", b""]);
    assert_eq!(split_parts::<2>(&[]), [&b""[..], b""]);
}

/// Writes the seed inputs into `fuzz/corpus/<target>/seed-*` from the real
/// fixtures (captured TPM output, certificates the control plane's own CA
/// issues, sample configs). Run by hand before a first fuzzing run:
/// `cargo test -p bc-fuzz -- --ignored write_seeds`.
#[test]
#[ignore]
fn write_seeds() {
    seeds::write(&corpus_dir());
}

mod seeds;
