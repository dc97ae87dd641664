//! What the control plane refuses after a join, seen from a real agent:
//! renewals whose key proof is missing or wrong, and x509pop re-joins that are
//! stale, replayed, late or out of the clock window. Each sees ACCESS_DENIED
//! at the agent and its reason in the control plane's events.

use bc_wire::agent::{JoinRequest, RenewRequest, Role, TpmKeyAttestation};
use bcd::client::{Client, ClientError};
use bcd::identity::Identity;
use bcd::keys::{FileKey, NodeKey, TpmAccess, TpmKey};

use crate::harness::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn renew_refusals(cp: &ControlPlane) -> Vec<String> {
    cp.events()
        .into_iter()
        .filter(|e| e["type"] == "security.renew.refused")
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Sends a Renew over mTLS with the node's current identity; it must be refused.
fn renew_refused(agent: &Agent, access: &TpmAccess, request: &RenewRequest) {
    let config = bcd::config::Config::load(&agent.config).unwrap();
    let id = Identity::load(&agent.data_dir, access).unwrap().unwrap();
    let client = Client::with_identity(&config, &id.chain, id.key.clone()).unwrap();
    match rt().block_on(client.renew(request)) {
        Err(ClientError::AccessDenied) => {}
        other => panic!("expected ACCESS_DENIED, got {other:?}"),
    }
}

#[test]
fn a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key() {
    let cp = ControlPlane::start_trusting_test_maker();
    let (tpm, other_tpm) = (Swtpm::start(), Swtpm::start_another_machine());
    let agent = Agent::tpm_joined(&cp, &tpm);
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let access = TpmAccess::new(Some(&tpm.tcti()));

    // The next key, in the TPM, and its CSR.
    let next = TpmKey::generate(access.open().unwrap()).unwrap();
    let csr = bcd::keys::make_csr(&next).unwrap();
    let q = bc_wire::sha256(&csr);

    // 1. No key attestation at all.
    renew_refused(
        &agent,
        &access,
        &RenewRequest {
            csr: csr.clone(),
            key_attestation: None,
            boot: None,
        },
    );

    // 2. A real certification, by another TPM's AK.
    let attestation_by = |tcti: &str, key: &dyn Fn(&mut bcd::tpm::Tpm) -> bcd::tpm::LoadedKey| {
        let mut t = bcd::tpm::Tpm::open(tcti).unwrap();
        let ak = t.ak().unwrap();
        let k = key(&mut t);
        let (certify_info, signature) = t.certify(&k, &ak, &q).unwrap();
        let a = TpmKeyAttestation {
            ak_public: ak.public.clone(),
            key_public: k.public.clone(),
            certify_info,
            signature,
        };
        t.flush(k).unwrap();
        t.flush(ak).unwrap();
        a
    };
    let by_other = attestation_by(&other_tpm.tcti(), &|t| t.node_key(&[9; 32]).unwrap());
    renew_refused(
        &agent,
        &access,
        &RenewRequest {
            csr: csr.clone(),
            key_attestation: Some(by_other),
            boot: None,
        },
    );

    // 3. The right AK, certifying a key that is not the CSR's.
    drop(next);
    let not_csr = attestation_by(&tpm.tcti(), &|t| t.node_key(&[7; 32]).unwrap());
    renew_refused(
        &agent,
        &access,
        &RenewRequest {
            csr: csr.clone(),
            key_attestation: Some(not_csr),
            boot: None,
        },
    );

    // 4. The same, altered: a key that does not parse, a signature that
    // does not verify, another key's public area (another name).
    let base = attestation_by(&tpm.tcti(), &|t| t.node_key(&[7; 32]).unwrap());
    let other_public = attestation_by(&tpm.tcti(), &|t| t.node_key(&[8; 32]).unwrap()).key_public;
    let mut signature = base.signature.clone();
    let n = signature.len();
    signature[n - 3] ^= 1;
    for attestation in [
        TpmKeyAttestation {
            key_public: vec![1, 2, 3],
            ..base.clone()
        },
        TpmKeyAttestation {
            signature,
            ..base.clone()
        },
        TpmKeyAttestation {
            key_public: other_public,
            ..base.clone()
        },
    ] {
        renew_refused(
            &agent,
            &access,
            &RenewRequest {
                csr: csr.clone(),
                key_attestation: Some(attestation),
                boot: None,
            },
        );
    }
    // 5. The AK's certification of itself: over the right nonce, of a key
    // that is no signing key of its own (restricted); then over another nonce.
    let self_certified = |qualifying: &[u8]| {
        let mut t = bcd::tpm::Tpm::open(&tpm.tcti()).unwrap();
        let ak = t.ak().unwrap();
        let (certify_info, signature) = t.certify(&ak, &ak, qualifying).unwrap();
        let a = TpmKeyAttestation {
            ak_public: ak.public.clone(),
            key_public: ak.public.clone(),
            certify_info,
            signature,
        };
        t.flush(ak).unwrap();
        a
    };
    let csr = throwaway_csr();
    for attestation in [
        self_certified(&bc_wire::sha256(&csr)),
        self_certified(&[0; 32]),
    ] {
        renew_refused(
            &agent,
            &access,
            &RenewRequest {
                csr: csr.clone(),
                key_attestation: Some(attestation),
                boot: None,
            },
        );
    }

    assert_eq!(
        renew_refusals(&cp),
        vec![
            "key-attestation-missing",
            "ak-mismatch",
            "node-key-not-csr",
            "node-key-malformed",
            "node-key-signature",
            "node-key-name",
            "node-key-attributes",
            "node-key-nonce",
        ]
    );
    let refused = cp
        .events()
        .into_iter()
        .filter(|e| e["type"] == "security.renew.refused")
        .collect::<Vec<_>>();
    assert!(refused.iter().all(|e| e["nodeId"] == node_id.as_str()));
    assert!(
        cp.log().contains("renew refused"),
        "the control plane logs it"
    );

    // And the node's own renewal, with the proof, still works.
    let out = agent.command(&["node", "--once", "--renew-now"]).within();
    assert_ok(&out);
}

/// A Join with x509pop evidence by the node's current identity, for `csr_key`.
fn x509pop_request(agent: &Agent, csr_key: &dyn NodeKey, now: time::OffsetDateTime) -> JoinRequest {
    let id = Identity::load(&agent.data_dir, &TpmAccess::none())
        .unwrap()
        .unwrap();
    let csr = bcd::keys::make_csr(csr_key).unwrap();
    let evidence = bcd::evidence::x509pop::build(
        &id.chain,
        id.key.as_ref(),
        &bc_wire::sha256(&csr),
        &id.node_id,
        now,
    )
    .unwrap();
    JoinRequest {
        csr,
        role: Role::Node as i32,
        attestor: "x509pop".into(),
        attestation: evidence,
        ..Default::default()
    }
}

fn send(agent: &Agent, request: &JoinRequest) -> Result<(), ClientError> {
    let config = bcd::config::Config::load(&agent.config).unwrap();
    rt().block_on(Client::new(&config).unwrap().join(request))
        .map(|_| ())
}

#[test]
fn an_x509pop_proof_is_spent_once_even_across_a_restart() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    // The pool refuses x509pop after the attestor accepted the proof: the
    // join is rolled back, the proof's use with it.
    assert_ok(&cp.cli(&[
        "pools",
        "update",
        "--id",
        "default",
        "--join-attestors",
        "join-token",
    ]));
    let key = FileKey::generate().unwrap();
    let request = x509pop_request(&agent, &key, time::OffsetDateTime::now_utc());
    assert!(matches!(
        cp.refused_once(Refusal::Join("x509pop"), "join:pool-attestor", || send(
            &agent, &request
        )),
        Err(ClientError::AccessDenied)
    ));
    assert_ok(&cp.cli(&[
        "pools",
        "update",
        "--id",
        "default",
        "--join-attestors",
        "join-token,x509pop",
    ]));
    send(&agent, &request).expect("the proof was not spent by the refused join");
    // Spent now; a replay is named as one.
    assert!(matches!(
        cp.refused_once(Refusal::Join("x509pop"), "replayed", || send(
            &agent, &request
        )),
        Err(ClientError::AccessDenied)
    ));
    // And still after a restart: the use is in the database, not in memory.
    let cp = cp.restart();
    agent.set_api(&cp.url);
    assert!(matches!(
        cp.refused_once(Refusal::Join("x509pop"), "replayed", || send(
            &agent, &request
        )),
        Err(ClientError::AccessDenied)
    ));
    let generation = cp
        .nodes()
        .into_iter()
        .find(|n| n["nodeId"] == node_id.as_str())
        .expect("node listed")["identityGeneration"]
        .clone();
    assert_eq!(generation, 2, "one re-join, no replay");
}

