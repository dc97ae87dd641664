//! Renew against a real control plane DIR (SQLite file, PKI bundle), real
//! certificates, and the real TPM output of the tpm attestor's fixtures
//! (`attestors/tpm/testdata`): the AK and its TPM2_Certify of the node key
//! that signed `csr.der`.

use bc_wire::agent::{tpm_attestation, Role, TpmAttestation, TpmKeyCertification};
use rcgen::{KeyPair, PublicKeyData};

use super::*;
use crate::store::params;
use crate::test_support::{self, key, plain_csr, Cp};

const HELLO: &[u8] = include_bytes!("../../attestors/tpm/testdata/hello.bin");
const ANSWER: &[u8] = include_bytes!("../../attestors/tpm/testdata/answer.bin");
/// Signed by the TPM-held key that `answer.bin` certifies.
const TPM_CSR: &[u8] = include_bytes!("../../attestors/tpm/testdata/csr.der");
const KEY2_CERT: &[u8] = include_bytes!("../../attestors/tpm/testdata/key2-certification.bin");
const AK_SELF_CERT: &[u8] =
    include_bytes!("../../attestors/tpm/testdata/ak-self-certification.bin");
const OTHER_NONCE_CERT: &[u8] =
    include_bytes!("../../attestors/tpm/testdata/other-nonce-certification.bin");

/// A control plane DIR for Renew (the shared [`Cp`] and this module's
/// steps).
struct Fixture(Cp);

impl std::ops::Deref for Fixture {
    type Target = Cp;
    fn deref(&self) -> &Cp {
        &self.0
    }
}

fn fixture() -> Fixture {
    Fixture(test_support::cp())
}

/// A CSR that asks for a name and a SAN of its own: neither may reach the
/// certificate.
fn csr_for(key: &KeyPair) -> Vec<u8> {
    let mut params = rcgen::CertificateParams::new(vec!["evil.example".to_owned()]).unwrap();
    params.subject_alt_names.push(rcgen::SanType::URI(
        rcgen::string::Ia5String::try_from("urn:bc:tpm-ak:sha256:00").unwrap(),
    ));
    params.serialize_request(key).unwrap().der().to_vec()
}

fn request(csr: Vec<u8>) -> RenewRequest {
    RenewRequest {
        csr,
        key_attestation: None,
        boot: None,
    }
}

impl Fixture {
    /// Joins a node with a token (into `pool`); returns its id and leaf.
    fn join(&self, pool: Option<&str>) -> (String, Vec<u8>) {
        let (body, _) = self.token_join(Role::Node, pool);
        (body.node_id, body.chain[0].clone())
    }

    /// A node joined with a certified TPM key: its certificate names the
    /// fixtures' AK, as a tpm join writes it.
    fn tpm_node(&self, statement: &str) -> (String, Vec<u8>) {
        let id = "node_tpmfixture".to_owned();
        test_support::insert_node(self.db(), &id, bc_wire::AttestorId::Tpm, self.now());
        let leaf = self.issue(&id, &key(), &[statement.to_owned()], 1, true);
        (id, leaf)
    }

    fn renew(&self, leaf: &[u8], req: &RenewRequest) -> Result<RenewResponse, ApiError> {
        RenewService::new(&self.svc).renew(Some(leaf), req)
    }

    /// The reason of the one refusal `f` causes, checked to be the same
    /// ACCESS_DENIED, "Renew refused" every time.
    fn refused(&self, f: impl FnOnce() -> Result<RenewResponse, ApiError>) -> String {
        let before = self.renew_refusals().len();
        let err = f().expect_err("renewed");
        assert!(matches!(err, ApiError::RenewRefused), "{err:?}");
        assert_eq!(err.public_message(), "Renew refused");
        assert_eq!(err.http_status(), 403);
        assert_eq!(err.code(), bc_wire::agent::Code::AccessDenied);
        let all = self.renew_refusals();
        assert_eq!(all.len(), before + 1);
        all[before].reason.clone().unwrap()
    }

    fn renew_refusals(&self) -> Vec<records::EventRow> {
        records::list_events(self.db())
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == records::EVENT_RENEW_REFUSED)
            .collect()
    }

    fn renewals(&self) -> Vec<records::EventRow> {
        records::list_events(self.db())
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == records::EVENT_NODE_RENEWED)
            .collect()
    }
}

fn ak_public() -> Vec<u8> {
    match TpmAttestation::decode(HELLO).unwrap().round {
        Some(tpm_attestation::Round::Hello(h)) => h.ak_public,
        _ => panic!("hello.bin is not a hello"),
    }
}

