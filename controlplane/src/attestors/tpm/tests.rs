//! The tpm attestor against real TPM output (testdata/README.md), and
//! copies of it altered one thing at a time.

use super::*;
use crate::model::attestor::{NodeKeyKind, OpenedToken};
use crate::model::machine::Binding;
use crate::store::{params, Commit, DbError, Store, UnixMs};
use bc_wire::agent::{HardwareClaims, TpmKeyCertification};
use bc_wire::tpm::ALG_SHA256;

const HELLO: &[u8] = include_bytes!("testdata/hello.bin");
const ANSWER: &[u8] = include_bytes!("testdata/answer.bin");
const CSR: &[u8] = include_bytes!("testdata/csr.der");
const KEY: &[u8; 32] = include_bytes!("testdata/challenge.key");
const KEY2_CERT: &[u8] = include_bytes!("testdata/key2-certification.bin");
const AK_SELF_CERT: &[u8] = include_bytes!("testdata/ak-self-certification.bin");
const OTHER_NONCE_CERT: &[u8] = include_bytes!("testdata/other-nonce-certification.bin");
const OTHER_NONCE_QUOTE: &[u8] = include_bytes!("testdata/other-nonce-quote.bin");
const CAPTURED_AT: UnixMs = ek::tests::CAPTURED_AT;
/// Within the challenge's 5 minutes.
const NOW: UnixMs = CAPTURED_AT + 1_000;

pub(crate) fn hello() -> TpmHello {
    match TpmAttestation::decode(HELLO).unwrap().round {
        Some(tpm_attestation::Round::Hello(h)) => h,
        _ => panic!("hello.bin is not a hello"),
    }
}

pub(crate) fn answer() -> TpmAnswer {
    match TpmAttestation::decode(ANSWER).unwrap().round {
        Some(tpm_attestation::Round::Answer(a)) => a,
        _ => panic!("answer.bin is not an answer"),
    }
}

pub(crate) fn hello_evidence(h: TpmHello) -> Vec<u8> {
    TpmAttestation {
        round: Some(tpm_attestation::Round::Hello(h)),
    }
    .encode_to_vec()
}

pub(crate) fn answer_evidence(a: TpmAnswer) -> Vec<u8> {
    TpmAttestation {
        round: Some(tpm_attestation::Round::Answer(a)),
    }
    .encode_to_vec()
}

/// The EK the fixtures' machine is known by.
pub(crate) fn ek_sha256() -> String {
    let h = hello();
    let (_, cert) = x509_parser::parse_x509_certificate(&h.ek_certificate).unwrap();
    hex::encode(bc_wire::sha256(cert.public_key().raw))
}

fn certification(bytes: &[u8]) -> TpmKeyCertification {
    TpmKeyCertification::decode(bytes).unwrap()
}

fn csr_spki(csr: &[u8]) -> Vec<u8> {
    use x509_parser::prelude::FromDer;
    let (_, c) =
        x509_parser::certification_request::X509CertificationRequest::from_der(csr).unwrap();
    c.certification_request_info.subject_pki.raw.to_vec()
}

/// Adds the test maker's root and intermediate as EK roots.
pub(crate) fn add_test_roots(db: &Store) {
    let mut ders = ek::parse_roots_pem(ek::tests::ROOT_PEM).unwrap();
    ders.extend(ek::parse_roots_pem(ek::tests::INTERMEDIATE_PEM).unwrap());
    ek::add_roots(db, &ders, ek::RootKind::Anchor).unwrap();
}

struct Fixture {
    _dir: tempfile::TempDir,
    db: Store,
    attestor: TpmAttestor,
}

fn fixture_with(config: TpmConfig) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let db = Store::open_dir(dir.path()).unwrap();
    add_test_roots(&db);
    Fixture {
        _dir: dir,
        db,
        attestor: TpmAttestor::new(config, ChallengeKey::new(*KEY)),
    }
}

fn fixture() -> Fixture {
    fixture_with(TpmConfig::default())
}

impl Fixture {
    /// Runs the attestor for `csr` at database time `now` in a transaction
    /// committed whatever the outcome, so a test sees anything a refusal
    /// would (wrongly) write. The capture holds one challenge: each run
    /// stands for a fresh challenge of that TPM, so the challenges spent
    /// before are forgotten first ([`Self::replay_at`] keeps them).
    fn run_at(&self, evidence: &[u8], csr: &[u8], now: UnixMs) -> Result<Verdict, Refusal> {
        self.db
            .write(|tx| tx.execute("DELETE FROM attestation_uses", params![]))
            .unwrap();
        self.replay_at(evidence, csr, now)
    }

    /// [`Self::run_at`] with the challenges spent so far kept.
    fn replay_at(&self, evidence: &[u8], csr: &[u8], now: UnixMs) -> Result<Verdict, Refusal> {
        self.verify_as(Role::Node, evidence, csr, now)
    }

    /// One verification with role `role`, committed whatever the outcome.
    fn verify_as(
        &self,
        role: Role,
        evidence: &[u8],
        csr: &[u8],
        now: UnixMs,
    ) -> Result<Verdict, Refusal> {
        self.verify_prepared(
            role,
            evidence,
            csr,
            now,
            &crate::model::attestor::Prepared::default(),
        )
    }

    /// [`Self::verify_as`] with what `prepare` returned (the second run).
    fn verify_prepared(
        &self,
        role: Role,
        evidence: &[u8],
        csr: &[u8],
        now: UnixMs,
        prepared: &crate::model::attestor::Prepared,
    ) -> Result<Verdict, Refusal> {
        let spki = csr_spki(csr);
        self.db
            .write_if(|tx| {
                let run = || -> Result<Result<Verdict, Refusal>, Refusal> {
                    let claims = HardwareClaims::default();
                    let token = OpenedToken::Malformed;
                    let input = AttestInput {
                        role,
                        evidence,
                        // A token is ignored by this attestor.
                        token: Some(&token),
                        csr_der: csr,
                        csr_sha256: bc_wire::sha256(csr),
                        csr_spki_der: &spki,
                        csr_spki_sha256: bc_wire::sha256(&spki),
                        claims: &claims,
                        tpm: None,
                        now,
                        source: None,
                        prepared,
                    };
                    // JoinService's role check around the attestor, as a join
                    // has it (its refusal rolls back what the attestor wrote).
                    crate::plane::join::check_role(&self.attestor, role, None)?;
                    let out = self.attestor.verify(tx, &input);
                    if let Ok(Verdict::Admit(result)) = &out {
                        crate::plane::join::check_role(&self.attestor, role, Some(result))?;
                    }
                    Ok(out)
                };
                Ok::<_, DbError>(match run() {
                    Ok(out) => (out, Commit::Yes),
                    Err(r) => (Err(r), Commit::No),
                })
            })
            .unwrap()
    }