#[test]
fn x509pop_refuses_old_proofs_revoked_identities_and_expiries_past_grace() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let key = FileKey::generate().unwrap();

    // A proof made two minutes ago: outside the 60 s window.
    let old = x509pop_request(
        &agent,
        &key,
        time::OffsetDateTime::now_utc() - time::Duration::minutes(2),
    );
    assert!(matches!(
        cp.refused_once(Refusal::Join("x509pop"), "clock-window", || send(
            &agent, &old
        )),
        Err(ClientError::AccessDenied)
    ));

    // The same through bcd: its clock two minutes ahead, so its proof is.
    let ahead = cp.refused_once(Refusal::Join("x509pop"), "clock-window", || {
        agent
            .command(&["join", "--attestor", "x509pop"])
            .env("BCD_CLOCK_OFFSET", "+2m")
            .within()
    });
    assert_access_denied(&ahead);
    assert_eq!(
        agent.status_json()["nodeId"],
        node_id.as_str(),
        "nothing was written"
    );

    // Eight days after expiry (db clock moved; bcd's too): past the 7-day grace.
    assert_ok(&cp.cli(&["clock", "set", "--offset", "9d"]));
    let late = cp.refused_once(Refusal::Join("x509pop"), "past-grace", || {
        agent
            .command(&["join", "--attestor", "x509pop"])
            .env("BCD_CLOCK_OFFSET", "+9d")
            .within()
    });
    assert_access_denied(&late);
    assert_ok(&cp.cli(&["clock", "set", "--offset", "0s"]));

    // After revoke-identity, no certificate from before it re-joins.
    assert_ok(&cp.cli(&["nodes", "revoke-identity", &node_id]));
    let out = cp.refused_once(Refusal::Join("x509pop"), "stale-generation", || {
        agent.run(&["join", "--attestor", "x509pop"])
    });
    assert_access_denied(&out);
    assert_eq!(
        agent.status_json()["nodeId"],
        node_id.as_str(),
        "nothing was written"
    );
}