fn node_key_certification() -> TpmKeyCertification {
    match TpmAttestation::decode(ANSWER).unwrap().round {
        Some(tpm_attestation::Round::Answer(a)) => a.node_key.unwrap(),
        _ => panic!("answer.bin is not an answer"),
    }
}

fn statement_of(public: &[u8]) -> String {
    wtpm::ak_statement(&Public::parse(public).unwrap().name()).unwrap()
}

fn attestation(ak_public: Vec<u8>, c: TpmKeyCertification) -> TpmKeyAttestation {
    TpmKeyAttestation {
        ak_public,
        key_public: c.public,
        certify_info: c.certify_info,
        signature: c.signature,
    }
}

fn tpm_request(att: Option<TpmKeyAttestation>) -> RenewRequest {
    RenewRequest {
        csr: TPM_CSR.to_vec(),
        key_attestation: att,
        boot: None,
    }
}

#[test]
fn renews_a_token_node_and_keeps_older_certificates() {
    let f = fixture();
    let (node_id, leaf) = f.join(None);
    let next = key();
    let resp = f.renew(&leaf, &request(csr_for(&next))).unwrap();
    assert_eq!(resp.chain.len(), 2);
    assert_eq!(resp.chain[1], f.svc.node_ca_der());
    let id = crate::pki::node_cert_identity(&resp.chain[0]).unwrap();
    assert_eq!(id.node_id, node_id);
    // The CSR's name and SAN are ignored: no AK statement for a leaf
    // without one, only the scope statement.
    assert_eq!(id.statements, ["urn:bc:scope:node"]);
    assert_eq!(id.spki_der, next.subject_public_key_info());
    let (_, cert) = x509_parser::parse_x509_certificate(&resp.chain[0]).unwrap();
    let (_, ca) = x509_parser::parse_x509_certificate(f.svc.node_ca_der()).unwrap();
    cert.verify_signature(Some(ca.public_key())).unwrap();
    let now_s = f.now() / 1000;
    let not_after = cert.validity().not_after.timestamp();
    assert!(not_after <= now_s + 24 * 3600 && not_after > now_s + 23 * 3600);

    let certs = records::list_certs(f.db(), &node_id).unwrap();
    assert_eq!(certs.len(), 2);
    assert!(certs
        .iter()
        .all(|c| c.identity_generation == 1 && c.revoked_at.is_none()));
    let ev = f.renewals();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].node_id.as_deref(), Some(node_id.as_str()));
    assert_eq!(ev[0].data["nodeKey"], "unattested");
    assert_eq!(ev[0].data["serial"], certs[1].serial);
    assert_eq!(ev[0].data["notAfter"], store::rfc3339(certs[1].not_after));
    assert_eq!(ev[0].data["identityGeneration"], 1);

    // The older certificate of the generation still renews (a node that
    // crashed before swapping), and so does the new one.
    f.renew(&leaf, &request(plain_csr(&key()))).unwrap();
    f.renew(&resp.chain[0], &request(plain_csr(&key())))
        .unwrap();
    assert_eq!(f.renewals().len(), 3);
    assert!(f.renew_refusals().is_empty());
    // A reclaim is not a renewal: the identity generation never moved.
    assert_eq!(
        records::list_nodes(f.db()).unwrap()[0].identity_generation,
        1
    );
}