    fn run(&self, evidence: &[u8]) -> Result<Verdict, Refusal> {
        self.run_at(evidence, CSR, NOW)
    }

    fn reason(&self, evidence: &[u8]) -> String {
        reason(self.run(evidence))
    }

    fn admitted(&self, evidence: &[u8]) -> AttestationResult {
        match self.run(evidence) {
            Ok(Verdict::Admit(r)) => *r,
            Ok(Verdict::Defer(d)) => panic!("deferred: {d:?}"),
            Ok(Verdict::Prepare(_)) => panic!("asked for a fetch"),
            Err(r) => panic!("refused: {}", r.reason),
        }
    }

    fn count(&self, table: &str) -> i64 {
        self.db
            .read(|tx| {
                tx.query_one(&format!("SELECT count(*) FROM {table}"), params![])
                    .and_then(|r| r.get(0))
            })
            .unwrap()
    }

    /// Lets the fixture's EK join as a new node in the default pool.
    fn resolve(&self) {
        enroll::add_resolve(&self.db, &ek_sha256(), enroll::ResolveTarget::default()).unwrap();
    }
}

fn reason(r: Result<Verdict, Refusal>) -> String {
    match r {
        Ok(Verdict::Admit(_)) => "admitted".into(),
        Ok(Verdict::Defer(Deferral::Pending { .. })) => "pending".into(),
        Ok(Verdict::Defer(Deferral::Challenge { .. })) => "challenge".into(),
        Ok(Verdict::Prepare(_)) => "prepare".into(),
        Err(r) => r.reason.to_string(),
    }
}

#[test]
fn round_one_challenges_and_writes_nothing() {
    let f = fixture();
    let Ok(Verdict::Defer(Deferral::Challenge {
        attestor,
        payload,
        not_after,
    })) = f.run(&hello_evidence(hello()))
    else {
        panic!("no challenge")
    };
    assert_eq!(attestor, AttestorId::Tpm);
    assert_eq!(not_after, NOW + MAX_CHALLENGE_TTL_MS);
    let ch = TpmChallenge::decode(payload.as_slice()).unwrap();
    // The sizes swtpm's ActivateCredential takes (tpm-notes §5).
    assert_eq!(ch.id_object.len(), 2 + 32 + 34);
    assert_eq!(ch.encrypted_secret.len(), 256);
    let st =
        ChallengeState::open(&ChallengeKey::new(*KEY), &ch.state, &bc_wire::sha256(CSR)).unwrap();
    assert_eq!(hex::encode(st.ek_spki_sha256), ek_sha256());
    assert_eq!(st.ak_public, hello().ak_public);
    assert_eq!(st.not_after, not_after);
    assert!(st.ek_issuer.contains("BCD Test EK Issuing CA 01"));
    // Sealed for this CSR only.
    assert!(ChallengeState::open(&ChallengeKey::new(*KEY), &ch.state, &[0; 32]).is_err());
    // No PCR policy: no PCR to quote, and a certification over the nonce will do.
    assert!(ch.pcrs.is_empty() && ch.fresh_certification);
    for table in ["join_requests", "node_bindings", "nodes", "events"] {
        assert_eq!(f.count(table), 0, "{table}");
    }
}

#[test]
fn round_one_refusals() {
    let f = fixture();
    // Before the EK certificate existed.
    assert_eq!(
        reason(f.run_at(&hello_evidence(hello()), CSR, CAPTURED_AT - 3_600_000)),
        "ek-certificate"
    );
    let mut h = hello();
    h.ek_certificate.truncate(100);
    assert_eq!(f.reason(&hello_evidence(h)), "ek-certificate");
    let mut h = hello();
    let n = h.ek_public.len();
    h.ek_public[n - 1] ^= 1;
    assert_eq!(f.reason(&hello_evidence(h)), "ek-mismatch");
    // The node key is not an attestation key (not restricted); the EK is not ECC.
    let mut h = hello();
    h.ak_public = certification(KEY2_CERT).public;
    assert_eq!(f.reason(&hello_evidence(h)), "ak-attributes");
    let mut h = hello();
    h.ak_public = h.ek_public.clone();
    assert_eq!(f.reason(&hello_evidence(h)), "ak-attributes");
    let mut h = hello();
    h.ak_public.clear();
    assert_eq!(f.reason(&hello_evidence(h)), "ak-attributes");
    assert_eq!(f.reason(b"\xff\xff\xff"), TpmReason::EvidenceMalformed);
    assert_eq!(f.reason(&[]), TpmReason::EvidenceMalformed);

    // Unknown maker: no roots configured at all.
    let bare = {
        let dir = tempfile::tempdir().unwrap();
        let db = Store::open_dir(dir.path()).unwrap();
        Fixture {
            _dir: dir,
            db,
            attestor: TpmAttestor::new(TpmConfig::default(), ChallengeKey::new(*KEY)),
        }
    };
    assert_eq!(bare.reason(&hello_evidence(hello())), "ek-chain");
    assert_eq!(f.count("events") + f.count("join_requests"), 0);
}