/// A certificate revoked within its node's current generation: no operation
/// makes one (revoke-identity raises the generation, a delete deletes), so
/// the database is edited by hand, as a restored or repaired one may be.
/// bcd's x509pop re-join and its renewal are both refused as `revoked`, and
/// bcd keeps the identity it has.
#[test]
fn a_certificate_revoked_in_its_current_generation_neither_rejoins_nor_renews() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let files =
        || ["identity.json", "node.key"].map(|f| std::fs::read(agent.data_dir.join(f)).unwrap());
    let before = files();
    cp.sql(&format!(
        "UPDATE node_certs SET revoked_at = 1 WHERE node_id = '{node_id}'"
    ));

    let out = cp.refused_once(Refusal::Join("x509pop"), "revoked", || {
        agent.run(&["join", "--attestor", "x509pop"])
    });
    assert_access_denied(&out);

    let out = cp.refused_once(Refusal::Renew, "revoked", || {
        agent.run(&["node", "--once", "--renew-now"])
    });
    assert_renew_refused(&out);
    assert_eq!(renew_refusals(&cp), ["revoked"]);
    assert_eq!(
        agent.status_json()["nodeId"],
        node_id.as_str(),
        "nothing was written"
    );
    assert!(files() == before, "bcd keeps its certificate and key");
}

/// A TPM node whose certificate carries its AK statement twice: no control
/// plane of this kind issues one, so the test issues it with the real node
/// CA's key and stores it as the node's current certificate, as a database
/// restored beside a hand-made certificate would. bcd proves the (first)
/// AK as always, and Renew refuses the certificate as
/// `statement-malformed`; bcd keeps its identity.
#[test]
fn a_certificate_with_two_ak_statements_is_refused_at_renew() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    store_forged_certificate(&cp, &agent, |statements| {
        let ak = statements
            .iter()
            .find(|s| s.starts_with("urn:bc:tpm-ak:"))
            .unwrap_or_else(|| panic!("no AK statement in {statements:?}"));
        [vec![ak.clone()], statements.to_vec()].concat()
    });
    let path = agent.data_dir.join("identity.json");
    let before = std::fs::read(&path).unwrap();
    let files = agent.files();

    let out = cp.refused_once(Refusal::Renew, "statement-malformed", || {
        agent.run(&["node", "--once", "--renew-now"])
    });
    assert_renew_refused(&out);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "bcd keeps its identity"
    );
    assert_eq!(agent.files(), files);
}

