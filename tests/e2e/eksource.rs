//! Where a TPM's EK certificate comes from when NV holds none (issue 18,
//! second half): an operator's pin of an uncertified EK (`resolve add
//! --uncertified`).

use crate::harness::*;
use crate::maker::nv_remove;

/// A TPM whose maker put no EK certificate in NV (NitroTPM, Intel PTT on
/// many platforms): swtpm's RSA and P-384 EK certificates removed.
pub(crate) fn without_ek_certificates(tpm: &Swtpm) {
    nv_remove(tpm, "0x01c00002");
    nv_remove(tpm, "0x01c00016");
}

#[test]
fn an_uncertified_ek_joins_only_when_pinned_so() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    without_ek_certificates(&tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    let id = agent.identify();
    assert_eq!(id["ekCertificate"]["present"], false, "{id}");
    let ek = id["ekSha256"].as_str().unwrap().to_owned();
    let text = stdout(&agent.run(&["tpm", "identify"]));
    assert!(
        text.contains(&format!("resolve add --ek-sha256 {ek} --uncertified")),
        "{text}"
    );
    // bcd doctor says what this machine will join with, and what to do.
    let doctor = stdout(&agent.run(&["doctor"]));
    assert!(
        doctor.contains("warn  ek certificate: none in NV")
            && doctor.contains(&format!("no EK certificate in NV: set [tpm] ek_certificate to the maker's certificate for this EK, or ask the operator to pin the EK with resolve add --ek-sha256 {ek} --uncertified")),
        "{doctor}"
    );

    // Unknown, and without a certificate: ek-chain, nothing written.
    let out = cp.refused_once(Refusal::Join("tpm"), "ek-chain", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    agent.assert_nothing_written();

    // Allow-listed, but not as uncertified: still ek-chain.
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek]));
    let out = cp.refused_once(Refusal::Join("tpm"), "ek-chain", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    assert_eq!(cp.refusal_reasons().len(), 2);

    // Pinned as uncertified: that EK joins, with a certified node key.
    let out = cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--uncertified"]);
    assert_ok(&out);
    assert!(stdout(&out).ends_with(" uncertified\n"), "{}", stdout(&out));
    let listed = cp.json(&["resolve", "list"]);
    assert_eq!(listed[0]["uncertified"], true, "{listed}");
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let node = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let nodes = cp.nodes();
    assert!(
        nodes.iter().any(|n| n["nodeId"] == node.as_str()),
        "{nodes:?}"
    );

    // The pin is for that EK alone: another uncertified TPM is refused.
    let other = Swtpm::start_another_machine();
    without_ek_certificates(&other);
    let stranger = Agent::with_tpm(&cp, &other);
    assert_access_denied(&cp.refused_once(Refusal::Join("tpm"), "ek-chain", || {
        stranger.run(&["join", "--attestor", "tpm"])
    }));
}

/// A pinned EK that sends a certificate is verified as usual: the pin is
/// no way around a certificate the control plane does not trust.
#[test]
fn a_pinned_ek_that_sends_a_certificate_is_verified() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start_other_maker();
    let agent = Agent::with_tpm(&cp, &tpm);
    let ek = agent.identify()["ekSha256"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--uncertified"]));
    assert_access_denied(&cp.refused_once(Refusal::Join("tpm"), "ek-chain", || {
        agent.run(&["join", "--attestor", "tpm"])
    }));
}

/// The EK certificate in NV index `index`, DER (swtpm's index is exactly
/// its size).
fn nv_certificate(tpm: &Swtpm, index: &str) -> Vec<u8> {
    let file = tpm.dir.path().join(format!("read-{index}"));
    assert_ok(&tpm.tool("tpm2_nvread", &[index, "-o", &file.to_string_lossy()]));
    std::fs::read(file).unwrap()
}

/// Appends `line` to the agent's `[tpm]` table (its config's last).
fn tpm_setting(agent: &Agent, line: &str) {
    let config = std::fs::read_to_string(&agent.config).unwrap();
    std::fs::write(&agent.config, format!("{config}{line}\n")).unwrap();
}