#[test]
fn enrollment_pending_approved_once() {
    let f = fixture();
    let ev = answer_evidence(answer());
    let Ok(Verdict::Defer(Deferral::Pending {
        request_id,
        retry_after_seconds,
    })) = f.run(&ev)
    else {
        panic!("not pending")
    };
    assert!(request_id.starts_with("req_"));
    assert_eq!(retry_after_seconds, 30);
    // Asking again answers the same request.
    let Ok(Verdict::Defer(Deferral::Pending {
        request_id: again, ..
    })) = f.run(&ev)
    else {
        panic!("not pending")
    };
    assert_eq!(again, request_id);
    let reqs = enroll::list_requests(&f.db).unwrap();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].ek_sha256.as_deref(), Some(ek_sha256().as_str()));
    assert_eq!(reqs[0].status.as_str(), "pending");
    assert!(reqs[0].ek_issuer.contains("BCD Test EK Issuing CA 01"));

    crate::model::pools::create_pool(&f.db, "metal", "root", None, &["join-token", "tpm"]).unwrap();
    enroll::approve(&f.db, &request_id, Some("metal"), None).unwrap();
    let r = f.admitted(&ev);
    assert_eq!(r.reclaim_node_id, None);
    assert_eq!(r.pool_id.as_deref(), Some("metal"));
    assert_eq!(r.node_key.kind(), NodeKeyKind::Tpm);
    let ak = Public::parse(&hello().ak_public).unwrap();
    assert_eq!(
        r.node_key.statement(),
        Some(wtpm::ak_statement(&ak.name()).unwrap().as_str())
    );
    assert_eq!(
        r.binding(),
        Some(Binding {
            kind: "tpm-ek".into(),
            key: ek_sha256()
        })
    );
    let reqs = enroll::list_requests(&f.db).unwrap();
    assert!(reqs[0].used_at.is_some());
    // Used: the next proof (no binding was written here, JoinService does
    // that) files a new request rather than reusing the approval.
    assert_eq!(f.reason(&ev), "pending");
    assert_eq!(enroll::list_requests(&f.db).unwrap().len(), 2);
}

/// A place naming a site admits a site node of it, and only a site node;
/// a place without one admits only a plain node.
#[test]
fn a_site_in_the_place_fixes_the_role_and_the_site() {
    let f = fixture();
    let ev = answer_evidence(answer());
    let site = crate::model::sites::create(&f.db, "dc1").unwrap().id;
    let as_role = |role| {
        f.db.write(|tx| tx.execute("DELETE FROM attestation_uses", params![]))
            .unwrap();
        f.verify_as(role, &ev, CSR, NOW)
    };
    // No site: a site join is refused, a node join admitted unscoped.
    f.resolve();
    assert_eq!(reason(as_role(Role::Site)), TpmReason::Role);
    let Ok(Verdict::Admit(r)) = as_role(Role::Node) else {
        panic!("node not admitted")
    };
    assert_eq!(r.scope, None);

    // A resolve entry naming the site (by name): a site node of it only.
    let target = enroll::ResolveTarget {
        site: Some("dc1"),
        ..Default::default()
    };
    enroll::add_resolve(&f.db, &ek_sha256(), target).unwrap();
    assert_eq!(
        enroll::list_resolve(&f.db).unwrap()[0].site_id.as_deref(),
        Some(site.as_str())
    );
    assert_eq!(reason(as_role(Role::Node)), TpmReason::Role);
    let Ok(Verdict::Admit(r)) = as_role(Role::Site) else {
        panic!("site node not admitted")
    };
    assert_eq!(r.scope.unwrap().site_id.as_deref(), Some(site.as_str()));

    // An unknown site, or a site with --node, is refused at the command.
    let unknown = enroll::ResolveTarget {
        site: Some("nowhere"),
        ..Default::default()
    };
    let e = enroll::add_resolve(&f.db, &ek_sha256(), unknown).unwrap_err();
    assert!(e.to_string().contains("no site \"nowhere\""), "{e}");
    let node = insert_node(&f.db, "node_aaaaaaaaaaaaaaaaaaaaaaaaaa");
    let both = enroll::ResolveTarget {
        site: Some("dc1"),
        node: Some(&node),
        ..Default::default()
    };
    assert!(enroll::add_resolve(&f.db, &ek_sha256(), both).is_err());

    // An approval naming the site: the same.
    assert!(enroll::remove_resolve(&f.db, &ek_sha256()).unwrap());
    let Ok(Verdict::Defer(Deferral::Pending { request_id, .. })) = as_role(Role::Site) else {
        panic!("not pending")
    };
    assert!(enroll::approve(&f.db, &request_id, None, Some("nowhere")).is_err());
    enroll::approve(&f.db, &request_id, None, Some(&site)).unwrap();
    // A wrong role spends nothing: the approval is still unused.
    assert_eq!(reason(as_role(Role::Node)), TpmReason::Role);
    let Ok(Verdict::Admit(r)) = as_role(Role::Site) else {
        panic!("approved site node not admitted")
    };
    assert_eq!(r.scope.unwrap().site_id.as_deref(), Some(site.as_str()));
}

#[test]
fn denied_request_is_refused_until_resolved() {
    let f = fixture();
    let ev = answer_evidence(answer());
    let Ok(Verdict::Defer(Deferral::Pending { request_id, .. })) = f.run(&ev) else {
        panic!("not pending")
    };
    enroll::deny(&f.db, &request_id).unwrap();
    assert_eq!(f.reason(&ev), TpmReason::EnrollmentDenied);
    assert!(enroll::approve(&f.db, &request_id, None, None).is_err());
    f.resolve();
    assert_eq!(f.reason(&ev), "admitted");
}