/// Issues, with the real node CA's key, a certificate for `agent`'s node
/// and key whose statements are `statements` of the current ones (what
/// this control plane never issues), stores it as the node's current
/// certificate (its generation, in `node_certs`) and as `agent`'s.
fn store_forged_certificate(
    cp: &ControlPlane,
    agent: &Agent,
    statements: impl FnOnce(&[String]) -> Vec<String>,
) {
    let path = agent.data_dir.join("identity.json");
    let mut id: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let leaf = ::pem::parse(id["chain"][0].as_str().unwrap())
        .unwrap()
        .into_contents();
    let node = bc_controlplane::pki::node_cert_identity(&leaf).unwrap();
    let statements = statements(&node.statements);
    let bundle = bc_controlplane::pki::Bundle::load(cp.path()).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let issued = bundle
        .node_ca
        .issue(&bc_controlplane::pki::NodeCertSpec {
            spki_der: &node.spki_der,
            trust_domain: &node.trust_domain,
            node_id: &node.node_id,
            statements: &statements,
            not_before: now - time::Duration::minutes(1),
            not_after: now + time::Duration::hours(1),
        })
        .unwrap();
    let ms = |t: time::OffsetDateTime| t.unix_timestamp() * 1000;
    let serial = {
        use x509_parser::prelude::FromDer as _;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(&issued.der).unwrap();
        hex::encode(cert.raw_serial())
    };
    cp.sql(&format!(
        "INSERT INTO node_certs (serial, node_id, identity_generation, der, not_before, not_after)
         SELECT '{serial}', id, identity_generation, {}, {}, {} FROM nodes WHERE id = '{}'",
        cp.blob_literal(&issued.der),
        ms(issued.not_before),
        ms(issued.not_after),
        node.node_id
    ));
    id["chain"][0] = ::pem::encode(&::pem::Pem::new("CERTIFICATE", issued.der)).into();
    std::fs::write(&path, serde_json::to_vec_pretty(&id).unwrap()).unwrap();
}

/// A certificate naming as its AK a key without an attestation key's
/// attributes (a node key of the TPM; issued by hand as above): a real bcd
/// never sends that renewal (it proves only the AK its TPM derives, and
/// refuses a certificate naming another), so bcd's client sends it, with
/// that key as the AK: `ak-attributes`.
#[test]
fn a_certificate_naming_a_key_that_is_no_ak_is_refused_at_renew() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::tpm_joined(&cp, &tpm);
    let access = TpmAccess::new(Some(&tpm.tcti()));
    let mut t = bcd::tpm::Tpm::open(&tpm.tcti()).unwrap();
    let not_ak = t.node_key(&[5; 32]).unwrap();
    let not_ak_public = not_ak.public.clone();
    let name = bc_wire::tpm::Public::parse(&not_ak_public).unwrap().name();
    let named = bc_wire::tpm::ak_statement(&name).unwrap();
    store_forged_certificate(&cp, &agent, |statements| {
        statements
            .iter()
            .map(|s| match s.starts_with("urn:bc:tpm-ak:") {
                true => named.clone(),
                false => s.clone(),
            })
            .collect()
    });
    t.flush(not_ak).unwrap();
    // The AK is refused before any certification is looked at.
    let next = FileKey::generate().unwrap();
    let request = RenewRequest {
        csr: bcd::keys::make_csr(&next).unwrap(),
        key_attestation: Some(TpmKeyAttestation {
            ak_public: not_ak_public,
            key_public: vec![],
            certify_info: vec![],
            signature: vec![],
        }),
        boot: None,
    };
    cp.refused_once(Refusal::Renew, "ak-attributes", || {
        renew_refused(&agent, &access, &request)
    });
}