/// `[tpm] ek_certificate`: the maker's certificate for this EK as a file
/// (here the one NV held, moved out of NV), PEM or DER.
#[test]
fn an_operator_ek_certificate_file_joins() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let der = nv_certificate(&tpm, "0x01c00002");
    without_ek_certificates(&tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    let file = agent.root.path().join("ek.pem");
    std::fs::write(
        &file,
        ::pem::encode(&::pem::Pem::new("CERTIFICATE", der.clone())),
    )
    .unwrap();
    tpm_setting(&agent, &format!("ek_certificate = \"{}\"", file.display()));

    let id = agent.identify();
    assert_eq!(id["ekCertificate"]["present"], true, "{id}");
    assert_eq!(id["ekCertificate"]["source"], "operator-file", "{id}");
    assert_eq!(id["ekMatchesCertificate"], true, "{id}");
    let text = stdout(&agent.run(&["tpm", "identify"]));
    assert!(
        text.contains(&format!("(from [tpm] ek_certificate {})", file.display())),
        "{text}"
    );
    let doctor = stdout(&agent.run(&["doctor"]));
    assert!(
        doctor.contains(
            "ok    ek certificate: joins as operator-file: from [tpm] ek_certificate, issued by"
        ),
        "{doctor}"
    );
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));

    // DER works the same.
    let other = Swtpm::start_another_machine();
    let der_b = nv_certificate(&other, "0x01c00002");
    without_ek_certificates(&other);
    let b = Agent::with_tpm(&cp, &other);
    let file_b = b.root.path().join("ek.der");
    std::fs::write(&file_b, &der_b).unwrap();
    tpm_setting(&b, &format!("ek_certificate = \"{}\"", file_b.display()));
    b.allow_ek(&cp);
    assert_ok(&b.run(&["join", "--attestor", "tpm"]));
    assert!(
        cp.refusal_reasons().is_empty(),
        "{:?}",
        cp.refusal_reasons()
    );
}

/// Another TPM's certificate, or a file that is no certificate: a clear
/// error naming the file, before anything is sent.
#[test]
fn a_wrong_operator_ek_certificate_is_an_error_before_anything_is_sent() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    without_ek_certificates(&tpm);
    let other = Swtpm::start_another_machine();
    let theirs = nv_certificate(&other, "0x01c00002");
    let agent = Agent::with_tpm(&cp, &tpm);
    let file = agent.root.path().join("ek.der");
    std::fs::write(&file, &theirs).unwrap();
    tpm_setting(&agent, &format!("ek_certificate = \"{}\"", file.display()));
    let out = agent.run(&["join", "--attestor", "tpm"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "[tpm] ek_certificate {}: it is not this TPM's EK certificate",
            file.display()
        )),
        "{err}"
    );
    let out = agent.run(&["tpm", "identify"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("it is not this TPM's EK certificate"),
        "{}",
        stderr(&out)
    );

    std::fs::write(&file, b"not a certificate\n").unwrap();
    let out = agent.run(&["join", "--attestor", "tpm"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("neither a DER certificate nor PEM"),
        "{}",
        stderr(&out)
    );
    let doctor = stdout(&agent.run(&["doctor"]));
    assert!(
        doctor.contains("fail  ek certificate: [tpm] ek_certificate")
            && doctor.contains("neither a DER certificate nor PEM"),
        "{doctor}"
    );
    agent.assert_nothing_written();
    // Nothing reached the control plane.
    assert!(cp.refusals().is_empty(), "{:?}", cp.refusals());
    assert!(cp
        .json(&["requests", "list"])
        .as_array()
        .unwrap()
        .is_empty());
}

/// `[tpm] ek_certificate` naming a FIFO (the join blocked for ever) or a
/// link to /dev/zero (read until memory ran out): a prompt error naming the
/// file and why, nonzero exit, nothing written, nothing sent.
#[test]
fn an_operator_ek_certificate_that_is_no_regular_file_is_refused_promptly() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    without_ek_certificates(&tpm);
    let agent = Agent::with_tpm(&cp, &tpm);
    let fifo = agent.root.path().join("ek.fifo");
    assert_ok(&std::process::Command::new("mkfifo").arg(&fifo).within());
    let zero = agent.root.path().join("ek.pem");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let config = std::fs::read_to_string(&agent.config).unwrap();
    for (file, why) in [
        (&fifo, "it is a FIFO, not a regular file"),
        (
            &zero,
            "it is a symbolic link, which is not followed here: name the file itself",
        ),
    ] {
        std::fs::write(
            &agent.config,
            format!("{config}ek_certificate = \"{}\"\n", file.display()),
        )
        .unwrap();
        let out = output_within(
            agent.command(&["join", "--attestor", "tpm"]),
            std::time::Duration::from_secs(30),
        );
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(
            err.contains(&format!("[tpm] ek_certificate {}: {why}", file.display())),
            "{err}"
        );
        agent.assert_nothing_written();
    }
    assert!(cp.refusals().is_empty(), "{:?}", cp.refusals());
}