#[test]
fn refusals_name_their_reason() {
    let f = fixture();
    crate::model::tenants::create(f.db(), "alice").unwrap();
    crate::model::pools::create_pool(f.db(), "metal", "alice", None, &[]).unwrap();
    let (node_id, leaf) = f.join(Some("metal"));
    let good = || request(plain_csr(&key()));

    // No client certificate: no node to name.
    assert_eq!(
        f.refused(|| RenewService::new(&f.svc).renew(None, &good())),
        RenewReason::NoClientCertificate
    );
    assert_eq!(
        f.refused(|| RenewService::new(&f.svc).renew_bytes(None, b"not even protobuf")),
        RenewReason::NoClientCertificate
    );
    let ev = f.renew_refusals();
    assert_eq!(ev[0].node_id, None);
    assert_eq!(ev[0].data["owner"], serde_json::Value::Null);
    // Unauthenticated, so counted by the refusal log: the second is a repeat.
    assert_eq!(ev[0].data["count"], 1);
    assert_eq!(ev[1].data["count"], 1);
    // Not a node certificate.
    assert_eq!(
        f.refused(|| f.renew(f.svc.node_ca_der(), &good())),
        RenewReason::CertificateIdentity
    );
    assert_eq!(
        f.refused(|| f.renew(b"junk", &good())),
        RenewReason::CertificateIdentity
    );

    // Signed by our CA, but never issued (stored) by the control plane.
    let forged = f.issue(&node_id, &key(), &[], 1, false);
    assert_eq!(
        f.refused(|| f.renew(&forged, &good())),
        RenewReason::UnknownCertificate
    );
    let ev = f.renew_refusals();
    let last = ev.last().unwrap();
    assert_eq!(last.node_id.as_deref(), Some(node_id.as_str()));
    assert_eq!(last.data, serde_json::json!({ "owner": "alice" }));
    assert_eq!(last.attestor, None);

    // The CSR: a bad signature, a key that is not P-256, garbage.
    let mut bad = plain_csr(&key());
    let n = bad.len();
    bad[n - 1] ^= 1;
    assert_eq!(
        f.refused(|| f.renew(&leaf, &request(bad))),
        RenewReason::CsrSignature
    );
    let p384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    assert_eq!(
        f.refused(|| f.renew(&leaf, &request(plain_csr(&p384)))),
        RenewReason::CsrKey
    );
    let before = f.renew_refusals().len();
    assert!(matches!(
        f.renew(&leaf, &request(b"garbage".to_vec())),
        Err(ApiError::InvalidInput(_))
    ));
    assert!(matches!(
        RenewService::new(&f.svc).renew_bytes(Some(&leaf), b"\xff\xff"),
        Err(ApiError::InvalidInput(_))
    ));
    assert_eq!(
        f.renew_refusals().len(),
        before,
        "a broken request is no refusal"
    );

    // Expired at database time (renewal refuses expired certificates).
    f.move_clock(25 * 3_600_000);
    assert_eq!(f.refused(|| f.renew(&leaf, &good())), RenewReason::Expired);
    f.move_clock(0);

    // Revoked, same generation.
    f.db()
        .write(|tx| tx.execute("UPDATE node_certs SET revoked_at = 1", params![]))
        .unwrap();
    assert_eq!(f.refused(|| f.renew(&leaf, &good())), RenewReason::Revoked);
    f.db()
        .write(|tx| tx.execute("UPDATE node_certs SET revoked_at = NULL", params![]))
        .unwrap();
    f.renew(&leaf, &good()).unwrap();

    // nodes revoke-identity: a new generation, nothing from before renews.
    crate::model::nodes::revoke_identity(f.db(), &node_id).unwrap();
    assert_eq!(
        f.refused(|| f.renew(&leaf, &good())),
        RenewReason::StaleGeneration
    );
    // A certificate of the new generation would renew; retired, it does not.
    let current = f.issue(&node_id, &key(), &[], 2, true);
    f.renew(&current, &good()).unwrap();
    crate::model::nodes::retire(f.db(), &node_id).unwrap();
    assert_eq!(
        f.refused(|| f.renew(&current, &good())),
        RenewReason::Retired
    );

    // Deleted.
    let (other, other_leaf) = f.join(None);
    crate::model::nodes::cordon(f.db(), &other).unwrap();
    // Cordoned nodes still renew.
    f.renew(&other_leaf, &good()).unwrap();
    crate::model::nodes::delete(f.db(), &other).unwrap();
    assert_eq!(
        f.refused(|| f.renew(&other_leaf, &good())),
        RenewReason::Deleted
    );

    // Nothing refused was issued.
    assert_eq!(f.renewals().len(), 3);
}

