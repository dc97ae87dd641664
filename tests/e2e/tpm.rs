//! `bcd join --attestor tpm` against swtpm (EK certificates from the test
//! maker in tpmsim-fixtures/) and the reference control plane.

use bc_wire::agent::tpm_attestation::Round;
use bc_wire::agent::{
    join_response_body::Deferral, JoinRequest, JoinResponseBody, Role, TpmAttestation,
};
use bcd::keys::{NodeKey, TpmAccess, TpmKey};
use prost::Message;
use serde_json::Value;

use crate::harness::*;
use crate::joinproxy::{is_answer, RoutingProxy};

/// The URI SANs of the leaf of a PEM chain.
fn leaf_uri_sans(pem: &str) -> Vec<String> {
    uri_sans(&::pem::parse_many(pem).unwrap().remove(0).into_contents())
}

/// The AK statement this TPM's AK makes: derived here the way bcd derives it.
fn ak_statement(tpm: &Swtpm) -> String {
    let mut t = bcd::tpm::Tpm::open(&tpm.tcti()).unwrap();
    let ak = t.ak().unwrap();
    let name = bc_wire::tpm::Public::parse(&ak.public).unwrap().name();
    t.flush(ak).unwrap();
    bc_wire::tpm::ak_statement(&name).unwrap()
}

fn node(cp: &ControlPlane, node_id: &str) -> Value {
    cp.nodes()
        .into_iter()
        .find(|n| n["nodeId"] == node_id)
        .expect("node listed")
}

#[test]
fn a_tpm_join_through_enrollment() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    let ek = agent.identify()["ekSha256"].as_str().unwrap().to_owned();
    assert_eq!(agent.identify()["ekCertificate"]["present"], true);

    let child = Running::start(&mut agent.command(&["join", "--attestor", "tpm"]));
    // The join waits as a pending request until an operator approves it.
    let request = wait_for(|| {
        cp.json(&["requests", "list"])
            .as_array()
            .and_then(|a| a.iter().find(|r| r["ekSha256"] == ek.as_str()).cloned())
    });
    assert_eq!(request["status"], "pending");
    assert!(
        cp.nodes().is_empty(),
        "nothing admitted before the approval"
    );
    assert_ok(&cp.cli(&["requests", "approve", request["id"].as_str().unwrap()]));
    let out = child.output();
    assert_ok(&out);
    assert!(
        stderr(&out).contains("pending"),
        "progress is visible while it waits: {}",
        stderr(&out)
    );

    let status = agent.status_json();
    assert_eq!(status["nodeKey"], "tpm");
    let node_id = status["nodeId"].as_str().unwrap();
    assert_eq!(
        leaf_uri_sans(status["certificate"].as_str().unwrap()),
        vec![
            format!("spiffe://bc.test/node/{node_id}"),
            ak_statement(&tpm),
            "urn:bc:scope:node".to_owned()
        ],
        "the SPIFFE ID, then the AK statement, then the scope"
    );
    let text = stdout(&agent.run(&["status"]));
    assert!(text.contains("node key in the TPM"), "{text}");
    assert_eq!(node(&cp, node_id)["nodeKey"], "tpm");
    let joined = cp
        .events()
        .into_iter()
        .find(|e| e["type"] == "node.joined")
        .unwrap();
    assert_eq!(joined["data"]["nodeKey"], "tpm");

    // node.key is only the unique; the key in the certificate is the TPM's.
    let record = std::fs::read_to_string(agent.data_dir.join("node.key")).unwrap();
    assert!(
        record.starts_with("-----BEGIN BCD TPM NODE KEY-----"),
        "{record}"
    );
    let access = TpmAccess::new(Some(&tpm.tcti()));
    let id = bcd::identity::Identity::load(&agent.data_dir, &access)
        .unwrap()
        .unwrap();
    let sig = id.key.sign(b"proof of possession").unwrap();
    let vk = bc_wire::signing::verifying_key_from_spki(&id.cert.spki).unwrap();
    use p256::ecdsa::signature::Verifier;
    vk.verify(
        b"proof of possession",
        &p256::ecdsa::Signature::from_slice(&sig).unwrap(),
    )
    .unwrap();
}