/// The TLS layer judges client certificates by the database clock, as Renew
/// does, and lets an expired one through to Renew, which refuses it by
/// name. The node joined 25 hours ago (both clocks moved back); the control
/// plane's clock then comes back to now, past the certificate's expiry,
/// while bcd's stays where it was, so bcd thinks it valid and renews.
#[test]
fn an_expired_certificate_reaches_renew_and_is_refused_as_expired() {
    let cp = ControlPlane::start();
    assert_ok(&cp.cli(&["clock", "set", "--offset", "-25h"]));
    let agent = Agent::new(&cp);
    let token = cp.token("node", &[]);
    assert_ok(&join_with_offset(&agent, &token, "-25h"));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&["clock", "set", "--offset", "0s"]));
    let out = cp.refused_once(Refusal::Renew, "expired", || {
        agent
            .command(&["node", "--once", "--renew-now"])
            .env("BCD_CLOCK_OFFSET", "-25h")
            .within()
    });
    assert_renew_refused(&out);
    assert_eq!(renew_refusals(&cp), ["expired"]);
    let refused: Vec<_> = cp
        .events()
        .into_iter()
        .filter(|e| e["type"] == "security.renew.refused")
        .collect();
    assert_eq!(refused[0]["nodeId"], node_id.as_str());
    let log = cp.log();
    assert!(
        log.lines()
            .any(|l| l.contains("renew refused") && l.contains("expired")),
        "{log}"
    );
}

/// `bcd join --token-file` with bcd's clock moved by `offset`.
fn join_with_offset(agent: &Agent, token: &str, offset: &str) -> std::process::Output {
    let mut join = agent.token_join(token, &[]);
    join.env("BCD_CLOCK_OFFSET", offset);
    output_within(join, DEADLINE)
}

/// The converse: a certificate issued at a database time ahead of the
/// system clock (not yet valid by the system's) is valid at database time,
/// and renews.
#[test]
fn a_certificate_valid_at_database_time_renews_whatever_the_system_clock() {
    let cp = ControlPlane::start();
    assert_ok(&cp.cli(&["clock", "set", "--offset", "2d"]));
    let agent = Agent::new(&cp);
    assert_ok(&join_with_offset(&agent, &cp.token("node", &[]), "+2d"));
    let out = agent
        .command(&["node", "--once", "--renew-now"])
        .env("BCD_CLOCK_OFFSET", "+2d")
        .within();
    assert_ok(&out);
    assert!(renew_refusals(&cp).is_empty());
    let renewed = cp
        .events()
        .into_iter()
        .filter(|e| e["type"] == "node.renewed")
        .count();
    assert_eq!(renewed, 1);
}

/// A CSR whose key is not P-256 (here P-384, which rcgen signs correctly)
/// is refused `join:csr-key` before any credential is looked at: the token
/// it carries, sealed to this very CSR, keeps its use. (bcd itself only
/// makes P-256 CSRs, so the request is built here and sent through bcd's
/// client over HTTPS.)
#[test]
fn a_join_whose_csr_key_is_not_p256_is_refused() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let config = bcd::config::Config::load(&agent.config).unwrap();
    let text = cp.token("node", &[]);
    let token = bc_wire::token::JoinToken::parse(text.trim()).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .unwrap()
        .der()
        .to_vec();
    let sealed_token = bcd::evidence::join_token::seal(
        &config.pins.join_encryption_key,
        &bc_wire::sha256(&csr),
        &token,
    )
    .unwrap();
    let req = JoinRequest {
        csr,
        role: Role::Node as i32,
        attestor: "join-token".into(),
        sealed_token,
        ..Default::default()
    };
    let before = cp.refusals().len();
    let answer = rt().block_on(Client::new(&config).unwrap().join(&req));
    assert!(
        matches!(answer, Err(ClientError::AccessDenied)),
        "{:?}",
        answer.err()
    );
    let refusals = cp.refusals();
    assert_eq!(refusals.len(), before + 1, "one new refusal: {refusals:?}");
    assert_eq!(refusals[before]["reason"], "join:csr-key");
    let tokens = cp.json(&["token", "list"]);
    assert_eq!(tokens[0]["usesLeft"], 1, "the token is not spent: {tokens}");
    // The same token with bcd's own (P-256) CSR joins.
    assert_ok(&agent.join_with_token(&text));
}