/// The `node.joined` event's, the joins row's and `nodes list`'s EK
/// assurance of `node`.
fn recorded_assurance(cp: &ControlPlane, node: &str) -> (String, String, String, String) {
    let event = cp
        .events()
        .into_iter()
        .rev()
        .find(|e| e["type"] == "node.joined" && e["nodeId"] == node)
        .unwrap();
    let db = rusqlite::Connection::open(cp.path().join("controlplane.db")).unwrap();
    let row: String = db
        .query_row(
            "SELECT ek_assurance FROM joins WHERE node_id = ?1 ORDER BY id DESC LIMIT 1",
            [node],
            |r| r.get(0),
        )
        .unwrap();
    let listed = cp
        .nodes()
        .into_iter()
        .find(|n| n["nodeId"] == node)
        .unwrap();
    let text = stdout(&cp.cli(&["nodes", "list"]));
    let line = text
        .lines()
        .find(|l| l.starts_with(node))
        .unwrap()
        .to_owned();
    (
        event["data"]["ekAssurance"].as_str().unwrap().to_owned(),
        row,
        listed["ekAssurance"].as_str().unwrap().to_owned(),
        line,
    )
}

fn node_id(agent: &Agent) -> String {
    agent.status_json()["nodeId"].as_str().unwrap().to_owned()
}

/// Every tpm join records where its EK certificate came from, and a pool
/// may require a minimum (`pools update --min-ek-assurance`).
#[test]
fn the_ek_assurance_is_recorded_and_a_pool_may_require_a_minimum() {
    let cp = ControlPlane::start_trusting_test_maker();
    // From NV.
    let nv_tpm = Swtpm::start();
    let nv = Agent::tpm_joined(&cp, &nv_tpm);
    let (event, row, listed, line) = recorded_assurance(&cp, &node_id(&nv));
    assert_eq!(
        (event.as_str(), row.as_str(), listed.as_str()),
        ("nv", "nv", "nv")
    );
    assert!(line.ends_with(" ek=nv"), "{line}");

    // A pool that requires operator-file or better.
    assert_ok(&cp.cli(&["pools", "create", "--id", "metal"]));
    let out = cp.cli(&[
        "pools",
        "update",
        "--id",
        "metal",
        "--min-ek-assurance",
        "best",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not one of pinned, operator-file, maker-service, nv-chain, nv"),
        "{}",
        stderr(&out)
    );
    let out = cp.cli(&[
        "pools",
        "update",
        "--id",
        "metal",
        "--min-ek-assurance",
        "operator-file",
    ]);
    assert_ok(&out);
    assert!(
        stdout(&out).contains("min_ek_assurance=operator-file"),
        "{}",
        stdout(&out)
    );

    // Pinned (no certificate): below the pool's minimum.
    let pinned_tpm = Swtpm::start_another_machine();
    without_ek_certificates(&pinned_tpm);
    let pinned = Agent::with_tpm(&cp, &pinned_tpm);
    let ek = pinned.identify()["ekSha256"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&[
        "resolve",
        "add",
        "--ek-sha256",
        &ek,
        "--uncertified",
        "--pool",
        "metal",
    ]));
    let out = cp.refused_once(Refusal::Join("tpm"), "join:pool-ek-assurance", || {
        pinned.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    pinned.assert_nothing_written();
    // Into the default pool, it joins pinned.
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--uncertified"]));
    assert_ok(&pinned.run(&["join", "--attestor", "tpm"]));
    let (event, row, listed, _) = recorded_assurance(&cp, &node_id(&pinned));
    assert_eq!(
        (event.as_str(), row.as_str(), listed.as_str()),
        ("pinned", "pinned", "pinned")
    );

    // An operator's file meets it.
    let file_tpm = Swtpm::start_sha1_only();
    let der = nv_certificate(&file_tpm, "0x01c00002");
    without_ek_certificates(&file_tpm);
    let filed = Agent::with_tpm(&cp, &file_tpm);
    let file = filed.root.path().join("ek.der");
    std::fs::write(&file, &der).unwrap();
    tpm_setting(&filed, &format!("ek_certificate = \"{}\"", file.display()));
    let ek = filed.identify()["ekSha256"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek, "--pool", "metal"]));
    assert_ok(&filed.run(&["join", "--attestor", "tpm"]));
    let (event, row, listed, _) = recorded_assurance(&cp, &node_id(&filed));
    assert_eq!(
        (event.as_str(), row.as_str(), listed.as_str()),
        ("operator-file", "operator-file", "operator-file")
    );
    let pool = cp
        .json(&["pools", "list"])
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "metal")
        .cloned()
        .unwrap();
    assert_eq!(pool["policy"]["minEkAssurance"], "operator-file", "{pool}");

    // A token join proves no EK: refused by such a pool.
    let token = cp.token("node", &["--pool", "metal"]);
    let t = Agent::new(&cp);
    assert_access_denied(&cp.refused_once(
        Refusal::Join("join-token"),
        "join:pool-ek-assurance",
        || t.join_with_token(&token),
    ));
}