#[test]
fn a_tpm_join_through_resolve_then_reclaims_after_reset() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let first = agent.status_json();
    let node_id = first["nodeId"].as_str().unwrap().to_owned();
    assert_eq!(node(&cp, &node_id)["identityGeneration"], 1);

    // The same machine, its identity moved aside: the EK reclaims the node.
    let out = agent.run(&["join", "--attestor", "tpm", "--reset", "--yes"]);
    assert_ok(&out);
    let second = agent.status_json();
    assert_eq!(second["nodeId"], node_id.as_str(), "same node");
    assert_ne!(second["certificate"], first["certificate"]);
    assert_eq!(node(&cp, &node_id)["identityGeneration"], 2);
    // Every certificate of the older generation is revoked.
    let certs = cp.json(&["nodes", "certs", &node_id]);
    let certs = certs.as_array().unwrap();
    assert_eq!(certs.len(), 2);
    for c in certs {
        let old = c["identityGeneration"] == 1;
        assert_eq!(c["revoked"], old, "{c}");
    }
    assert!(agent
        .files()
        .iter()
        .any(|f| f.starts_with("node.key.reset-")));
    assert_eq!(cp.nodes().len(), 1);
}

#[test]
fn after_tpm2_clear_the_identity_no_longer_loads_and_a_join_reclaims_the_node() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();

    tpm.clear();
    let out = agent.run(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("the node key does not match the node certificate: the TPM derives another key from node.key (was the TPM cleared?); join again: bcd join --reset --yes, then bcd join"),
        "{}",
        stderr(&out)
    );
    // Same EK (the endorsement seed survives a clear): the node is reclaimed.
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(agent.status_json()["nodeId"], node_id.as_str());
    assert_eq!(node(&cp, &node_id)["identityGeneration"], 2);
}