/// Sends `request` through bcd's client and asserts it was refused as
/// `reason`, once.
#[track_caller]
fn join_refused(cp: &ControlPlane, agent: &Agent, request: &JoinRequest, reason: &str) {
    let answer = cp.refused_once(Refusal::Join(&request.attestor), reason, || {
        send(agent, request)
    });
    assert!(
        matches!(answer, Err(ClientError::AccessDenied)),
        "{reason}: {answer:?}"
    );
}

/// A P-256 CSR whose signature does not verify (its last byte changed).
fn csr_with_a_bad_signature() -> Vec<u8> {
    let mut csr = throwaway_csr();
    let last = csr.len() - 1;
    csr[last] ^= 0x01;
    csr
}

/// What JoinService refuses before or around any attestor, through bcd's
/// client (bcd itself never sends these): a CSR whose signature does not
/// verify, an attestor it does not run, a sealed token that does not open
/// for this CSR, and for join-token no token at all or one that opens to
/// something that is no token.
#[test]
fn joins_refused_for_the_request_itself_name_their_reason() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    let base = |csr: Vec<u8>| JoinRequest {
        csr,
        role: Role::Node as i32,
        attestor: "join-token".into(),
        ..Default::default()
    };
    join_refused(
        &cp,
        &agent,
        &base(csr_with_a_bad_signature()),
        "join:csr-signature",
    );
    join_refused(
        &cp,
        &agent,
        &JoinRequest {
            attestor: "no-such-attestor".into(),
            ..base(throwaway_csr())
        },
        "join:unknown-attestor",
    );
    join_refused(
        &cp,
        &agent,
        &JoinRequest {
            sealed_token: vec![0x42; 200],
            ..base(throwaway_csr())
        },
        "token-unopenable",
    );
    join_refused(&cp, &agent, &base(throwaway_csr()), "token-missing");
    let csr = throwaway_csr();
    let sealed = bc_wire::sealing::SealingKey::from_spki_der(
        &::pem::parse(std::fs::read(cp.path().join("join-encryption.pub")).unwrap())
            .unwrap()
            .into_contents(),
    )
    .unwrap()
    .seal(&bc_wire::sha256(&csr), b"no token at all")
    .unwrap();
    join_refused(
        &cp,
        &agent,
        &JoinRequest {
            sealed_token: sealed,
            ..base(csr)
        },
        "token-malformed",
    );
    assert!(cp.nodes().is_empty());
}

/// x509pop's other refusals, from a node's own identity: evidence that is
/// no evidence, a proof bound to another CSR, a certificate presented for
/// another node, a role the certificate does not have, and (through `bcd
/// join --attestor x509pop`) a retired or deleted node.
#[test]
fn x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let other = Agent::new(&cp);
    assert_ok(&other.join_with_token(&cp.token("node", &[])));
    let other_id = other.status_json()["nodeId"].as_str().unwrap().to_owned();
    let key = FileKey::generate().unwrap();
    let now = time::OffsetDateTime::now_utc;

    let mut malformed = x509pop_request(&agent, &key, now());
    malformed.attestation = b"{\"v\":1}".to_vec();
    join_refused(&cp, &agent, &malformed, "evidence-malformed");

    let mut other_csr = x509pop_request(&agent, &key, now());
    other_csr.csr = bcd::keys::make_csr(&FileKey::generate().unwrap()).unwrap();
    join_refused(&cp, &agent, &other_csr, "signature");

    // This node's certificate, presented as the other node's.
    let id = Identity::load(&agent.data_dir, &TpmAccess::none())
        .unwrap()
        .unwrap();
    let csr = bcd::keys::make_csr(&key).unwrap();
    let evidence = bcd::evidence::x509pop::build(
        &id.chain,
        id.key.as_ref(),
        &bc_wire::sha256(&csr),
        &other_id,
        now(),
    )
    .unwrap();
    let as_other = JoinRequest {
        csr,
        attestation: evidence,
        ..x509pop_request(&agent, &key, now())
    };
    join_refused(&cp, &agent, &as_other, "unknown-certificate");

    let mut as_site = x509pop_request(&agent, &key, now());
    as_site.role = Role::Site as i32;
    join_refused(&cp, &agent, &as_site, "role");

    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&["nodes", "retire", &node_id]));
    let out = cp.refused_once(Refusal::Join("x509pop"), "retired", || {
        agent.run(&["join", "--attestor", "x509pop"])
    });
    assert_access_denied(&out);
    assert_ok(&cp.cli(&["nodes", "cordon", &other_id]));
    assert_ok(&cp.cli(&["nodes", "delete", &other_id, "--yes"]));
    let out = cp.refused_once(Refusal::Join("x509pop"), "deleted", || {
        other.run(&["join", "--attestor", "x509pop"])
    });
    assert_access_denied(&out);
    let joins = cp
        .events()
        .into_iter()
        .filter(|e| e["type"] == "node.joined")
        .count();
    assert_eq!(joins, 2, "nothing re-joined");
}