#[test]
fn placement_order_binding_then_resolve_then_requests() {
    let f = fixture();
    let ev = answer_evidence(answer());
    crate::model::pools::create_pool(&f.db, "metal", "root", None, &["join-token", "tpm"]).unwrap();
    // A resolve entry into a pool.
    enroll::add_resolve(
        &f.db,
        &ek_sha256().to_uppercase(),
        enroll::ResolveTarget {
            pool: Some("metal"),
            ..Default::default()
        },
    )
    .unwrap();
    let r = f.admitted(&ev);
    assert_eq!(
        (r.reclaim_node_id, r.pool_id.as_deref()),
        (None, Some("metal"))
    );
    assert_eq!(f.count("join_requests"), 0);

    // A resolve entry naming a node.
    let node = insert_node(&f.db, "node_aaaaaaaaaaaaaaaaaaaaaaaaaa");
    enroll::add_resolve(
        &f.db,
        &ek_sha256(),
        enroll::ResolveTarget {
            node: Some(&node),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(
        f.admitted(&ev).reclaim_node_id.as_deref(),
        Some(node.as_str())
    );

    // A node whose hardware key is this EK (its ramdisk proved it, then a
    // provisioned token re-keyed it as a node) wins over the resolve entry.
    let deployed = insert_node(&f.db, "node_cccccccccccccccccccccccccc");
    f.db.write(|tx| {
        crate::model::hardware::record(
            tx,
            &deployed,
            &crate::model::hardware::HardwareKey {
                key: format!("tpm-ek:{}", ek_sha256().to_lowercase()),
                product_uuid: None,
            },
        )
    })
    .unwrap();
    assert_eq!(
        f.admitted(&ev).reclaim_node_id.as_deref(),
        Some(deployed.as_str())
    );

    // A binding wins over both.
    let bound = insert_node(&f.db, "node_bbbbbbbbbbbbbbbbbbbbbbbbbb");
    f.db.write(|tx| records::insert_binding(tx, "tpm-ek", &ek_sha256(), &bound, NOW))
        .unwrap();
    let r = f.admitted(&ev);
    assert_eq!(r.reclaim_node_id.as_deref(), Some(bound.as_str()));
    assert_eq!(r.pool_id, None);
    assert_eq!(f.count("join_requests"), 0);
}

fn insert_node(db: &Store, id: &str) -> String {
    crate::test_support::insert_node(db, id, AttestorId::JoinToken, NOW);
    id.to_owned()
}

#[test]
fn round_two_state_secret_and_expiry() {
    let f = fixture();
    f.resolve();
    assert_eq!(f.reason(&answer_evidence(answer())), "admitted");

    let mut a = answer();
    let n = a.state.len();
    a.state[n - 1] ^= 1;
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::ChallengeState);
    let mut a = answer();
    a.state.clear();
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::ChallengeState);
    // Another CSR: the state is bound to the one of round 1.
    let (_, other_csr) = {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let der = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .serialize_request(&key)
            .unwrap()
            .der()
            .to_vec();
        (key, der)
    };
    assert_eq!(
        reason(f.run_at(&answer_evidence(answer()), &other_csr, NOW)),
        TpmReason::ChallengeState
    );
    // Under another challenge key (another control plane).
    let other = TpmAttestor::new(TpmConfig::default(), ChallengeKey::new([9; 32]));
    let refused =
        f.db.write_if(|tx| {
            let spki = csr_spki(CSR);
            let claims = HardwareClaims::default();
            let ev = answer_evidence(answer());
            let input = AttestInput {
                role: Role::Node,
                evidence: &ev,
                token: None,
                csr_der: CSR,
                csr_sha256: bc_wire::sha256(CSR),
                csr_spki_der: &spki,
                csr_spki_sha256: bc_wire::sha256(&spki),
                claims: &claims,
                tpm: None,
                now: NOW,
                source: None,
                prepared: &crate::model::attestor::Prepared::default(),
            };
            Ok::<_, DbError>((reason(other.verify(tx, &input)), Commit::No))
        })
        .unwrap();
    assert_eq!(refused, TpmReason::ChallengeState);

    // Expiry at the database's time: 5 minutes after round 1.
    let deadline = ChallengeState::open(
        &ChallengeKey::new(*KEY),
        &answer().state,
        &bc_wire::sha256(CSR),
    )
    .unwrap()
    .not_after;
    assert!(
        (CAPTURED_AT + MAX_CHALLENGE_TTL_MS..CAPTURED_AT + MAX_CHALLENGE_TTL_MS + 1000)
            .contains(&deadline)
    );
    assert_eq!(
        reason(f.run_at(&answer_evidence(answer()), CSR, deadline)),
        "admitted"
    );
    assert_eq!(
        reason(f.run_at(&answer_evidence(answer()), CSR, deadline + 1)),
        TpmReason::ChallengeExpired
    );

    let mut a = answer();
    a.secret[0] ^= 1;
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::ChallengeSecret);
    let mut a = answer();
    a.secret.pop();
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::ChallengeSecret);
    let mut a = answer();
    a.secret.clear();
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::ChallengeSecret);
}

#[test]
fn a_challenge_admits_once() {
    let f = fixture();
    f.resolve();
    let ev = answer_evidence(answer());
    assert_eq!(f.reason(&ev), "admitted");
    assert_eq!(f.count("attestation_uses"), 1);
    // The same answer again, and again later while the challenge is open.
    assert_eq!(
        reason(f.replay_at(&ev, CSR, NOW)),
        TpmReason::ChallengeReused
    );
    assert_eq!(
        reason(f.replay_at(&ev, CSR, NOW + 60_000)),
        TpmReason::ChallengeReused
    );
    let (subject, expires_at): (String, UnixMs) =
        f.db.read(|tx| {
            tx.query_one(
                "SELECT subject, expires_at FROM attestation_uses WHERE attestor = 'tpm'",
                params![],
            )
            .and_then(|r| Ok((r.get(0)?, r.get(1)?)))
        })
        .unwrap();
    // Kept until the challenge's own deadline, keyed by its sealed state.
    let st = ChallengeState::open(
        &ChallengeKey::new(*KEY),
        &answer().state,
        &bc_wire::sha256(CSR),
    )
    .unwrap();
    assert_eq!(expires_at, st.not_after);
    assert_eq!(subject, hex::encode(bc_wire::sha256(&answer().state)));
    // An answer that is refused (a bad secret) or only deferred spends nothing.
    let g = fixture();
    let mut bad = answer();
    bad.secret[0] ^= 1;
    assert_eq!(
        reason(g.replay_at(&answer_evidence(bad), CSR, NOW)),
        TpmReason::ChallengeSecret
    );
    assert_eq!(reason(g.replay_at(&ev, CSR, NOW)), "pending");
    assert_eq!(g.count("attestation_uses"), 0);
    g.resolve();
    assert_eq!(reason(g.replay_at(&ev, CSR, NOW)), "admitted");
    assert_eq!(
        reason(g.replay_at(&ev, CSR, NOW)),
        TpmReason::ChallengeReused
    );
}