#[test]
fn another_tpm_cannot_join_as_the_first_ones_node() {
    let cp = ControlPlane::start_trusting_test_maker();
    let (tpm_a, tpm_b) = (Swtpm::start(), Swtpm::start_another_machine());
    let a = Agent::with_tpm(&cp, &tpm_a);
    a.allow_ek(&cp);
    assert_ok(&a.run(&["join", "--attestor", "tpm"]));
    let node_a = a.status_json()["nodeId"].as_str().unwrap().to_owned();

    let b = Agent::with_tpm(&cp, &tpm_b);
    let ek_b = b.identify()["ekSha256"].as_str().unwrap().to_owned();
    assert_ne!(
        ek_b,
        a.identify()["ekSha256"].as_str().unwrap(),
        "two TPMs, two EKs"
    );
    assert_ok(&cp.cli(&["resolve", "add", "--ek-sha256", &ek_b, "--node", &node_a]));
    let out = cp.refused_once(Refusal::Join("tpm"), "bound-elsewhere", || {
        b.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    b.assert_nothing_written();
}

#[test]
fn an_ek_from_an_unknown_maker_is_refused() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start_other_maker();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let out = cp.refused_once(Refusal::Join("tpm"), "ek-chain", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    agent.assert_nothing_written();
}

/// The low bytes of an RSA-2048 modulus with the ROCA fingerprint
/// (CVE-2017-15361): 2^2047 + 2^2040 + r, r < 2^219 chosen so that the
/// modulus is 65537^127 modulo every prime of the fingerprint (3 to 167,
/// whose product is under 2^219). The fingerprint alone, no key anyone
/// holds: swtpm makes no ROCA key, but the check reads only the modulus.
const ROCA_MODULUS_TAIL: &str = "833c2f01609d8087664a228aadca31d81f0d8b41f9a161334eb43db";

/// A maker-signed EK certificate for such a key in the TPM's RSA EK
/// certificate index: bcd sends it as its EK certificate and is refused
/// `ek-roca` (the certificate chains to a trusted maker; its key is weak).
#[test]
fn an_ek_certificate_with_the_roca_fingerprint_is_refused() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let modulus = hex::decode(format!("81{ROCA_MODULUS_TAIL:0>510}")).unwrap();
    assert_eq!(modulus.len(), 256);
    assert!(bc_wire::ekcert::has_roca_fingerprint(&modulus));
    let cert = crate::maker::certify_rsa_modulus(&tpm, &modulus);
    assert_ok(&tpm.tool("tpm2_nvundefine", &["0x01c00002", "-C", "p"]));
    crate::maker::nv_write(&tpm, "0x01c00002", &cert);
    let out = cp.refused_once(Refusal::Join("tpm"), "ek-roca", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    agent.assert_nothing_written();
    assert!(cp.nodes().is_empty());
}

#[test]
fn a_pool_that_requires_tpm_refuses_a_token_join() {
    let cp = ControlPlane::start_trusting_test_maker();
    assert_ok(&cp.cli(&[
        "pools",
        "update",
        "--id",
        "default",
        "--join-attestors",
        "tpm",
    ]));
    let agent = Agent::new(&cp);
    let out = cp.refused_once(Refusal::Join("join-token"), "join:pool-attestor", || {
        agent.join_with_token(&cp.token("node", &[]))
    });
    assert_access_denied(&out);
    let refusal = cp.refusal("join:pool-attestor");
    assert_eq!(refusal["attestor"], "join-token");
    // And still admits a TPM.
    let tpm = Swtpm::start();
    let machine = Agent::with_tpm(&cp, &tpm);
    machine.allow_ek(&cp);
    assert_ok(&machine.run(&["join", "--attestor", "tpm"]));
    // Validation: unknown attestors are INVALID_INPUT.
    let out = cp.cli(&[
        "pools",
        "update",
        "--id",
        "default",
        "--join-attestors",
        "telepathy",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("INVALID_INPUT"), "{}", stderr(&out));
}

/// `[tpm] enrollment = false`: an EK neither bound nor resolved is refused
/// (`unknown-ek`) rather than filed as a join request; a resolve entry
/// still admits it.
#[test]
fn without_enrollment_an_unknown_ek_is_refused() {
    let cp = ControlPlane::start_trusting_test_maker_with("enrollment = false\n");
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    let out = cp.refused_once(Refusal::Join("tpm"), "unknown-ek", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    agent.assert_nothing_written();
    let requests = cp.json(&["requests", "list"]);
    assert_eq!(requests.as_array().map(Vec::len), Some(0), "{requests}");
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
}

/// Under --attestor tpm the TPM is the credential: a BCD_JOIN_TOKEN in the
/// environment is neither read nor sent (the token stays unspent, the join
/// names no token) and is erased from /proc/<pid>/environ all the same.
#[test]
fn a_tpm_join_ignores_and_erases_the_environment_token() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let token = cp.token("node", &[]);
    let out = agent
        .command(&["join", "--attestor", "tpm"])
        .env("BCD_JOIN_TOKEN", &token)
        .within();
    assert_ok(&out);
    let tokens = cp.json(&["token", "list"]);
    assert_eq!(tokens[0]["usesLeft"], 1, "the token is not spent: {tokens}");
    let joined: Vec<Value> = cp
        .events()
        .into_iter()
        .filter(|e| e["type"] == "node.joined")
        .collect();
    assert_eq!(joined.len(), 1);
    assert_eq!(joined[0]["attestor"], "tpm");
    assert!(joined[0]["tokenId"].is_null(), "{:?}", joined[0]);

    let other = Agent::with_tpm(&cp, &tpm);
    let secret = token.split_once('.').unwrap().1;
    let environ = other.environ_at_connect(
        &["join", "--attestor", "tpm"],
        &[("BCD_JOIN_TOKEN", &token)],
    );
    assert!(
        !environ.contains(secret),
        "the token is readable in /proc/<pid>/environ"
    );
    assert!(environ.contains("TSS2_LOG="), "other variables stay");
}

#[test]
fn a_tpm_join_reads_no_token() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    let out = agent.run(&["join", "--attestor", "tpm", "--token-file", "/dev/null"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    agent.assert_nothing_written();
}

#[test]
fn a_token_join_on_a_machine_with_a_tpm_keeps_its_key_there() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let status = agent.status_json();
    assert_eq!(status["nodeKey"], "tpm");
    let node_id = status["nodeId"].as_str().unwrap();
    assert_eq!(
        leaf_uri_sans(status["certificate"].as_str().unwrap()),
        [
            format!("spiffe://bc.test/node/{node_id}"),
            "urn:bc:scope:node".to_owned()
        ],
        "no AK statement without a certified join"
    );
    assert_eq!(node(&cp, node_id)["nodeKey"], "unattested");
}

// ---- Refusals of the second round: real TPM output, one thing altered ----

/// A TPM join driven step by step, so that a test can alter the answer.
struct ManualJoin {
    config: bcd::config::Config,
    shared: bcd::keys::SharedTpm,
    key: std::sync::Arc<TpmKey>,
    request: JoinRequest,
    evidence: bcd::evidence::tpm::TpmEvidence,
    rt: tokio::runtime::Runtime,
}

impl ManualJoin {
    fn new(agent: &Agent) -> ManualJoin {
        let config = bcd::config::Config::load(&agent.config).unwrap();
        let access = TpmAccess::new(config.tpm_tcti.as_deref());
        let shared = access.open().unwrap();
        let key = std::sync::Arc::new(TpmKey::generate(shared.clone()).unwrap());
        let csr = bcd::keys::make_csr(key.as_ref()).unwrap();
        let evidence =
            bcd::evidence::tpm::TpmEvidence::new(shared, key.clone(), bc_wire::sha256(&csr))
                .unwrap();
        let request = JoinRequest {
            csr,
            role: Role::Node as i32,
            attestor: "tpm".into(),
            attestation: evidence.hello(),
            ..Default::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        ManualJoin {
            config,
            shared: access.open().unwrap(),
            key,
            request,
            evidence,
            rt,
        }
    }

    fn send(&self, request: &JoinRequest) -> Result<JoinResponseBody, bcd::client::ClientError> {
        let client = bcd::client::Client::new(&self.config).unwrap();
        let resp = self.rt.block_on(client.join(request))?;
        Ok(JoinResponseBody::decode(resp.body.as_slice()).unwrap())
    }

    /// Round 1, and the real answer to its challenge.
    fn answer(&mut self) -> bc_wire::agent::TpmAnswer {
        self.answer_to(|_| {})
    }

    /// Round 1, and the real answer to its challenge as `alter` leaves it.
    fn answer_to(
        &mut self,
        alter: impl FnOnce(&mut bc_wire::agent::TpmChallenge),
    ) -> bc_wire::agent::TpmAnswer {
        let body = self
            .send(&self.request.clone())
            .expect("round 1 is challenged");
        let Some(Deferral::Challenge(mut c)) = body.deferral else {
            panic!("expected a challenge")
        };
        let mut payload = bc_wire::agent::TpmChallenge::decode(c.payload.as_slice()).unwrap();
        alter(&mut payload);
        c.payload = payload.encode_to_vec();
        match self.evidence.answer_message(&c).unwrap().round {
            Some(Round::Answer(a)) => a,
            _ => panic!("expected an answer"),
        }
    }

    /// Sends `answer` as round 2; the result must be ACCESS_DENIED.
    fn refused(&self, answer: bc_wire::agent::TpmAnswer) {
        let mut request = self.request.clone();
        request.attestation = TpmAttestation {
            round: Some(Round::Answer(answer)),
        }
        .encode_to_vec();
        match self.send(&request) {
            Err(bcd::client::ClientError::AccessDenied) => {}
            other => panic!("expected ACCESS_DENIED, got {:?}", other.map(|b| b.node_id)),
        }
    }

    fn tpm(&self) -> std::sync::MutexGuard<'_, bcd::tpm::Tpm> {
        bcd::keys::lock_tpm(&self.shared).unwrap()
    }
}

/// Runs one altered second round against a fresh control plane and TPM and
/// returns the refusal reason the server recorded.
fn refusal_of(alter: impl FnOnce(&ManualJoin, &mut bc_wire::agent::TpmAnswer)) -> String {
    refusal_with("", alter)
}

/// [`refusal_of`] with more control-plane `[tpm]` configuration.
fn refusal_with(
    cp_tpm: &str,
    alter: impl FnOnce(&ManualJoin, &mut bc_wire::agent::TpmAnswer),
) -> String {
    let cp = ControlPlane::start_trusting_test_maker_with(cp_tpm);
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let mut join = ManualJoin::new(&agent);
    let mut answer = join.answer();
    alter(&join, &mut answer);
    join.refused(answer);
    assert!(cp.nodes().is_empty());
    let mut reasons = cp.refusal_reasons();
    assert_eq!(reasons.len(), 1, "one refusal: {reasons:?}");
    reasons.remove(0)
}

fn csr_sha256(join: &ManualJoin) -> [u8; 32] {
    bc_wire::sha256(&join.request.csr)
}

/// What the node key's certification in `answer` is qualified by: with no
/// quote (`fresh_certification`), the nonce a quote would carry.
fn qualifying(join: &ManualJoin, answer: &bc_wire::agent::TpmAnswer) -> [u8; 32] {
    if !answer.quote.is_empty() {
        return csr_sha256(join);
    }
    let mut input = answer.secret.clone();
    input.extend_from_slice(&csr_sha256(join));
    bc_wire::sha256(&input)
}

#[test]
fn an_unaltered_manual_join_succeeds() {
    // The baseline for the tests below: the same steps, nothing altered.
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let mut join = ManualJoin::new(&agent);
    let answer = join.answer();
    let mut request = join.request.clone();
    request.attestation = TpmAttestation {
        round: Some(Round::Answer(answer)),
    }
    .encode_to_vec();
    let body = join.send(&request).expect("admitted");
    assert!(!body.node_id.is_empty());
    assert!(join.key.kid().len() == 64);
}

/// As a control plane from before `fresh_certification` asks: the quote,
/// and the certification over sha256(csr), which this one still admits.
#[test]
fn a_challenge_without_fresh_certification_is_answered_with_a_quote() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let mut join = ManualJoin::new(&agent);
    let answer = join.answer_to(|c| c.fresh_certification = false);
    assert!(!answer.quote.is_empty() && !answer.quote_signature.is_empty());
    let mut request = join.request.clone();
    request.attestation = TpmAttestation {
        round: Some(Round::Answer(answer)),
    }
    .encode_to_vec();
    assert!(!join.send(&request).expect("admitted").node_id.is_empty());
}

#[test]
fn without_a_quote_a_certification_over_the_csr_alone_is_refused() {
    let reason = refusal_of(|j, a| {
        assert!(a.quote.is_empty(), "no PCR policy: no quote");
        // What a certification made before round 1 would be: not fresh.
        let (info, sig) = j.key.certify_by(j.evidence.ak(), &csr_sha256(j)).unwrap();
        let nk = a.node_key.as_mut().unwrap();
        (nk.certify_info, nk.signature) = (info, sig);
    });
    assert_eq!(reason, "node-key-nonce");
}

#[test]
fn node_key_signature() {
    let reason = refusal_of(|_, a| {
        let sig = &mut a.node_key.as_mut().unwrap().signature;
        let n = sig.len();
        sig[n - 3] ^= 1;
    });
    assert_eq!(reason, "node-key-signature");
}

#[test]
fn node_key_nonce() {
    let reason = refusal_of(|j, a| {
        // The node key itself, certified over another CSR's digest.
        let (info, sig) = j
            .key
            .certify_by(j.evidence.ak(), &bc_wire::sha256(b"another csr"))
            .unwrap();
        let nk = a.node_key.as_mut().unwrap();
        (nk.certify_info, nk.signature) = (info, sig);
    });
    assert_eq!(reason, "node-key-nonce");
}

#[test]
fn node_key_name() {
    let reason = refusal_of(|j, a| {
        let mut tpm = j.tpm();
        let other = tpm.node_key(&[2; 32]).unwrap();
        a.node_key.as_mut().unwrap().public = other.public.clone();
        tpm.flush(other).unwrap();
    });
    assert_eq!(reason, "node-key-name");
}

#[test]
fn node_key_attributes() {
    // The AK certifies itself: a real certification of a restricted key.
    let reason = refusal_of(|j, a| {
        let q = qualifying(j, a);
        let ak = j.evidence.ak();
        let (info, sig) = j.tpm().certify(ak, ak, &q).unwrap();
        let nk = a.node_key.as_mut().unwrap();
        (nk.public, nk.certify_info, nk.signature) = (ak.public.clone(), info, sig);
    });
    assert_eq!(reason, "node-key-attributes");
}

#[test]
fn node_key_not_csr() {
    // Another TPM key, correctly certified over this CSR: not the CSR's key.
    let reason = refusal_of(|j, a| {
        let q = qualifying(j, a);
        let mut tpm = j.tpm();
        let other = tpm.node_key(&[3; 32]).unwrap();
        let (info, sig) = tpm.certify(&other, j.evidence.ak(), &q).unwrap();
        let nk = a.node_key.as_mut().unwrap();
        (nk.public, nk.certify_info, nk.signature) = (other.public.clone(), info, sig);
        tpm.flush(other).unwrap();
    });
    assert_eq!(reason, "node-key-not-csr");
}

#[test]
fn node_key_malformed() {
    let reason = refusal_of(|_, a| {
        a.node_key.as_mut().unwrap().public.truncate(20);
    });
    assert_eq!(reason, "node-key-malformed");
}

#[test]
fn node_key_not_certified() {
    let reason = refusal_of(|_, a| a.node_key = None);
    assert_eq!(reason, "node-key-not-certified");
}

#[test]
fn a_wrong_credential_is_refused() {
    let reason = refusal_of(|_, a| a.secret[0] ^= 1);
    assert_eq!(reason, "challenge-secret");
}

#[test]
fn pcr_values_must_match_the_quote() {
    // A policy makes the control plane ask for PCR 0 and its value.
    let policy = format!("[tpm.pcr_policy]\n\"0\" = \"{}\"\n", "00".repeat(32));
    let reason = refusal_with(&policy, |_, a| a.pcr_values[0][0] ^= 1);
    assert_eq!(reason, "quote-pcrs");
}

#[test]
fn the_ek_certificate_is_read_with_its_index_auth_when_the_owner_has_a_password() {
    // A previous OS took ownership: the owner hierarchy has an authorization.
    let tpm = Swtpm::start();
    let cp = ControlPlane::start_trusting_test_maker();
    let agent = Agent::with_tpm(&cp, &tpm);
    let before = agent.identify();
    assert_ok(&tpm.tool("tpm2_changeauth", &["-c", "owner", "previous-os"]));
    let after = agent.identify();
    assert!(before["ekSha256"].is_string(), "{before}");
    assert_eq!(after["ekSha256"], before["ekSha256"], "{after}");
    // The node key, an owner-hierarchy primary, cannot be derived: said so.
    agent.allow_ek(&cp);
    let out = agent.run(&["join", "--attestor", "tpm"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("owner hierarchy has an authorization"),
        "{}",
        stderr(&out)
    );
}

/// A token join on a machine whose TPM cannot hold the node key (its owner
/// hierarchy has a password bcd was not given) still joins: bcd says why
/// and keeps a file key, which `bcd status` shows. (A tpm join has no such
/// fallback: the test above.)
#[test]
fn a_token_join_keeps_a_file_key_when_the_tpm_cannot_hold_the_node_key() {
    let tpm = Swtpm::start();
    let cp = ControlPlane::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    assert_ok(&tpm.tool("tpm2_changeauth", &["-c", "owner", "previous-os"]));
    let out = agent.join_with_token(&cp.token("node", &[]));
    assert_ok(&out);
    assert!(
        stderr(&out).contains("the TPM cannot hold the node key; using a file key instead"),
        "{}",
        stderr(&out)
    );
    let status = agent.status_json();
    assert_eq!(status["nodeKey"], "file", "{status}");
    // Nothing of the key was left in the TPM.
    assert!(tpm.transient_handles().is_empty());
}

#[test]
fn with_owner_auth_file_a_tpm_whose_owner_has_a_password_joins() {
    use std::os::unix::fs::PermissionsExt;
    let tpm = Swtpm::start();
    let cp = ControlPlane::start_trusting_test_maker();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    assert_ok(&tpm.tool("tpm2_changeauth", &["-c", "owner", "previous-os"]));
    let file = agent.config.with_file_name("owner.auth");
    std::fs::write(&file, "previous-os\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = std::fs::read_to_string(&agent.config).unwrap();
    let config = config.replace(
        "[tpm]\n",
        &format!("[tpm]\nowner_auth_file = \"{}\"\n", file.display()),
    );
    std::fs::write(&agent.config, config).unwrap();

    // Readable by others: refused, and the secret is not printed.
    let out = agent.run(&["join", "--attestor", "tpm"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("previous-os"));

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    assert_eq!(cp.nodes().len(), 1);
}

#[test]
fn a_challenge_state_that_does_not_open_is_refused() {
    let reason = refusal_of(|_, a| {
        let n = a.state.len();
        a.state[n - 1] ^= 1;
    });
    assert_eq!(reason, "challenge-state");
}

/// With a PCR policy the answer carries a quote: one by the AK whose
/// signature does not verify, or whose extraData is not the challenge's
/// nonce, is refused by name.
#[test]
fn a_quote_with_a_bad_signature_or_another_nonce_is_refused() {
    let policy = format!("[tpm.pcr_policy]\n\"0\" = \"{}\"\n", "00".repeat(32));
    let reason = refusal_with(&policy, |_, a| {
        let n = a.quote_signature.len();
        a.quote_signature[n - 3] ^= 1;
    });
    assert_eq!(reason, "quote-signature");
    let reason = refusal_with(&policy, |j, a| {
        // A real quote by the same AK, over another nonce.
        let mut tpm = j.tpm();
        let ak = tpm.ak().unwrap();
        let quote = tpm
            .quote(&ak, &[0x5a; 32], &[0], bc_wire::pcr::PcrBank::Sha256)
            .unwrap();
        tpm.flush(ak).unwrap();
        a.quote = quote.attest;
        a.quote_signature = quote.signature;
        a.pcr_values = quote.pcr_values;
    });
    assert_eq!(reason, "quote-nonce");
}

/// A round that is no TpmAttestation, or neither hello nor answer.
#[test]
fn tpm_evidence_that_does_not_parse_is_refused() {
    let cp = ControlPlane::start_trusting_test_maker();
    let agent = Agent::new(&cp);
    let config = bcd::config::Config::load(&agent.config).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for attestation in [
        vec![0xff, 0xff, 0xff],
        TpmAttestation { round: None }.encode_to_vec(),
    ] {
        let request = JoinRequest {
            csr: throwaway_csr(),
            role: Role::Node as i32,
            attestor: "tpm".into(),
            attestation,
            ..Default::default()
        };
        let answer = cp.refused_once(Refusal::Join("tpm"), "evidence-malformed", || {
            rt.block_on(bcd::client::Client::new(&config).unwrap().join(&request))
        });
        assert!(
            matches!(answer, Err(bcd::client::ClientError::AccessDenied)),
            "{:?}",
            answer.err()
        );
    }
}

/// A pending enrollment the operator denies: the waiting `bcd join` is
/// refused (`enrollment-denied`) at its next round and writes nothing.
#[test]
fn a_denied_enrollment_refuses_the_waiting_join() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    let ek = agent.identify()["ekSha256"].as_str().unwrap().to_owned();
    // The join runs under the harness's deadline while this thread denies.
    let waiting = Running::start(&mut agent.command(&["join", "--attestor", "tpm"]));
    let request = wait_for(|| {
        cp.json(&["requests", "list"])
            .as_array()
            .and_then(|a| a.iter().find(|r| r["ekSha256"] == ek.as_str()).cloned())
    });
    let out = cp.refused_once(Refusal::Join("tpm"), "enrollment-denied", || {
        assert_ok(&cp.cli(&["requests", "deny", request["id"].as_str().unwrap()]));
        waiting.output()
    });
    assert_access_denied(&out);
    agent.assert_nothing_written();
    assert!(cp.nodes().is_empty());
}

/// Round 2 after the challenge's deadline (the control plane's clock moved
/// past its five minutes): `challenge-expired`.
#[test]
fn an_answer_after_the_challenges_deadline_is_refused() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let mut join = ManualJoin::new(&agent);
    let answer = join.answer();
    assert_ok(&cp.cli(&["clock", "set", "--offset", "6m"]));
    cp.refused_once(Refusal::Join("tpm"), "challenge-expired", || {
        join.refused(answer)
    });
    assert!(cp.nodes().is_empty());
}

/// The same through bcd: a proxy moves the control plane's clock past the
/// challenge's five minutes when bcd's round 2 goes through it, so bcd's
/// real answer arrives late. bcd ends ACCESS_DENIED, `challenge-expired`.
#[test]
fn bcds_answer_after_the_challenges_deadline_is_refused() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let dir = cp.path().to_owned();
    let proxy = RoutingProxy::start_with_hook(
        &[&cp],
        &agent,
        |_| vec![0],
        move |req| {
            if is_answer(req) {
                let mut clock = std::process::Command::new(bin("bc-controlplane"));
                clock
                    .args(["clock", "set", "--dir"])
                    .arg(&dir)
                    .args(["--offset", "6m"]);
                assert_ok(&output_within(clock, DEADLINE));
            }
        },
    );
    agent.set_api(&proxy.url);
    let out = cp.refused_once(Refusal::Join("tpm"), "challenge-expired", || {
        agent.run(&["join", "--attestor", "tpm"])
    });
    assert_access_denied(&out);
    assert_eq!(proxy.answers().len(), 1, "bcd answered once");
    assert!(cp.nodes().is_empty());
}

/// A hello whose AK is no restricted signing key (here the node key's
/// public area): `ak-attributes`, before any challenge.
#[test]
fn a_hello_whose_ak_is_no_attestation_key_is_refused() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let join = ManualJoin::new(&agent);
    let mut hello = match TpmAttestation::decode(join.request.attestation.as_slice())
        .unwrap()
        .round
    {
        Some(Round::Hello(h)) => h,
        _ => panic!("a hello"),
    };
    let node_key = join.tpm().node_key(&[3; 32]).unwrap();
    hello.ak_public = node_key.public.clone();
    join.tpm().flush(node_key).unwrap();
    let mut request = join.request.clone();
    request.attestation = TpmAttestation {
        round: Some(Round::Hello(hello)),
    }
    .encode_to_vec();
    let answer = cp.refused_once(Refusal::Join("tpm"), "ak-attributes", || {
        join.send(&request)
    });
    assert!(
        matches!(answer, Err(bcd::client::ClientError::AccessDenied)),
        "{:?}",
        answer.map(|b| b.node_id)
    );
}