#[test]
fn a_tpm_node_renews_only_with_its_ak() {
    let f = fixture();
    let statement = statement_of(&ak_public());
    let (node_id, leaf) = f.tpm_node(&statement);
    let real = || attestation(ak_public(), node_key_certification());

    let resp = f.renew(&leaf, &tpm_request(Some(real()))).unwrap();
    let id = crate::pki::node_cert_identity(&resp.chain[0]).unwrap();
    assert_eq!(id.node_id, node_id);
    // Carried forward, though the CSR asked for no SAN at all; the scope
    // statement written from the node's row.
    assert_eq!(
        id.statements,
        [statement.clone(), "urn:bc:scope:node".to_owned()]
    );
    let key_public = Public::parse(&node_key_certification().public).unwrap();
    assert_eq!(id.spki_der, key_public.p256_spki_der().unwrap());
    assert_eq!(f.renewals()[0].data["nodeKey"], "tpm");
    // The new certificate renews the same way again (the next renewal needs
    // the AK again).
    let again = f.renew(&resp.chain[0], &tpm_request(Some(real()))).unwrap();
    assert_eq!(
        crate::pki::node_cert_identity(&again.chain[0])
            .unwrap()
            .statements,
        [statement.clone(), "urn:bc:scope:node".to_owned()]
    );

    // No attestation: no downgrade to an unattested renewal.
    assert_eq!(
        f.refused(|| f.renew(&leaf, &tpm_request(None))),
        RenewReason::KeyAttestationMissing
    );
    // Nor with a file key and a CSR that asks for nothing.
    assert_eq!(
        f.refused(|| f.renew(&leaf, &request(plain_csr(&key())))),
        RenewReason::KeyAttestationMissing
    );
    // Another AK (here: the node key's public area posing as one).
    let mut other_ak = real();
    other_ak.ak_public = node_key_certification().public;
    assert_eq!(
        f.refused(|| f.renew(&leaf, &tpm_request(Some(other_ak)))),
        RenewReason::AkMismatch
    );
    let mut garbage_ak = real();
    garbage_ak.ak_public = b"not a TPMT_PUBLIC".to_vec();
    assert_eq!(
        f.refused(|| f.renew(&leaf, &tpm_request(Some(garbage_ak)))),
        RenewReason::AkMismatch
    );
    // Certifying a key that is not the CSR's.
    assert_eq!(
        f.refused(|| f.renew(
            &leaf,
            &tpm_request(Some(attestation(
                ak_public(),
                TpmKeyCertification::decode(KEY2_CERT).unwrap()
            )))
        )),
        "node-key-not-csr"
    );
    // Qualified by another CSR.
    assert_eq!(
        f.refused(|| f.renew(
            &leaf,
            &tpm_request(Some(attestation(
                ak_public(),
                TpmKeyCertification::decode(OTHER_NONCE_CERT).unwrap()
            )))
        )),
        "node-key-nonce"
    );
    // The AK certifying itself: a restricted key is not a node key.
    assert_eq!(
        f.refused(|| f.renew(
            &leaf,
            &tpm_request(Some(attestation(
                ak_public(),
                TpmKeyCertification::decode(AK_SELF_CERT).unwrap()
            )))
        )),
        "node-key-attributes"
    );
    // A signature that does not verify.
    let mut bad_sig = real();
    let n = bad_sig.signature.len();
    bad_sig.signature[n - 1] ^= 1;
    assert_eq!(
        f.refused(|| f.renew(&leaf, &tpm_request(Some(bad_sig)))),
        "node-key-signature"
    );
    // A certification of another key (the certified name is not key_public's).
    let mut renamed = real();
    renamed.key_public = TpmKeyCertification::decode(KEY2_CERT).unwrap().public;
    assert_eq!(
        f.refused(|| f.renew(&leaf, &tpm_request(Some(renamed)))),
        "node-key-name"
    );
    let mut truncated = real();
    truncated.certify_info.truncate(10);
    assert_eq!(
        f.refused(|| f.renew(&leaf, &tpm_request(Some(truncated)))),
        "node-key-malformed"
    );
    let refusals = f.renew_refusals();
    assert!(refusals
        .iter()
        .all(|e| e.node_id.as_deref() == Some(node_id.as_str())));
    assert!(refusals
        .iter()
        .all(|e| e.data == serde_json::json!({ "owner": "root" })));
    assert_eq!(f.renewals().len(), 2);
}

#[test]
fn an_ak_without_attestation_key_attributes_is_refused() {
    let f = fixture();
    // A certificate naming a key that is not an attestation key (the node
    // key): even a perfect certification by it is refused.
    let node_key_public = node_key_certification().public;
    let (_, leaf) = f.tpm_node(&statement_of(&node_key_public));
    let att = attestation(node_key_public, node_key_certification());
    assert_eq!(
        f.refused(|| f.renew(&leaf, &tpm_request(Some(att)))),
        RenewReason::AkAttributes
    );
}

#[test]
fn a_file_key_node_gains_no_statement_from_a_key_attestation() {
    let f = fixture();
    let (_, leaf) = f.join(None);
    // A real certification, but no EK ever vouched for this AK.
    let resp = f
        .renew(
            &leaf,
            &tpm_request(Some(attestation(ak_public(), node_key_certification()))),
        )
        .unwrap();
    let id = crate::pki::node_cert_identity(&resp.chain[0]).unwrap();
    assert_eq!(id.statements, ["urn:bc:scope:node"]);
    assert_eq!(f.renewals()[0].data["nodeKey"], "unattested");
}

#[test]
fn a_renewal_needs_a_well_formed_statement() {
    let f = fixture();
    // Two AK statements: never issued by JoinService; refused rather than
    // guessed at.
    let s = statement_of(&ak_public());
    let (node_id, _) = f.tpm_node(&s);
    let leaf = f.issue(&node_id, &key(), &[s.clone(), s], 1, true);
    let att = attestation(ak_public(), node_key_certification());
    assert_eq!(
        f.refused(|| f.renew(&leaf, &tpm_request(Some(att)))),
        RenewReason::StatementMalformed
    );
}