#[test]
fn round_two_quote_and_pcrs() {
    let f = fixture();
    f.resolve();
    let mut a = answer();
    let n = a.quote_signature.len();
    a.quote_signature[n - 1] ^= 1;
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::QuoteSignature);
    let mut a = answer();
    a.quote[20] ^= 1;
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::QuoteSignature);
    let mut a = answer();
    a.quote_signature.clear();
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::QuoteSignature);

    // A real quote by the same AK over another nonce.
    let other = TpmAnswer::decode(OTHER_NONCE_QUOTE).unwrap();
    let mut a = answer();
    a.quote = other.quote;
    a.quote_signature = other.quote_signature;
    a.pcr_values = other.pcr_values;
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::QuoteNonce);
    // A real AK signature over something that is not a quote.
    let cert = answer().node_key.unwrap();
    let mut a = answer();
    a.quote = cert.certify_info;
    a.quote_signature = cert.signature;
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::QuoteNonce);

    // PCR values that do not hash to the quote's digest.
    let mut a = answer();
    assert_eq!(a.pcr_values.len(), 24);
    a.pcr_values.pop();
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::QuotePcrs);
    let mut a = answer();
    a.pcr_values[3][0] ^= 1;
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::QuotePcrs);
    let mut a = answer();
    a.pcr_values.swap(0, 17);
    if a.pcr_values[0] != a.pcr_values[17] {
        assert_eq!(f.reason(&answer_evidence(a)), TpmReason::QuotePcrs);
    }
    let mut a = answer();
    a.pcr_values[0].push(0);
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::QuotePcrs);
}

/// An answer without a quote (`fresh_certification`) stands only with the
/// node key certified over the nonce the quote would carry.
#[test]
fn round_two_without_a_quote() {
    let quoteless = |node_key: Option<TpmKeyCertification>| {
        let mut a = answer();
        a.quote.clear();
        a.quote_signature.clear();
        a.pcr_values.clear();
        a.node_key = node_key;
        answer_evidence(a)
    };
    let real = answer().node_key;
    let f = fixture();
    f.resolve();
    // A real certification, but over sha256(csr) (made before round 1):
    // not fresh, so it cannot stand for the quote.
    assert_eq!(f.reason(&quoteless(real.clone())), "node-key-nonce");
    assert_eq!(
        f.reason(&quoteless(Some(certification(OTHER_NONCE_CERT)))),
        "node-key-nonce"
    );
    // Nothing signed by the AK over the nonce at all.
    assert_eq!(f.reason(&quoteless(None)), TpmReason::NodeKeyNotCertified);
    let any = fixture_with(TpmConfig {
        node_key: NodeKeyPolicy::Any,
        ..TpmConfig::default()
    });
    any.resolve();
    assert_eq!(any.reason(&quoteless(None)), TpmReason::QuoteSignature);
    // Parts of a quote without the quote.
    let mut a = answer();
    a.quote.clear();
    assert_eq!(f.reason(&answer_evidence(a)), TpmReason::QuoteSignature);
    // A PCR policy needs its quote.
    let mut config = TpmConfig::default();
    config
        .pcr_policy
        .insert(bc_wire::pcr::PcrBank::Sha256, 0, vec![0; 32])
        .unwrap();
    let f = fixture_with(config);
    f.resolve();
    assert_eq!(f.reason(&quoteless(real)), TpmReason::QuoteSignature);
    assert_eq!(f.count("attestation_uses"), 0);
}

#[test]
fn pcr_policy() {
    use bc_wire::pcr::PcrBank;
    let pcr = |i: usize| answer().pcr_values[i].clone();
    let mut config = TpmConfig::default();
    config
        .pcr_policy
        .insert(PcrBank::Sha256, 0, pcr(0))
        .unwrap();
    config
        .pcr_policy
        .insert(PcrBank::Sha256, 23, pcr(23))
        .unwrap();
    let f = fixture_with(config.clone());
    f.resolve();
    assert_eq!(f.reason(&answer_evidence(answer())), "admitted");
    let mut wrong = config.clone();
    let mut v = pcr(7);
    v[31] ^= 1;
    wrong.pcr_policy.insert(PcrBank::Sha256, 7, v).unwrap();
    let f = fixture_with(wrong);
    f.resolve();
    assert_eq!(f.reason(&answer_evidence(answer())), TpmReason::PcrPolicy);
    // A SHA-256 quote against a policy that names only SHA-1 values.
    let mut sha1_only = TpmConfig::default();
    sha1_only
        .pcr_policy
        .insert(PcrBank::Sha1, 0, vec![0; 20])
        .unwrap();
    let f = fixture_with(sha1_only);
    f.resolve();
    assert_eq!(f.reason(&answer_evidence(answer())), TpmReason::PcrPolicy);
    // Both banks: the SHA-256 quote meets its SHA-256 half.
    let mut both = config;
    both.pcr_policy
        .insert(PcrBank::Sha1, 0, vec![0xab; 20])
        .unwrap();
    let f = fixture_with(both);
    f.resolve();
    assert_eq!(f.reason(&answer_evidence(answer())), "admitted");
}

#[test]
fn pcr_selection_checks() {
    let v = vec![vec![1u8; 32], vec![2u8; 32]];
    let digest = bc_wire::sha256(&v.concat());
    // PCRs 1 and 9.
    let sel = vec![(ALG_SHA256, vec![0b10, 0b10, 0])];
    let (bank, got) = pcr::quoted_pcrs(&sel, &v, &digest).unwrap();
    assert_eq!(bank, bc_wire::pcr::PcrBank::Sha256);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), [1, 9]);
    assert_eq!(got[&9], &[2u8; 32][..]);
    // SHA-1 with 32-byte values, two entries, a count mismatch, a wrong digest.
    assert!(pcr::quoted_pcrs(&[(0x0004, vec![0b10, 0b10, 0])], &v, &digest).is_none());
    assert!(pcr::quoted_pcrs(&[sel[0].clone(), sel[0].clone()], &v, &digest).is_none());
    assert!(pcr::quoted_pcrs(&[(ALG_SHA256, vec![0b10, 0, 0])], &v, &digest).is_none());
    assert!(pcr::quoted_pcrs(&sel, &v, &[0; 32]).is_none());
}