/// Sends `request` as a Renew through `client` and asserts it was refused
/// as `reason`, once.
#[track_caller]
fn renew_refused_as(cp: &ControlPlane, client: &Client, request: &RenewRequest, reason: &str) {
    let answer = cp.refused_once(Refusal::Renew, reason, || {
        rt().block_on(client.renew(request))
    });
    assert!(
        matches!(answer, Err(ClientError::AccessDenied)),
        "{reason}: {answer:?}"
    );
}

/// Renew's refusals of the caller and of the CSR, through bcd's client over
/// mTLS (bcd itself sends none of these), and of a node whose identity was
/// revoked or that was deleted, through `bcd node --once --renew-now`.
#[test]
fn renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason() {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let node_id = agent.status_json()["nodeId"].as_str().unwrap().to_owned();
    let good = RenewRequest {
        csr: throwaway_csr(),
        key_attestation: None,
        boot: None,
    };

    let (status, _) = cp.refused_once(Refusal::Renew, "no-client-certificate", || {
        cp.post_without_client_certificate(
            bc_wire::endpoints::RENEW,
            prost::Message::encode_to_vec(&good),
        )
    });
    assert_eq!(status, 403);
    let elsewhere =
        agent.client_with_forged_certificate(&cp, &format!("spiffe://other.test/node/{node_id}"));
    renew_refused_as(&cp, &elsewhere, &good, "certificate-identity");
    let copy =
        agent.client_with_forged_certificate(&cp, &format!("spiffe://bc.test/node/{node_id}"));
    renew_refused_as(&cp, &copy, &good, "unknown-certificate");

    let config = bcd::config::Config::load(&agent.config).unwrap();
    let id = Identity::load(&agent.data_dir, &TpmAccess::none())
        .unwrap()
        .unwrap();
    let own = Client::with_identity(&config, &id.chain, id.key.clone()).unwrap();
    let p384 = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let p384_csr = rcgen::CertificateParams::default()
        .serialize_request(&p384)
        .unwrap()
        .der()
        .to_vec();
    renew_refused_as(
        &cp,
        &own,
        &RenewRequest {
            csr: p384_csr,
            key_attestation: None,
            boot: None,
        },
        "csr-key",
    );
    renew_refused_as(
        &cp,
        &own,
        &RenewRequest {
            csr: csr_with_a_bad_signature(),
            key_attestation: None,
            boot: None,
        },
        "csr-signature",
    );
    let renewed = |e: &serde_json::Value| e["type"] == "node.renewed";
    assert!(!cp.events().iter().any(renewed), "nothing renewed");

    // Its identity revoked: the certificate is of an older generation.
    assert_ok(&cp.cli(&["nodes", "revoke-identity", &node_id]));
    let out = cp.refused_once(Refusal::Renew, "stale-generation", || {
        agent.run(&["node", "--once", "--renew-now"])
    });
    assert_renew_refused(&out);

    // A deleted node renews no more.
    let gone = Agent::new(&cp);
    assert_ok(&gone.join_with_token(&cp.token("node", &[])));
    let gone_id = gone.status_json()["nodeId"].as_str().unwrap().to_owned();
    assert_ok(&cp.cli(&["nodes", "cordon", &gone_id]));
    assert_ok(&cp.cli(&["nodes", "delete", &gone_id, "--yes"]));
    let out = cp.refused_once(Refusal::Renew, "deleted", || {
        gone.run(&["node", "--once", "--renew-now"])
    });
    assert_renew_refused(&out);
    assert!(!cp.events().iter().any(renewed), "nothing renewed");
}

/// An attestor of someone else's (a plugin, standing in for a built-in
/// id: an attestor's id is a `bc_wire::AttestorId`), which admits whatever
/// it is sent with the result it was made with.
struct Plugin {
    id: bc_wire::AttestorId,
    result: fn() -> bc_controlplane::AttestationResult,
}

