//! bcd accepts a join answer only if it is signed by the pinned key, bound to
//! its own CSR, final, and certifies its own key under one SPIFFE ID of its
//! trust domain. A purpose-built server that holds the real JoinService keys
//! (so only bcd's own checks can catch it) bends one thing at a time.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use bc_controlplane::http;
use bc_controlplane::pki::NodeCertSpec;
use bc_controlplane::JoinService;
use bc_wire::agent::{
    join_response_body::Deferral, JoinChallenge, JoinRequest, JoinResponse, JoinResponseBody,
};
use p256::pkcs8::EncodePublicKey;
use prost::Message;

use crate::harness::*;

#[derive(Clone, Copy)]
enum Bend {
    /// A byte of the signature flipped.
    Signature,
    /// Signed, but bound to another CSR.
    OtherCsr,
    /// A valid node certificate, for another key.
    OtherKey,
    /// A valid certificate for this key, in another trust domain.
    OtherTrustDomain,
    /// A signed challenge: a deferral is never a final answer.
    Challenge,
    /// Not a protobuf at all.
    Garbage,
}

/// A misbehaving control plane over real HTTPS, in this process.
struct BentServer {
    url: String,
    _server: InProcessServer,
}

impl BentServer {
    fn start(cp: &ControlPlane, bend: Bend) -> Self {
        let svc = Arc::new(
            bc_controlplane::ControlPlane::open(cp.path()).expect("open the control plane"),
        );
        let tls = http::tls_config(svc.bundle(), svc.database()).expect("tls config");
        let handler = move |body: Bytes| {
            let svc = svc.clone();
            async move { answer(&JoinService::new(&svc), bend, &body) }
        };
        let router =
            axum::Router::new().route(bc_wire::endpoints::JOIN, axum::routing::post(handler));
        let server = InProcessServer::start(tls, router);
        BentServer {
            url: server.url.clone(),
            _server: server,
        }
    }
}

fn answer(svc: &JoinService, bend: Bend, body: &[u8]) -> Response {
    if let Bend::Garbage = bend {
        return (axum::http::StatusCode::OK, "garbage, not protobuf").into_response();
    }
    let req = JoinRequest::decode(body).expect("the agent sends a JoinRequest");
    let real = match svc.join(req.clone()) {
        Ok(r) => r,
        Err(e) => return http::error_response(&e),
    };
    let resp = match bend {
        Bend::Signature => {
            let mut r = real;
            r.signature[5] ^= 0x40;
            r
        }
        Bend::OtherCsr => {
            let mut b = JoinResponseBody::decode(real.body.as_slice()).unwrap();
            b.csr_sha256 = bc_wire::sha256(b"another CSR").to_vec();
            svc.sign_body(&b)
        }
        Bend::OtherKey | Bend::OtherTrustDomain => {
            let mut b = JoinResponseBody::decode(real.body.as_slice()).unwrap();
            let own_spki = csr_spki(&req.csr);
            let other = <p256::ecdsa::SigningKey as p256::elliptic_curve::Generate>::try_generate()
                .unwrap();
            let other_spki = other
                .verifying_key()
                .to_public_key_der()
                .unwrap()
                .as_bytes()
                .to_vec();
            let (spki, td) = match bend {
                Bend::OtherKey => (other_spki, "bc.test"),
                _ => (own_spki, "evil.test"),
            };
            let now = time::OffsetDateTime::now_utc();
            let leaf = svc
                .bundle()
                .node_ca
                .issue(&NodeCertSpec {
                    spki_der: &spki,
                    trust_domain: td,
                    node_id: &b.node_id,
                    statements: &[],
                    not_before: now,
                    not_after: now + time::Duration::hours(1),
                })
                .unwrap();
            b.chain[0] = leaf.der;
            svc.sign_body(&b)
        }
        Bend::Challenge => {
            let b = JoinResponseBody {
                csr_sha256: bc_wire::sha256(&req.csr).to_vec(),
                deferral: Some(Deferral::Challenge(JoinChallenge {
                    attestor: "join-token".into(),
                    payload: vec![1, 2, 3],
                    not_after_unix_ms: 0,
                })),
                ..Default::default()
            };
            svc.sign_body(&b)
        }
        Bend::Garbage => unreachable!(),
    };
    (
        [(
            axum::http::header::CONTENT_TYPE,
            bc_wire::endpoints::CONTENT_TYPE,
        )],
        JoinResponse::encode_to_vec(&resp),
    )
        .into_response()
}

fn csr_spki(csr: &[u8]) -> Vec<u8> {
    use x509_parser::prelude::*;
    let (_, csr) = X509CertificationRequest::from_der(csr).unwrap();
    csr.certification_request_info.subject_pki.raw.to_vec()
}

/// Runs `bcd join` against a server bent by `bend`; returns stderr.
fn join_against(bend: Bend) -> String {
    let cp = ControlPlane::init_only();
    let server = BentServer::start(&cp, bend);
    let token = cp.token("node", &[]);
    let config = cp
        .agent_config(std::path::Path::new("/unused"))
        .replace("https://unused", "");
    let agent = Agent::with_config("");
    let config = config
        .lines()
        .map(|l| {
            if l.starts_with("api = ") {
                format!("api = \"{}\"", server.url)
            } else if l.starts_with("data_dir = ") {
                format!("data_dir = \"{}\"", agent.data_dir.display())
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n[tpm]\ntcti = \"none\"\n";
    std::fs::write(&agent.config, config).unwrap();
    let out = agent.join_with_token(&token);
    assert_eq!(
        out.status.code(),
        Some(1),
        "bcd must refuse; stdout: {}",
        stdout(&out)
    );
    agent.assert_nothing_written();
    assert!(!agent.data_dir.join("node.key").exists());
    stderr(&out)
}

#[test]
fn an_answer_not_signed_by_the_pinned_key_is_refused() {
    let err = join_against(Bend::Signature);
    assert!(
        err.contains("not signed by the pinned join signing key"),
        "{err}"
    );
}

#[test]
fn an_answer_for_another_csr_is_refused() {
    let err = join_against(Bend::OtherCsr);
    assert!(err.contains("csr_sha256"), "{err}");
}

#[test]
fn a_certificate_for_another_key_is_refused() {
    let err = join_against(Bend::OtherKey);
    assert!(err.contains("certifies another key"), "{err}");
}

#[test]
fn a_certificate_of_another_trust_domain_is_refused() {
    let err = join_against(Bend::OtherTrustDomain);
    assert!(err.contains("trust domain"), "{err}");
}

#[test]
fn a_deferral_is_never_a_final_answer() {
    let err = join_against(Bend::Challenge);
    assert!(err.to_lowercase().contains("challenge"), "{err}");
}

#[test]
fn a_garbage_answer_is_a_clear_error() {
    let err = join_against(Bend::Garbage);
    assert!(err.contains("not a JoinResponse"), "{err}");
}