#[test]
fn node_key_refusals_on_real_certifications() {
    let f = fixture();
    f.resolve();
    let with = |c: Option<TpmKeyCertification>| {
        let mut a = answer();
        a.node_key = c;
        answer_evidence(a)
    };
    let real = answer().node_key.unwrap();
    let key2 = certification(KEY2_CERT);

    assert_eq!(f.reason(&with(None)), TpmReason::NodeKeyNotCertified);
    // Another key's (valid) certification presented for this key: the name.
    let mut c = key2.clone();
    c.public = real.public.clone();
    assert_eq!(f.reason(&with(Some(c))), "node-key-name");
    // Another key, certified in full, but not the CSR's.
    assert_eq!(f.reason(&with(Some(key2))), "node-key-not-csr");
    // The AK itself: restricted, not a node key.
    assert_eq!(
        f.reason(&with(Some(certification(AK_SELF_CERT)))),
        "node-key-attributes"
    );
    // Qualified by another CSR.
    assert_eq!(
        f.reason(&with(Some(certification(OTHER_NONCE_CERT)))),
        "node-key-nonce"
    );
    // A bent signature, a bent certification.
    let mut c = real.clone();
    c.signature[10] ^= 1;
    assert_eq!(f.reason(&with(Some(c))), "node-key-signature");
    let mut c = real.clone();
    c.certify_info[12] ^= 1;
    assert_eq!(f.reason(&with(Some(c))), "node-key-signature");
    let mut c = real.clone();
    c.public.truncate(10);
    assert_eq!(f.reason(&with(Some(c))), "node-key-malformed");
    assert_eq!(
        f.reason(&with(Some(TpmKeyCertification::default()))),
        "node-key-malformed"
    );
    assert_eq!(f.reason(&with(Some(real))), "admitted");
    assert_eq!(f.count("join_requests"), 0);
}

#[test]
fn node_key_any_admits_uncertified_only() {
    let f = fixture_with(TpmConfig {
        node_key: NodeKeyPolicy::Any,
        ..TpmConfig::default()
    });
    f.resolve();
    let mut a = answer();
    a.node_key = None;
    let r = f.admitted(&answer_evidence(a));
    assert_eq!(r.node_key.kind(), NodeKeyKind::Unattested);
    assert_eq!(r.node_key.statement(), None);
    assert!(r.binding().is_some());
    // A certification that is present is still checked.
    let mut a = answer();
    a.node_key = Some(certification(AK_SELF_CERT));
    assert_eq!(f.reason(&answer_evidence(a)), "node-key-attributes");
    assert_eq!(
        f.admitted(&answer_evidence(answer())).node_key.kind(),
        NodeKeyKind::Tpm
    );
}

#[test]
fn roles_other_than_node_or_site_are_refused() {
    let f = fixture();
    let out = f.verify_as(Role::Ramdisk, &hello_evidence(hello()), CSR, NOW);
    assert_eq!(reason(out), TpmReason::Role);
    assert_eq!(f.count("join_requests"), 0);
}

/// The whole join through JoinService, with the real TPM's answer: the
/// database clock is set to the capture's time and the control plane uses
/// the capture's challenge key.
mod through_join_service {
    use super::*;
    use crate::model::join_reasons::JoinReason;
    use crate::plane::api_error::ApiError;
    use bc_wire::agent::{join_response_body, JoinRequest, JoinResponseBody};

    use crate::test_support::{self, uri_sans as uris};

    /// The shared control plane fixture, with this module's steps.
    struct Cp(test_support::Cp);

    impl std::ops::Deref for Cp {
        type Target = test_support::Cp;
        fn deref(&self) -> &test_support::Cp {
            &self.0
        }
    }

    fn cp() -> Cp {
        let c = test_support::cp_with(None, |dir| {
            crate::fsutil::write_atomic(&dir.join(crate::pki::CHALLENGE_KEY), KEY, 0o600).unwrap();
        });
        add_test_roots(c.db());
        let system_now = c.now();
        c.move_clock(NOW - system_now);
        Cp(c)
    }

    impl Cp {
        fn join(&self, evidence: Vec<u8>) -> Result<JoinResponseBody, ApiError> {
            let resp = crate::plane::join::JoinService::new(&self.svc).join(JoinRequest {
                csr: CSR.to_vec(),
                role: Role::Node as i32,
                attestor: AttestorId::Tpm.as_str().into(),
                attestation: evidence,
                ..Default::default()
            })?;
            let vk = bc_wire::signing::verifying_key_from_spki(
                self.svc.bundle().join_signing_spki_der(),
            )
            .unwrap();
            bc_wire::signing::verify(
                &vk,
                bc_wire::signing::Purpose::JoinResponse,
                &[&resp.body],
                &resp.signature,
            )
            .unwrap();
            let body = JoinResponseBody::decode(resp.body.as_slice()).unwrap();
            assert_eq!(body.csr_sha256, bc_wire::sha256(CSR));
            Ok(body)
        }

        fn refusals(&self) -> Vec<(String, String)> {
            records::list_events(self.db())
                .unwrap()
                .into_iter()
                .filter(|e| e.kind == records::EVENT_JOIN_REFUSED)
                .map(|e| (e.attestor.unwrap_or_default(), e.reason.unwrap_or_default()))
                .collect()
        }
    }

    #[test]
    fn round_one_answers_a_signed_challenge() {
        let c = cp();
        let body = c.join(hello_evidence(hello())).unwrap();
        assert!(body.node_id.is_empty() && body.chain.is_empty());
        let Some(join_response_body::Deferral::Challenge(ch)) = body.deferral else {
            panic!("no challenge")
        };
        assert_eq!(ch.attestor, AttestorId::Tpm.as_str());
        assert!(ch.not_after_unix_ms > NOW);
        assert!(TpmChallenge::decode(ch.payload.as_slice()).is_ok());
        assert!(records::list_events(c.db()).unwrap().is_empty());
    }

