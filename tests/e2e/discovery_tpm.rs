//! A PXE ramdisk proving its TPM beside discovery, and the boot entries
//! that admit only one machine's TPM (`boot add --ek-sha256`, `--node`).
//! A thief on the boot LAN that got the victim's command line (its token
//! and assertion: what `bcd site` hands whoever asks for the victim's MAC)
//! and claims the victim's MAC and UUID joins with another TPM or with
//! none: refused, the entry stays open, and the victim then commissions.

use bcd::identity::Identity;
use bcd::keys::TpmAccess;
use serde_json::Value;

use crate::discovery::{boot_add, boot_state, site, Machine, SiteNode, MAC, UUID};
use crate::harness::*;

/// A ramdisk machine with this TPM.
fn machine_with(cp: &ControlPlane, tpm: &Swtpm) -> Machine {
    let m = Machine::new(cp, MAC, UUID);
    m.agent.set_tpm(tpm);
    m
}

fn node(cp: &ControlPlane, id: &str) -> Value {
    cp.nodes()
        .into_iter()
        .find(|n| n["nodeId"] == id)
        .expect("the node is listed")
}

/// The ramdisk joined with its TPM proven: the AK statement in its
/// certificate, the node key certified, the EK as its hardware key (but
/// bound to nothing). Returns its node id.
#[track_caller]
fn assert_joined_with_tpm(
    cp: &ControlPlane,
    m: &Machine,
    tpm: &Swtpm,
    out: &std::process::Output,
) -> String {
    assert_ok(out);
    let id = Identity::load(&m.agent.data_dir, &TpmAccess::new(Some(&tpm.tcti())))
        .unwrap()
        .unwrap();
    assert!(stdout(out).contains(&format!("joined as {}", id.node_id)));
    let sans = uri_sans(&id.chain[0]);
    assert!(
        sans.iter().any(|u| u.starts_with("urn:bc:tpm-ak:sha256:")),
        "{sans:?}"
    );
    let n = node(cp, &id.node_id);
    assert_eq!(n["role"], "ramdisk");
    assert_eq!(n["attestor"], "discovery");
    assert_eq!(n["nodeKey"], "tpm");
    assert_eq!(n["ekAssurance"], "nv");
    let ek = m.agent.identify()["ekSha256"].as_str().unwrap().to_owned();
    assert_eq!(n["hardwareKey"], format!("tpm-ek:{ek}"));
    assert_eq!(
        n["bindings"],
        serde_json::json!([]),
        "a ramdisk binds no EK"
    );
    id.node_id
}

/// The thief's two tries on `wf`: with another TPM (refused `other_tpm`),
/// then with none (`no_tpm`); the entry stays open.
fn thief_is_refused(
    cp: &ControlPlane,
    holder: &SiteNode,
    epoch: u64,
    wf: &str,
    [other_tpm, no_tpm]: [&str; 2],
) {
    let other = Swtpm::start_another_machine();
    let thief = machine_with(cp, &other);
    let line = holder.boot_line(epoch, wf, MAC, UUID);
    crate::discovery::assert_refused_as(
        cp,
        Refusal::Join("discovery"),
        || thief.boot(&line),
        other_tpm,
    );
    thief.agent.assert_nothing_written();
    let bare = Machine::new(cp, MAC, UUID);
    let line = holder.boot_line(epoch, wf, MAC, UUID);
    crate::discovery::assert_refused_as(
        cp,
        Refusal::Join("discovery"),
        || bare.boot(&line),
        no_tpm,
    );
    bare.agent.assert_nothing_written();
    assert_eq!(boot_state(cp, wf), "vouched", "the entry stays open");
}

