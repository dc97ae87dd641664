//! Runs the two-round tpm join against a real TPM through the control
//! plane's own JoinService, and writes what the TPM produced as fixtures
//! (controlplane/src/attestors/tpm/testdata, whose README says how).
//!
//!   cargo run --example tpm-capture -- TCTI OUT_DIR
//!
//! The TPM must be manufactured with tpmsim-fixtures/manufacture (its EK
//! certificate issued by the test maker's intermediate). An example of
//! bcd's package: the agent's TPM layer is its library's, the control plane
//! its dev-dependency.

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;

use bc_controlplane::attestors::tpm::ek;
use bc_controlplane::enroll;
use bc_controlplane::{ControlPlane, JoinService};
use bc_wire::agent::{
    join_response_body::Deferral, tpm_attestation, JoinRequest, JoinResponseBody, Role, TpmAnswer,
    TpmAttestation, TpmChallenge, TpmHello, TpmKeyCertification,
};
use bc_wire::pcr::PcrBank;
use bcd::tpm;
use prost::Message;

/// PCRs 0-23 of the SHA-256 bank, as the fixtures' quotes hold.
const PCRS: [u32; 24] = [
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23,
];

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tpmsim-fixtures");

struct TpmSigner<'a> {
    tpm: &'a RefCell<tpm::Tpm>,
    key: &'a tpm::LoadedKey,
    sec1: Vec<u8>,
}

impl rcgen::PublicKeyData for TpmSigner<'_> {
    fn der_bytes(&self) -> &[u8] {
        &self.sec1
    }
    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

impl rcgen::SigningKey for TpmSigner<'_> {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        let rs = self
            .tpm
            .borrow_mut()
            .sign_digest(self.key, &bc_wire::sha256(msg))
            .map_err(|_| rcgen::Error::RemoteKeyError)?;
        let sig =
            p256::ecdsa::Signature::from_slice(&rs).map_err(|_| rcgen::Error::RemoteKeyError)?;
        Ok(sig.to_der().as_bytes().to_vec())
    }
}

fn cert_msg(key_public: &[u8], (info, sig): (Vec<u8>, Vec<u8>)) -> TpmKeyCertification {
    TpmKeyCertification {
        public: key_public.to_vec(),
        certify_info: info,
        signature: sig,
    }
}