    #[test]
    fn joins_then_reclaims_the_same_node() {
        let c = cp();
        enroll::add_resolve(c.db(), &ek_sha256(), enroll::ResolveTarget::default()).unwrap();
        let first = c.join(answer_evidence(answer())).unwrap();
        assert!(first.deferral.is_none());
        let ak = Public::parse(&hello().ak_public).unwrap();
        let statement = wtpm::ak_statement(&ak.name()).unwrap();
        assert_eq!(
            uris(&first.chain[0]),
            [
                format!("spiffe://bc.test/node/{}", first.node_id),
                statement.clone(),
                "urn:bc:scope:node".to_owned()
            ]
        );
        let (_, leaf) = x509_parser::parse_x509_certificate(&first.chain[0]).unwrap();
        assert_eq!(leaf.public_key().raw, csr_spki(CSR).as_slice());
        let bindings = records::list_bindings(c.db()).unwrap();
        assert_eq!(bindings.len(), 1);
        assert_eq!(
            (
                bindings[0].kind.as_str(),
                bindings[0].key.clone(),
                bindings[0].node_id.as_str()
            ),
            ("tpm-ek", ek_sha256(), first.node_id.as_str())
        );
        let ev = records::list_events(c.db()).unwrap();
        assert_eq!(ev[0].kind, records::EVENT_NODE_JOINED);
        assert_eq!(ev[0].attestor.as_deref(), Some(AttestorId::Tpm.as_str()));
        assert_eq!(ev[0].data["nodeKey"], "tpm");
        assert_eq!(ev[0].data["pool"], "default");

        // The same answer replayed: refused, nothing moves.
        assert!(matches!(
            c.join(answer_evidence(answer())),
            Err(ApiError::AccessDenied)
        ));
        assert_eq!(
            c.refusals(),
            [(
                AttestorId::Tpm.as_str().to_owned(),
                TpmReason::ChallengeReused.as_str().to_owned()
            )]
        );
        assert_eq!(
            records::list_nodes(c.db()).unwrap()[0].identity_generation,
            1
        );
        assert_eq!(records::list_joins(c.db()).unwrap().len(), 1);

        // The same TPM again (its identity moved aside) with a new challenge
        // (the capture holds one: forgetting its use stands in for a fresh
        // one): the same node, a new identity generation, the older
        // certificate revoked.
        c.db()
            .write(|tx| tx.execute("DELETE FROM attestation_uses", params![]))
            .unwrap();
        let second = c.join(answer_evidence(answer())).unwrap();
        assert_eq!(second.node_id, first.node_id);
        assert_eq!(uris(&second.chain[0])[1], statement);
        let nodes = records::list_nodes(c.db()).unwrap();
        assert_eq!((nodes.len(), nodes[0].identity_generation), (1, 2));
        let revoked: Vec<(i64, bool)> = c
            .db()
            .read(|tx| {
                tx.query("SELECT identity_generation, revoked_at IS NOT NULL FROM node_certs ORDER BY identity_generation", params![])?
                    .iter()
                    .map(|r| Ok((r.get(0)?, r.get(1)?)))
                    .collect::<Result<_, DbError>>()
            })
            .unwrap();
        assert_eq!(revoked, [(1, true), (2, false)]);
        let joins = records::list_joins(c.db()).unwrap();
        assert_eq!(
            joins
                .iter()
                .map(|j| (j.node_key.as_str(), j.identity_generation))
                .collect::<Vec<_>>(),
            [("tpm", 1), ("tpm", 2)]
        );
    }

    #[test]
    fn enrollment_through_join_service() {
        let c = cp();
        let body = c.join(answer_evidence(answer())).unwrap();
        let Some(join_response_body::Deferral::Pending(p)) = body.deferral else {
            panic!("not pending")
        };
        assert_eq!(p.retry_after_seconds, 30);
        // The deferral committed the request.
        let reqs = enroll::list_requests(c.db()).unwrap();
        assert_eq!(
            (reqs.len(), reqs[0].id.as_str()),
            (1, p.request_id.as_str())
        );
        enroll::approve(c.db(), &p.request_id, None, None).unwrap();
        let joined = c.join(answer_evidence(answer())).unwrap();
        assert!(!joined.node_id.is_empty());
        assert!(enroll::list_requests(c.db()).unwrap()[0].used_at.is_some());
    }