/// Policy 1: `boot add --ek-sha256` of the victim's EK.
#[test]
fn an_entry_that_expects_an_ek_admits_only_that_tpm() {
    let cp = ControlPlane::start_trusting_test_maker();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let victim_tpm = Swtpm::start();
    let victim = machine_with(&cp, &victim_tpm);
    let ek = victim.agent.identify()["ekSha256"]
        .as_str()
        .unwrap()
        .to_owned();

    // Bad input: nothing written.
    let out = cp.cli(&[
        "boot",
        "add",
        "--site",
        "dc1",
        "--mac",
        MAC,
        "--ek-sha256",
        "abc",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("64 hex digits"), "{}", stderr(&out));
    assert_eq!(cp.json(&["boot", "list"]), serde_json::json!([]));

    let wf = boot_add(
        &cp,
        "dc1",
        MAC,
        &["--product-uuid", UUID, "--ek-sha256", &ek.to_uppercase()],
    );
    let listed = cp.json(&["boot", "list"]);
    assert_eq!(listed[0]["ekSha256"], ek.as_str());

    thief_is_refused(
        &cp,
        &holder,
        epoch,
        &wf,
        ["boot-ek-mismatch", "boot-ek-missing"],
    );

    let line = holder.boot_line(epoch, &wf, MAC, UUID);
    let out = victim.boot(&line);
    let node_id = assert_joined_with_tpm(&cp, &victim, &victim_tpm, &out);
    assert_eq!(boot_state(&cp, &wf), "joined");
    // Its renewal proves the next key with the same AK.
    assert_ok(&victim.agent.run(&["node", "--once", "--renew-now"]));
    let renewed = Identity::load(
        &victim.agent.data_dir,
        &TpmAccess::new(Some(&victim_tpm.tcti())),
    )
    .unwrap()
    .unwrap();
    assert_eq!(renewed.node_id, node_id);
    assert!(uri_sans(&renewed.chain[0])
        .iter()
        .any(|u| u.starts_with("urn:bc:tpm-ak:")));
}

/// Policy 2: `boot add --node N` re-commissions N: only N's TPM may answer.
#[test]
fn an_entry_for_a_known_node_admits_only_its_tpm() {
    let cp = ControlPlane::start_trusting_test_maker();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let victim_tpm = Swtpm::start();
    // N: the installed system of the victim machine, joined with its TPM.
    let installed = Agent::with_tpm(&cp, &victim_tpm);
    let ek = installed.identify()["ekSha256"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek]));
    assert_ok(&installed.run(&["join", "--attestor", "tpm"]));
    let n = installed.status_json()["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();

    // --node of what cannot be re-commissioned: a clear error, no entry.
    for (bad, says) in [
        ("node_nosuch", "no such node"),
        (holder.identity().node_id.as_str(), "bound to no EK"),
    ] {
        let out = cp.cli(&["boot", "add", "--site", "dc1", "--mac", MAC, "--node", bad]);
        assert!(!out.status.success(), "{bad}");
        assert!(stderr(&out).contains(says), "{bad}: {}", stderr(&out));
    }
    let out = cp.cli(&[
        "boot",
        "add",
        "--site",
        "dc1",
        "--mac",
        MAC,
        "--node",
        &n,
        "--ek-sha256",
        &"ab".repeat(32),
    ]);
    assert!(stderr(&out).contains("is not the EK"), "{}", stderr(&out));
    assert_eq!(cp.json(&["boot", "list"]), serde_json::json!([]));

    let wf = boot_add(&cp, "dc1", MAC, &["--node", &n]);
    assert_eq!(cp.json(&["boot", "list"])[0]["ekSha256"], ek.as_str());
    thief_is_refused(
        &cp,
        &holder,
        epoch,
        &wf,
        ["boot-ek-mismatch", "boot-ek-missing"],
    );

    let victim = machine_with(&cp, &victim_tpm);
    let out = victim.boot(&holder.boot_line(epoch, &wf, MAC, UUID));
    let ramdisk = assert_joined_with_tpm(&cp, &victim, &victim_tpm, &out);
    assert_eq!(boot_state(&cp, &wf), "joined");
    // N keeps its binding and stays live beside its ramdisk.
    let installed_node = node(&cp, &n);
    assert_eq!(installed_node["retired"], false);
    assert_eq!(installed_node["bindings"][0]["key"], ek.as_str());

    // A retired node cannot be re-commissioned: commission the machine
    // again, which retires the first ramdisk, and name that one.
    let wf2 = boot_add(&cp, "dc1", MAC, &["--node", &n]);
    let again = machine_with(&cp, &victim_tpm);
    assert_joined_with_tpm(
        &cp,
        &again,
        &victim_tpm,
        &again.boot(&holder.boot_line(epoch, &wf2, MAC, UUID)),
    );
    assert_eq!(node(&cp, &ramdisk)["retired"], true);
    let out = cp.cli(&[
        "boot", "add", "--site", "dc1", "--mac", MAC, "--node", &ramdisk,
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is retired"), "{}", stderr(&out));
}

/// No expectation (the boot LAN is trusted): a ramdisk with a TPM proves
/// it all the same, and the same machine commissions twice.
#[test]
fn a_ramdisk_with_a_tpm_proves_it_on_a_trusted_lan_and_commissions_again() {
    let cp = ControlPlane::start_trusting_test_maker();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let tpm = Swtpm::start();
    let mut earlier = Vec::new();
    for _ in 0..2 {
        let wf = boot_add(&cp, "dc1", MAC, &["--product-uuid", UUID]);
        let m = machine_with(&cp, &tpm);
        let out = m.boot(&holder.boot_line(epoch, &wf, MAC, UUID));
        earlier.push(assert_joined_with_tpm(&cp, &m, &tpm, &out));
        assert_eq!(boot_state(&cp, &wf), "joined");
    }
    assert_eq!(node(&cp, &earlier[0])["retired"], true, "superseded");
    assert_eq!(node(&cp, &earlier[1])["retired"], false);
    // Without a TPM the same entry kind admits discovery alone.
    let wf = boot_add(&cp, "dc1", MAC, &["--product-uuid", UUID]);
    let bare = Machine::new(&cp, MAC, UUID);
    assert_ok(&bare.boot(&holder.boot_line(epoch, &wf, MAC, UUID)));
    let id = Identity::load(&bare.agent.data_dir, &TpmAccess::none())
        .unwrap()
        .unwrap();
    let sans = uri_sans(&id.chain[0]);
    assert!(
        sans.len() == 2 && sans[1].starts_with("urn:bc:scope:ramdisk:"),
        "no AK statement, only the scope: {sans:?}"
    );
    assert_eq!(node(&cp, &id.node_id)["nodeKey"], "unattested");
}

/// TPM evidence beside an attestor that takes none is bad input, not a
/// refusal of the machine.
#[test]
fn tpm_evidence_beside_another_attestor_is_invalid_input() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let config = bcd::config::Config::load(&agent.config).unwrap();
    let req = bc_wire::agent::JoinRequest {
        csr: throwaway_csr(),
        role: bc_wire::agent::Role::Node as i32,
        tpm: Some(bc_wire::agent::TpmAttestation::default()),
        ..Default::default()
    };
    let answer = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bcd::client::Client::new(&config).unwrap().join(&req));
    let e = answer.unwrap_err().to_string();
    assert!(e.contains("JoinRequest.tpm"), "{e}");
    assert!(cp.refusal_reasons().is_empty());
}

