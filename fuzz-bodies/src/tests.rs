//! The regression corpus on stable, and the seeds it started from.

use std::path::{Path, PathBuf};

use super::*;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}

/// Every file of `fuzz/corpus/<target>/`, with its path, sorted by name.
fn corpus(name: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = corpus_dir().join(name);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e} (every target has a corpus)", dir.display()));
    let mut files: Vec<(PathBuf, Vec<u8>)> = entries
        .map(|entry| {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            (path, data)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{name}: empty corpus");
    files
}

/// Every file of `fuzz/corpus/<target>/` through its target's body: what
/// the fuzzer kept (and every crash it found) must not panic.
#[test]
fn corpus_replays_without_panic() {
    let mut total = 0;
    for (name, body) in TARGETS {
        let files = corpus(name);
        for (path, data) in &files {
            let outcome = std::panic::catch_unwind(|| body(data));
            assert!(outcome.is_ok(), "{name}: {} panics", path.display());
        }
        total += files.len();
    }
    eprintln!("{total} corpus inputs replayed");
}

/// The whole budget of [`fresh_inputs_hold_every_invariant`], shared by the
/// targets: `BC_FUZZ_MS` (milliseconds), 2 s by default.
fn fresh_budget() -> std::time::Duration {
    let ms = std::env::var("BC_FUZZ_MS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(2_000u64);
    std::time::Duration::from_millis(ms)
}

/// Every target's body on freshly generated inputs: the corpus replay only
/// proves that old inputs still pass, while a parser change can make a
/// body's assertion stale for inputs no one kept. First, deterministically,
/// every corpus entry with each algorithm id or tag in its headers swapped
/// for each other one ([`random::swaps`]: how a value the parser newly
/// accepts shows); then the corpus mutated at random for the target's share
/// of a few seconds. A failure prints the input and, for the random part,
/// the seed that replays it (`BC_FUZZ_SEED=<seed> cargo test -p bc-fuzz
/// fresh_inputs`).
#[test]
fn fresh_inputs_hold_every_invariant() {
    let seed = random::seed();
    let share = fresh_budget() / TARGETS.len() as u32;
    let mut report = Vec::new();
    for (name, body) in TARGETS {
        let corpus: Vec<Vec<u8>> = corpus(name).into_iter().map(|(_, d)| d).collect();
        let run = |data: &[u8], what: &str| {
            let outcome = std::panic::catch_unwind(|| body(data));
            assert!(
                outcome.is_ok(),
                "{name}: {what} panics (add it to fuzz/corpus/{name}/); input (hex): {}",
                random::hex(data)
            );
        };
        let mut swapped = 0;
        for (i, entry) in corpus.iter().enumerate() {
            for variant in random::swaps(entry) {
                run(&variant, &format!("a swap of corpus entry {i}"));
                swapped += 1;
            }
        }
        let mut rng = random::target_rng(seed, name);
        let start = std::time::Instant::now();
        let mut runs: u64 = 0;
        while runs == 0 || start.elapsed() < share {
            let data = random::input(&mut rng, &corpus);
            run(
                &data,
                &format!(
                    "random input {runs} (replay: BC_FUZZ_SEED={seed} cargo test -p bc-fuzz fresh_inputs)"
                ),
            );
            runs += 1;
        }
        report.push(format!("{name} {swapped}+{runs}"));
    }
    eprintln!(
        "fresh inputs (swaps+random, seed {seed}): {}",
        report.join(", ")
    );
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
    // Every attestor's join seed gets past its evidence checks (the cloud
    // ones are admitted: signed, fresh, resolved).
    for name in ["cloud-gcp", "cloud-aws"] {
        let (joined, _) = controlplane::harness_outcomes(
            &seed("join_request", name),
            &seed("renew_request", "tpm"),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(joined, "{name}");
    }

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
    // The cloud documents are admitted (signed by the test keys, fresh at
    // the targets' clock), so the fuzzer starts past the signature.
    let cloud = |target: &str, name: &str| {
        let s = seed(target, name);
        String::from_utf8(s[1..].to_vec()).unwrap()
    };
    let fresh = bc_controlplane::attestors::cloud_iid::Freshness {
        now: cloud::NOW_MS,
        max_age_ms: 10 * 60 * 1000,
    };
    let gcp_keys = bc_controlplane::attestors::cloud_iid::gcp::parse_jwks(include_bytes!(
        "../../tpmsim-fixtures/cloud-gcp-jwks.json"
    ))
    .unwrap();
    bc_controlplane::attestors::cloud_iid::gcp::verify(
        &gcp_keys,
        &cloud("gcp_token", "jwt"),
        fixtures::AUDIENCE,
        &fresh,
    )
    .unwrap();
    bc_controlplane::attestors::cloud_iid::azure::identity(
        cloud("azure_document", "content").as_bytes(),
        fixtures::AUDIENCE,
        &fresh,
    )
    .unwrap();
    let aws = seed("aws_document", "signed");
    let [doc, sig] = split_parts(&aws[1..]);
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("aws.pem");
    std::fs::write(&pem, include_bytes!("../../tpmsim-fixtures/cloud-aws.pem")).unwrap();
    let aws_keys = bc_controlplane::attestors::cloud_iid::aws::load_certificates(&pem).unwrap();
    bc_controlplane::attestors::cloud_iid::aws::verify(
        &aws_keys,
        std::str::from_utf8(doc).unwrap(),
        Some(std::str::from_utf8(sig).unwrap()),
    )
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

/// The site's seeds reach the parsers' ends: the command line joins, the
/// query is a MAC and a UUID.
#[test]
fn site_seeds_parse() {
    let line = String::from_utf8(seed("ramdisk_cmdline", "booted")).unwrap();
    let d = bcd::evidence::discovery::parse_cmdline(&line).unwrap();
    bc_wire::site::parse_signed(&d.assertion).unwrap();
    let q = bcd::site::render::parse_query(
        "mac=52%3A54%3A00%3A12%3A34%3A56&uuid=4C4C4544-0042-3510-8052-B4C04F4E4D32",
    )
    .unwrap();
    assert!(q.uuid.is_some());
    assert!(String::from_utf8_lossy(&seed("site_request", "ipxe"))
        .contains("mac=52%3A54%3A00%3A12%3A34%3A56&uuid=4C4C4544-0042-3510-8052-B4C04F4E4D32 "));
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

/// [`write_seeds`] for the command channel's two targets only:
/// `cargo test -p bc-fuzz -- --ignored write_command_seeds`.
#[test]
#[ignore]
fn write_command_seeds() {
    seeds::write_command(&corpus_dir());
}

/// The command channel's seeds verify: the bodies' checks past the
/// signatures are reached from the start.
#[test]
fn command_seeds_verify() {
    use bc_wire::command::channel::{parse_agent_frame, parse_server_frame};
    use bc_wire::command_v1::{agent_frame, server_frame};
    let Ok(server_frame::Frame::Command(cmd)) =
        parse_server_frame(&seed("channel_server_frame", "wipe")[1..])
    else {
        panic!("the wipe seed is a command frame");
    };
    let scope = bc_wire::command::Scope::from_statements(&["urn:bc:scope:ramdisk"]).unwrap();
    let key = *fixtures::service_key().verifying_key();
    let v = bc_wire::command::verify(
        &cmd,
        &bc_wire::command::Expect {
            signing_key: &key,
            node_id: fixtures::NODE_ID,
            scope: &scope,
            now_ms: command::NOW_MS,
        },
    )
    .unwrap();
    assert_eq!(v.kind().name, "disk.wipe");
    let Ok(agent_frame::Frame::Result(r)) =
        parse_agent_frame(&seed("channel_agent_frame", "result"))
    else {
        panic!("the result seed is a result frame");
    };
    bc_wire::command::verify_result(&r, fixtures::node_spki(), fixtures::NODE_ID).unwrap();
    let Ok(agent_frame::Frame::Proof(p)) = parse_agent_frame(&seed("channel_agent_frame", "proof"))
    else {
        panic!("the proof seed is a proof frame");
    };
    bc_wire::command::channel::verify_proof(
        &p,
        &bc_wire::command::channel::ProofExpect {
            nonce: &command::NONCE,
            node_id: fixtures::NODE_ID,
            node_spki: fixtures::node_spki(),
            now_ms: command::NOW_MS,
        },
    )
    .unwrap();
}

/// [`write_seeds`] for the site's two targets only:
/// `cargo test -p bc-fuzz -- --ignored write_site_seeds`.
#[test]
#[ignore]
fn write_site_seeds() {
    seeds::write_site(&corpus_dir());
}

/// [`write_seeds`] for the deploy and boot policy targets only:
/// `cargo test -p bc-fuzz -- --ignored write_deploy_seeds`.
#[test]
#[ignore]
fn write_deploy_seeds() {
    seeds::write_deploy(&corpus_dir());
}

/// The deploy and boot policy seeds reach past the first checks: the
/// workflow's seed is accepted on both sides, the images decode, the
/// policies parse.
#[test]
fn deploy_seeds_parse() {
    let doc = seed("deploy_seed", "workflow");
    bc_controlplane::deploy::check_seed(&doc).unwrap();
    let sha: String = bc_wire::sha256(&doc)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    bcd::DeploySeed::parse(&doc, &sha).unwrap();
    for name in ["frame", "frames"] {
        let s = seed("deploy_image", name);
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut bc_wire::image::Decoder::new(&s[1..]), &mut out).unwrap();
        assert!(!out.is_empty(), "{name}");
    }
    for name in ["from-facts", "every-key"] {
        let text = String::from_utf8(seed("boot_policy", name)).unwrap();
        let p = bc_controlplane::boot_policy::BootPolicy::parse_stored(&text).unwrap();
        assert!(!p.is_empty(), "{name}");
    }
}

mod random;
mod seeds;