impl bc_controlplane::Attestor for Plugin {
    fn id(&self) -> bc_wire::AttestorId {
        self.id
    }

    fn verify(
        &self,
        _: &bc_controlplane::store::Tx<'_>,
        _: &bc_controlplane::AttestInput<'_>,
    ) -> Result<bc_controlplane::Verdict, bc_controlplane::Refusal> {
        Ok(bc_controlplane::Verdict::Admit(Box::new((self.result)())))
    }
}

/// What JoinService holds any attestor to, shown with plugin attestors on
/// the real JoinService and router over HTTPS in this process, each
/// replacing the built-in of its id (`serve` runs none): an attestor
/// outside the role table admits `node` only (`join:role`), its result may name no node-key statement the control
/// plane cannot renew (`join:node-key-statement`) and no pool that does not
/// exist (`join:unknown-pool`). Through bcd's client.
#[test]
fn joinservice_holds_plugin_attestors_to_its_own_checks() {
    let cp = ControlPlane::init_only();
    let svc = std::sync::Arc::new(bc_controlplane::ControlPlane::open(cp.path()).unwrap());
    for plugin in [
        Plugin {
            id: bc_wire::AttestorId::CloudIid,
            result: bc_controlplane::AttestationResult::default,
        },
        Plugin {
            id: bc_wire::AttestorId::X509Pop,
            result: || bc_controlplane::AttestationResult {
                node_key: bc_controlplane::NodeKey::Tpm {
                    statement: "urn:bc:something-else:1".into(),
                },
                ..Default::default()
            },
        },
        Plugin {
            id: bc_wire::AttestorId::Provisioned,
            result: || bc_controlplane::AttestationResult {
                pool_id: Some("pool_nosuch".into()),
                ..Default::default()
            },
        },
    ] {
        svc.register_attestor(std::sync::Arc::new(plugin));
    }
    let tls = bc_controlplane::http::tls_config(svc.bundle(), svc.database()).unwrap();
    let server = InProcessServer::start(tls, bc_controlplane::http::router(svc.clone()));
    let agent = Agent::new(&cp);
    agent.set_api(&server.url);
    for (attestor, role, reason) in [
        ("cloud-iid", Role::Site, "join:role"),
        ("x509pop", Role::Node, "join:node-key-statement"),
        ("provisioned", Role::Node, "join:unknown-pool"),
    ] {
        let request = JoinRequest {
            csr: throwaway_csr(),
            role: role as i32,
            attestor: attestor.into(),
            ..Default::default()
        };
        let answer = cp.refused_once(Refusal::Join(attestor), reason, || {
            let answer = send(&agent, &request);
            svc.flush_events();
            answer
        });
        assert!(
            matches!(answer, Err(ClientError::AccessDenied)),
            "{reason}: {answer:?}"
        );
    }
    // The plain plugin admits a node.
    let request = JoinRequest {
        csr: throwaway_csr(),
        role: Role::Node as i32,
        attestor: "cloud-iid".into(),
        ..Default::default()
    };
    send(&agent, &request).expect("admitted");
}

/// A `bcd` whose pinned join encryption key is another control plane's
/// (a config copied from the wrong one) seals its token for that one: this
/// control plane cannot open it, `token-unopenable`, and nothing is spent
/// or written.
#[test]
fn a_token_sealed_for_another_control_plane_is_unopenable() {
    let cp = ControlPlane::start();
    let other = ControlPlane::init_only();
    let agent = Agent::new(&cp);
    let pem = |cp: &ControlPlane| {
        std::fs::read_to_string(cp.path().join("join-encryption.pub"))
            .unwrap()
            .trim()
            .to_owned()
    };
    let config = std::fs::read_to_string(&agent.config).unwrap();
    assert!(config.contains(&pem(&cp)), "{config}");
    std::fs::write(&agent.config, config.replace(&pem(&cp), &pem(&other))).unwrap();
    let token = cp.token("node", &[]);
    let out = cp.refused_once(Refusal::Join("join-token"), "token-unopenable", || {
        agent.join_with_token(&token)
    });
    assert_access_denied(&out);
    agent.assert_nothing_written();
    let tokens = cp.json(&["token", "list"]);
    assert_eq!(tokens[0]["usesLeft"], 1, "the token is not spent: {tokens}");
}