/// Round 2's check: a thief that proves its own TPM with a challenge it got
/// elsewhere (round 1 of a tpm join, for the same CSR: the tpm attestor's
/// challenge is the one discovery answers) proves its own EK, not the
/// entry's: refused `boot-ek-mismatch` in round 2, the entry stays open.
#[test]
fn a_challenge_from_a_tpm_join_proves_only_its_own_ek() {
    use bc_wire::agent::tpm_attestation::Round;
    use bc_wire::agent::{JoinRequest, JoinResponseBody, Role};
    use prost::Message;

    let cp = ControlPlane::start_trusting_test_maker();
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let victim_tpm = Swtpm::start();
    let ek = Agent::with_tpm(&cp, &victim_tpm).identify()["ekSha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let wf = boot_add(&cp, "dc1", MAC, &["--ek-sha256", &ek]);

    let thief_tpm = Swtpm::start_another_machine();
    let thief = Agent::with_tpm(&cp, &thief_tpm);
    let config = bcd::config::Config::load(&thief.config).unwrap();
    let shared = TpmAccess::new(Some(&thief_tpm.tcti())).open().unwrap();
    let key = std::sync::Arc::new(bcd::keys::TpmKey::generate(shared.clone()).unwrap());
    let csr = bcd::keys::make_csr(key.as_ref()).unwrap();
    let csr_sha256 = bc_wire::sha256(&csr);
    let mut evidence = bcd::evidence::tpm::TpmEvidence::new(shared, key, csr_sha256).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = bcd::client::Client::new(&config).unwrap();
    let send = |r: &JoinRequest| rt.block_on(client.join(r));

    // Round 1 of a tpm join: a challenge for this CSR, answered by the thief's TPM.
    let round1 = JoinRequest {
        csr: csr.clone(),
        role: Role::Node as i32,
        attestor: "tpm".into(),
        attestation: evidence.hello(),
        ..Default::default()
    };
    let body = JoinResponseBody::decode(send(&round1).unwrap().body.as_slice()).unwrap();
    let Some(bc_wire::agent::join_response_body::Deferral::Challenge(c)) = body.deferral else {
        panic!("round 1 is challenged")
    };
    let answer = evidence.answer_message(&c).unwrap();
    assert!(matches!(answer.round, Some(Round::Answer(_))));

    // That answer beside the victim's discovery evidence.
    let line = holder.boot_line(epoch, &wf, MAC, UUID);
    let d = bcd::evidence::discovery::parse_cmdline(&line).unwrap();
    let request = JoinRequest {
        csr: csr.clone(),
        role: Role::Ramdisk as i32,
        attestor: "discovery".into(),
        attestation: d.assertion.clone(),
        sealed_token: bcd::evidence::join_token::seal(
            &config.pins.join_encryption_key,
            &csr_sha256,
            &d.token,
        )
        .unwrap(),
        claims: Some(bc_wire::agent::HardwareClaims {
            macs: vec![MAC.to_owned()],
            product_uuid: UUID.to_owned(),
        }),
        tpm: Some(answer),
    };
    let r = cp.refused_once(Refusal::Join("discovery"), "boot-ek-mismatch", || {
        send(&request)
    });
    assert!(
        matches!(r, Err(bcd::client::ClientError::AccessDenied)),
        "{:?}",
        r.err()
    );
    assert_eq!(boot_state(&cp, &wf), "vouched", "the entry stays open");
}

/// Under `[discovery] approval = "unknown-machines"`: a ramdisk proving
/// its TPM for an entry that expects no EK waits as a join request naming
/// that EK, and joins with its TPM proven once approved; an entry that
/// expects the EK needs no operator.
#[test]
fn under_approval_a_tpm_ramdisk_waits_with_its_ek_and_an_ek_bound_entry_does_not() {
    let cp = ControlPlane::start_trusting_test_maker_with(
        "[discovery]\napproval = \"unknown-machines\"\napproval_retry_after = \"1s\"\n",
    );
    let site_id = site(&cp, "dc1");
    let holder = SiteNode::join(&cp, &site_id);
    let epoch = holder.acquire().unwrap().epoch;
    let tpm = Swtpm::start();
    let m = machine_with(&cp, &tpm);
    let ek = m.agent.identify()["ekSha256"].as_str().unwrap().to_owned();

    let wf = boot_add(&cp, "dc1", MAC, &["--product-uuid", UUID]);
    let cmd = m.boot_command(&holder.boot_line(epoch, &wf, MAC, UUID));
    let join = std::thread::spawn(move || output_within(cmd, DEADLINE));
    let pending = wait_for(|| {
        cp.json(&["requests", "list"])
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["attestor"] == "discovery")
            .cloned()
    });
    assert_eq!(
        pending["ekSha256"],
        ek.as_str(),
        "the request names the proven EK"
    );
    assert_eq!(boot_state(&cp, &wf), "vouched");
    assert_ok(&cp.cli(&["requests", "approve", pending["id"].as_str().unwrap()]));
    let out = join.join().unwrap();
    assert_joined_with_tpm(&cp, &m, &tpm, &out);

    let wf2 = boot_add(&cp, "dc1", MAC, &["--ek-sha256", &ek]);
    let again = machine_with(&cp, &tpm);
    let out = again.boot(&holder.boot_line(epoch, &wf2, MAC, UUID));
    assert_joined_with_tpm(&cp, &again, &tpm, &out);
    assert_eq!(
        cp.json(&["requests", "list"]).as_array().unwrap().len(),
        1,
        "no request for the EK-bound entry"
    );
}