    #[test]
    fn a_resolve_entry_cannot_hand_over_a_node_bound_to_another_ek() {
        let c = cp();
        let node_a = insert_node(c.db(), "node_aaaaaaaaaaaaaaaaaaaaaaaaaa");
        c.db()
            .write(|tx| records::insert_binding(tx, "tpm-ek", &"f".repeat(64), &node_a, NOW))
            .unwrap();
        enroll::add_resolve(
            c.db(),
            &ek_sha256(),
            enroll::ResolveTarget {
                node: Some(&node_a),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(matches!(
            c.join(answer_evidence(answer())),
            Err(ApiError::AccessDenied)
        ));
        assert_eq!(
            c.refusals(),
            [(
                AttestorId::Tpm.as_str().to_owned(),
                JoinReason::BoundElsewhere.as_str().to_owned()
            )]
        );
        assert_eq!(records::list_bindings(c.db()).unwrap().len(), 1);
        assert_eq!(
            records::list_nodes(c.db()).unwrap()[0].identity_generation,
            1
        );
    }

    #[test]
    fn a_pool_for_tokens_only_refuses_the_tpm() {
        let c = cp();
        crate::model::tenants::create(c.db(), "bob").unwrap();
        crate::model::pools::create_pool(
            c.db(),
            "tokens",
            "bob",
            Some(&["join-token".to_owned()]),
            &["join-token", "tpm"],
        )
        .unwrap();
        enroll::add_resolve(
            c.db(),
            &ek_sha256(),
            enroll::ResolveTarget {
                pool: Some("tokens"),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(matches!(
            c.join(answer_evidence(answer())),
            Err(ApiError::AccessDenied)
        ));
        assert_eq!(
            c.refusals(),
            [(
                AttestorId::Tpm.as_str().to_owned(),
                JoinReason::PoolAttestor.as_str().to_owned()
            )]
        );
        let ev = records::list_events(c.db()).unwrap();
        assert_eq!(ev[0].data["poolOwner"], "bob");
        assert!(records::list_nodes(c.db()).unwrap().is_empty());
        assert!(records::list_bindings(c.db()).unwrap().is_empty());
    }
}

/// Round 1 without an EK certificate: `ek-chain` unless a resolve entry pins
/// that EK as uncertified; the pin is keyed on the public area's own SPKI
/// (the certificate's key, for this fixture), which must be a default EK
/// template; the challenge's state records the assurance `pinned`.
#[test]
fn an_uncertified_ek_needs_its_pin() {
    let f = fixture();
    let mut h = hello();
    h.ek_certificate.clear();
    assert_eq!(f.reason(&hello_evidence(h.clone())), "ek-chain");
    f.resolve();
    assert_eq!(f.reason(&hello_evidence(h.clone())), "ek-chain");
    let pin = enroll::ResolveTarget {
        uncertified: true,
        ..Default::default()
    };
    enroll::add_resolve(&f.db, &ek_sha256(), pin).unwrap();
    let Ok(Verdict::Defer(Deferral::Challenge { payload, .. })) = f.run(&hello_evidence(h.clone()))
    else {
        panic!("no challenge");
    };
    let ch = TpmChallenge::decode(payload.as_slice()).unwrap();
    let st =
        ChallengeState::open(&ChallengeKey::new(*KEY), &ch.state, &bc_wire::sha256(CSR)).unwrap();
    assert_eq!(st.ek_assurance, "pinned");
    assert_eq!(hex::encode(st.ek_spki_sha256), ek_sha256());
    // Not a default EK template (userWithAuth set): refused as such.
    let mut other = h.clone();
    other.ek_public[7] |= 0x40;
    assert_eq!(f.reason(&hello_evidence(other)), "ek-mismatch");
    // With its certificate, the pinned EK is verified as usual (and NV).
    let h = hello();
    let Ok(Verdict::Defer(Deferral::Challenge { payload, .. })) = f.run(&hello_evidence(h)) else {
        panic!("no challenge");
    };
    let ch = TpmChallenge::decode(payload.as_slice()).unwrap();
    let st =
        ChallengeState::open(&ChallengeKey::new(*KEY), &ch.state, &bc_wire::sha256(CSR)).unwrap();
    assert_eq!(st.ek_assurance, "nv");
}

/// The hello of the fixtures' machine without its certificate, from a TPM
/// whose maker has a service (Intel's, by default).
fn intel_hello() -> TpmHello {
    let mut h = hello();
    h.ek_certificate.clear();
    h.tpm_manufacturer = u32::from_be_bytes(*b"INTC");
    h
}

/// Issue 27, 2: round 1 without a certificate, from a maker with a
/// service, asks for a fetch only for an EK an operator knows; any other
/// is challenged as it is, its state carrying that the certificate is
/// pending, with the EK, maker and intermediates to verify it by.
#[test]
fn round_one_fetches_only_for_a_known_ek() {
    let f = fixture();
    let h = intel_hello();
    let Ok(Verdict::Defer(Deferral::Challenge { payload, .. })) = f.run(&hello_evidence(h.clone()))
    else {
        panic!("no challenge");
    };
    let ch = TpmChallenge::decode(payload.as_slice()).unwrap();
    let st =
        ChallengeState::open(&ChallengeKey::new(*KEY), &ch.state, &bc_wire::sha256(CSR)).unwrap();
    assert_eq!(hex::encode(st.ek_spki_sha256), ek_sha256());
    let pending = st.pending.expect("the certificate is pending");
    assert_eq!(pending.ek_public, h.ek_public);
    assert_eq!(pending.manufacturer, h.tpm_manufacturer);
    assert_eq!(pending.intermediates, h.ek_intermediates);
    // Another maker: no service, so no certificate at all.
    let mut other = h.clone();
    other.tpm_manufacturer = u32::from_be_bytes(*b"IBM\0");
    assert_eq!(f.reason(&hello_evidence(other)), "ek-chain");
    // Known (here on the resolve list): fetched first.
    f.resolve();
    assert_eq!(f.reason(&hello_evidence(h)), "prepare");
}

/// Round 2 of a challenge whose certificate is pending: the proof, then a
/// fetch asked for; with the maker's certificate the EK is verified and
/// the join request names its issuer; the maker's `404` is `ek-chain` and
/// a failed service `ek-service`, filing nothing.
#[test]
fn round_two_fetches_and_verifies_a_pending_certificate() {
    let f = fixture();
    let key = ChallengeKey::new(*KEY);
    let csr_sha256 = bc_wire::sha256(CSR);
    let mut a = answer();
    let mut st = ChallengeState::open(&key, &a.state, &csr_sha256).unwrap();
    let h = intel_hello();
    st.ek_issuer.clear();
    st.ek_serial.clear();
    st.pending = Some(state::PendingCertificate {
        ek_public: h.ek_public.clone(),
        manufacturer: h.tpm_manufacturer,
        intermediates: h.ek_intermediates.clone(),
    });
    a.state = st.seal(&key, &csr_sha256).unwrap();
    let evidence = answer_evidence(a);
    assert_eq!(f.reason(&evidence), "prepare");

    let said = |said: Said| {
        crate::model::attestor::Prepared::new(ServiceAnswer {
            ek_sha256: ek_sha256(),
            said,
        })
    };
    let run = |p: &crate::model::attestor::Prepared| {
        f.db.write(|tx| tx.execute("DELETE FROM attestation_uses", params![]))
            .unwrap();
        reason(f.verify_prepared(Role::Node, &evidence, CSR, NOW, p))
    };
    assert_eq!(run(&said(Said::NotFound)), "ek-chain");
    assert_eq!(run(&said(Said::Failed)), TpmReason::EkService);
    assert_eq!(f.count("join_requests"), 0);
    // An answer for another EK is not this one's.
    let other = crate::model::attestor::Prepared::new(ServiceAnswer {
        ek_sha256: "00".repeat(32),
        said: Said::Certificate(hello().ek_certificate),
    });
    assert_eq!(run(&other), "prepare");

    assert_eq!(
        run(&said(Said::Certificate(hello().ek_certificate))),
        "pending"
    );
    let issuer: String =
        f.db.read(|tx| {
            tx.query_one("SELECT ek_issuer FROM join_requests", params![])
                .and_then(|r| r.get(0))
        })
        .unwrap();
    assert!(issuer.contains("CN="), "{issuer}");
    // Pinned uncertified: a failed service joins it `pinned`.
    let pin = enroll::ResolveTarget {
        uncertified: true,
        ..Default::default()
    };
    enroll::add_resolve(&f.db, &ek_sha256(), pin).unwrap();
    let Ok(Verdict::Admit(r)) =
        f.verify_prepared(Role::Node, &evidence, CSR, NOW, &said(Said::Failed))
    else {
        panic!("not admitted");
    };
    assert_eq!(r.ek_assurance(), Some(EkAssurance::Pinned));
}