fn join(svc: &ControlPlane, csr: &[u8], att: &TpmAttestation) -> JoinResponseBody {
    let req = JoinRequest {
        csr: csr.to_vec(),
        role: Role::Node as i32,
        attestor: "tpm".into(),
        attestation: att.encode_to_vec(),
        ..Default::default()
    };
    let resp = JoinService::new(svc).join(req).expect("join");
    JoinResponseBody::decode(resp.body.as_slice()).expect("body")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (tcti, out) = (&args[1], Path::new(&args[2]));
    std::fs::create_dir_all(out).unwrap();
    let cp = std::env::temp_dir().join(format!("tpm-capture-{}", std::process::id()));
    bc_controlplane::pki::init(&cp, "bc.test").unwrap();
    let svc = Arc::new(ControlPlane::open(&cp).unwrap());
    let mut roots = Vec::new();
    for f in ["ek-root.pem", "ek-intermediate.pem"] {
        roots.extend(
            ek::parse_roots_pem(&std::fs::read(Path::new(FIXTURES).join(f)).unwrap()).unwrap(),
        );
    }
    ek::add_roots(svc.database(), &roots, ek::RootKind::Anchor).unwrap();

    let t = RefCell::new(tpm::Tpm::open(tcti).unwrap());
    let ekey = t.borrow_mut().ek().unwrap();
    let ak = t.borrow_mut().ak().unwrap();
    let key1 = t.borrow_mut().node_key(&[7u8; 32]).unwrap();
    let kp = bc_wire::tpm::Public::parse(&key1.public).unwrap();
    let sec1 = kp
        .p256_key()
        .unwrap()
        .to_sec1_point(false)
        .as_bytes()
        .to_vec();
    let signer = TpmSigner {
        tpm: &t,
        key: &key1,
        sec1,
    };
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "bcd");
    let csr = params.serialize_request(&signer).unwrap().der().to_vec();
    let csr_sha256 = bc_wire::sha256(&csr);

    let hello = TpmAttestation {
        round: Some(tpm_attestation::Round::Hello(TpmHello {
            ek_public: ekey.public.clone(),
            ek_certificate: ekey.certificate.clone().expect("an EK certificate"),
            ak_public: ak.public.clone(),
            ..Default::default()
        })),
    };
    let captured_at = svc.database().read(|tx| tx.now()).unwrap();
    let body = join(&svc, &csr, &hello);
    let Some(Deferral::Challenge(ch)) = body.deferral else {
        panic!("no challenge: {body:?}")
    };
    let ch = TpmChallenge::decode(ch.payload.as_slice()).unwrap();
    let secret = t
        .borrow_mut()
        .activate_credential(&ak, &ekey, &ch.id_object, &ch.encrypted_secret)
        .unwrap();
    let mut nonce = secret.clone();
    nonce.extend_from_slice(&csr_sha256);
    let quote = t
        .borrow_mut()
        .quote(&ak, &bc_wire::sha256(&nonce), &PCRS, PcrBank::Sha256)
        .unwrap();
    let certified = t.borrow_mut().certify(&key1, &ak, &csr_sha256).unwrap();
    let answer_msg = TpmAnswer {
        state: ch.state.clone(),
        secret: secret.clone(),
        quote: quote.attest.clone(),
        quote_signature: quote.signature.clone(),
        pcr_values: quote.pcr_values.clone(),
        node_key: Some(cert_msg(&key1.public, certified)),
        event_log: Vec::new(),
    };
    let answer = TpmAttestation {
        round: Some(tpm_attestation::Round::Answer(answer_msg)),
    };

    // The other certifications and quotes the refusal tests alter.
    let key2 = t.borrow_mut().node_key(&[8u8; 32]).unwrap();
    let key2_cert = cert_msg(
        &key2.public,
        t.borrow_mut().certify(&key2, &ak, &csr_sha256).unwrap(),
    );
    let ak_self = cert_msg(
        &ak.public,
        t.borrow_mut().certify(&ak, &ak, &csr_sha256).unwrap(),
    );
    let other = bc_wire::sha256(b"another CSR");
    let other_nonce_cert = cert_msg(
        &key1.public,
        t.borrow_mut().certify(&key1, &ak, &other).unwrap(),
    );
    let q2 = t
        .borrow_mut()
        .quote(&ak, &other, &PCRS, PcrBank::Sha256)
        .unwrap();
    let other_nonce_quote = TpmAnswer {
        quote: q2.attest,
        quote_signature: q2.signature,
        pcr_values: q2.pcr_values,
        ..Default::default()
    };

    // The join itself goes through: pending, approved, joined.
    let body = join(&svc, &csr, &answer);
    let Some(Deferral::Pending(p)) = body.deferral else {
        panic!("not pending: {body:?}")
    };
    println!(
        "pending {} retry after {}s",
        p.request_id, p.retry_after_seconds
    );
    enroll::approve(svc.database(), &p.request_id, None, None).unwrap();
    let body = join(&svc, &csr, &answer);
    assert!(body.deferral.is_none(), "{body:?}");
    println!("joined as {}", body.node_id);

    let w = |name: &str, data: &[u8]| std::fs::write(out.join(name), data).unwrap();
    w("hello.bin", &hello.encode_to_vec());
    w("answer.bin", &answer.encode_to_vec());
    w("csr.der", &csr);
    w(
        "challenge.key",
        &std::fs::read(cp.join("challenge.key")).unwrap(),
    );
    w("captured-at.txt", format!("{captured_at}\n").as_bytes());
    w("ek-cert.der", ekey.certificate.as_deref().unwrap());
    w("ek-public.bin", &ekey.public);
    w("key2-certification.bin", &key2_cert.encode_to_vec());
    w("ak-self-certification.bin", &ak_self.encode_to_vec());
    w(
        "other-nonce-certification.bin",
        &other_nonce_cert.encode_to_vec(),
    );
    w("other-nonce-quote.bin", &other_nonce_quote.encode_to_vec());
    for k in [key2, key1, ak] {
        t.borrow_mut().flush(k).unwrap();
    }
    let _ = std::fs::remove_dir_all(&cp);
    println!("wrote fixtures to {}", out.display());
}
