//! bcd accepts a renewal answer only if it certifies its next key under its
//! own node id, in its trust domain, signed by the CA of its current chain,
//! carrying its AK statement forward, and is not expired yet. A proxy in
//! front of the real control plane forwards bcd's Renew (with the node's
//! own identity, so the control plane really renews) and bends the answer
//! on the way back, one thing at a time, with the real node CA: only bcd's
//! own checks can catch it. bcd refuses the answer, says why, and keeps the
//! certificate and key it has.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::IntoResponse;
use bc_controlplane::http;
use bc_controlplane::pki::{Bundle, NodeCertSpec};
use bc_controlplane::ApiError;
use bc_wire::agent::{RenewRequest, RenewResponse};
use bcd::client::{Client, ClientError};
use bcd::identity::Identity;
use bcd::keys::TpmAccess;
use p256::pkcs8::EncodePublicKey;
use prost::Message;

use crate::harness::*;

/// A node id of the right form, of no node here.
const OTHER_NODE: &str = "node_someoneelseaaaaaaaaaaaaaa";

#[derive(Clone, Copy)]
enum Bend {
    /// The renewed certificate, reissued for another key.
    OtherKey,
    /// Reissued for another node id.
    OtherNode,
    /// Reissued in another trust domain.
    OtherTrustDomain,
    /// Reissued to have expired an hour ago.
    Expired,
    /// No chain at all.
    Empty,
    /// Reissued as it was, but by a CA of the proxy's own (the chain's CA
    /// replaced by it).
    OtherCa,
    /// Not forwarded (a TPM node's key is in its TPM, which the proxy cannot
    /// share): answered with a certificate of the real node CA for the
    /// CSR's key and the node, without the AK statement.
    StatementDropped,
}

/// A TLS-terminating HTTPS server in this process with the control plane's
/// own server certificate, forwarding Renew to `cp` as `agent`'s node.
struct RenewProxy {
    url: String,
    _server: InProcessServer,
}

impl RenewProxy {
    fn start(cp: &ControlPlane, agent: &Agent, bend: Bend) -> Self {
        agent.set_api(&cp.url);
        let config = bcd::config::Config::load(&agent.config).expect("agent config");
        let upstream = match bend {
            Bend::StatementDropped => None,
            _ => {
                let id = Identity::load(&agent.data_dir, &TpmAccess::none())
                    .expect("identity")
                    .expect("joined");
                let client = Client::with_identity(&config, &id.chain, id.key.clone());
                Some(Arc::new(client.expect("client")))
            }
        };
        let current = current_leaf(agent);
        let bundle = Arc::new(Bundle::load(cp.path()).expect("bundle"));
        let (chain, key) = bundle.tls_server_identity();
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("the server certificate");
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let handler = move |body: Bytes| {
            let (upstream, bundle, current) = (upstream.clone(), bundle.clone(), current.clone());
            async move {
                let Ok(req) = RenewRequest::decode(body.as_ref()) else {
                    return http::error_response(&ApiError::InvalidInput(
                        "not a RenewRequest".into(),
                    ));
                };
                let Some(upstream) = upstream else {
                    let chain = without_statements(&bundle, &current, &req.csr);
                    return (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            bc_wire::endpoints::CONTENT_TYPE,
                        )],
                        RenewResponse { chain, boot: None }.encode_to_vec(),
                    )
                        .into_response();
                };
                let chain = match upstream.renew(&req).await {
                    Ok(bcd::client::renew::RenewAnswer::Chain(chain)) => chain,
                    // These nodes' pools have no boot policy.
                    Ok(bcd::client::renew::RenewAnswer::Boot(_)) => {
                        return http::error_response(&ApiError::Unavailable(
                            "a boot challenge: not expected here".into(),
                        ))
                    }
                    Err(ClientError::AccessDenied) => {
                        return http::error_response(&ApiError::AccessDenied)
                    }
                    Err(e) => return http::error_response(&ApiError::Unavailable(e.to_string())),
                };
                let chain = bent(&bundle, bend, chain);
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        bc_wire::endpoints::CONTENT_TYPE,
                    )],
                    RenewResponse { chain, boot: None }.encode_to_vec(),
                )
                    .into_response()
            }
        };
        let router =
            axum::Router::new().route(bc_wire::endpoints::RENEW, axum::routing::post(handler));
        let server = InProcessServer::start(Arc::new(tls), router);
        agent.set_api(&server.url);
        RenewProxy {
            url: server.url.clone(),
            _server: server,
        }
    }
}

/// The control plane's `chain` with its leaf reissued as `bend` says.
fn bent(bundle: &Bundle, bend: Bend, mut chain: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let real = bc_controlplane::pki::node_cert_identity(&chain[0]).expect("a node certificate");
    let other = <p256::ecdsa::SigningKey as p256::elliptic_curve::Generate>::try_generate()
        .unwrap()
        .verifying_key()
        .to_public_key_der()
        .unwrap()
        .as_bytes()
        .to_vec();
    let now = time::OffsetDateTime::now_utc();
    let (spki, trust_domain, node_id, not_before, not_after) = match bend {
        Bend::Empty | Bend::StatementDropped => return Vec::new(),
        Bend::OtherCa => return foreign_ca_chain(&chain[0]),
        Bend::OtherKey => (
            other,
            real.trust_domain.as_str(),
            real.node_id.as_str(),
            now,
            now + time::Duration::hours(1),
        ),
        Bend::OtherNode => (
            real.spki_der,
            real.trust_domain.as_str(),
            OTHER_NODE,
            now,
            now + time::Duration::hours(1),
        ),
        Bend::OtherTrustDomain => (
            real.spki_der,
            "evil.test",
            real.node_id.as_str(),
            now,
            now + time::Duration::hours(1),
        ),
        Bend::Expired => (
            real.spki_der,
            real.trust_domain.as_str(),
            real.node_id.as_str(),
            now - time::Duration::hours(2),
            now - time::Duration::hours(1),
        ),
    };
    chain[0] = bundle
        .node_ca
        .issue(&NodeCertSpec {
            spki_der: &spki,
            trust_domain,
            node_id,
            statements: &real.statements,
            not_before,
            not_after,
        })
        .expect("issue")
        .der;
    chain
}

/// The node certificate `agent` holds now (DER), from its identity.json.
fn current_leaf(agent: &Agent) -> Vec<u8> {
    let id: serde_json::Value =
        serde_json::from_slice(&std::fs::read(agent.data_dir.join("identity.json")).unwrap())
            .unwrap();
    ::pem::parse(id["chain"][0].as_str().unwrap())
        .unwrap()
        .into_contents()
}

/// A chain of the real node CA certifying `csr`'s key as the node of
/// `current`, for an hour, with no statement.
fn without_statements(bundle: &Bundle, current: &[u8], csr: &[u8]) -> Vec<Vec<u8>> {
    use x509_parser::prelude::FromDer as _;
    let node = bc_controlplane::pki::node_cert_identity(current).unwrap();
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(csr).unwrap();
    let now = time::OffsetDateTime::now_utc();
    let leaf = bundle
        .node_ca
        .issue(&NodeCertSpec {
            spki_der: csr.certification_request_info.subject_pki.raw,
            trust_domain: &node.trust_domain,
            node_id: &node.node_id,
            statements: &[],
            not_before: now,
            not_after: now + time::Duration::hours(1),
        })
        .unwrap();
    vec![leaf.der, bundle.node_ca.cert_der().to_vec()]
}

/// `leaf`'s identity and key, signed by a new CA of its own: [leaf, that CA].
fn foreign_ca_chain(leaf: &[u8]) -> Vec<Vec<u8>> {
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let real = bc_controlplane::pki::node_cert_identity(leaf).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let uris = std::iter::once(format!(
        "spiffe://{}/node/{}",
        real.trust_domain, real.node_id
    ))
    .chain(real.statements.iter().cloned());
    params.subject_alt_names = uris
        .map(|u| rcgen::SanType::URI(u.try_into().unwrap()))
        .collect();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);
    params.not_after = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    let spki = rcgen::SubjectPublicKeyInfo::from_der(&real.spki_der).unwrap();
    let forged = params.signed_by(&spki, &issuer).unwrap();
    vec![forged.der().to_vec(), ca_cert.der().to_vec()]
}

/// `bcd node --once --renew-now` through a proxy bending the answer as
/// `bend` says: bcd ends with exit code 1, its identity as it was, and no
/// next key left staged; its stderr, which says why.
fn renew_against(bend: Bend) -> String {
    let cp = ControlPlane::start();
    let agent = Agent::new(&cp);
    assert_ok(&agent.join_with_token(&cp.token("node", &[])));
    let files =
        || ["identity.json", "node.key"].map(|f| std::fs::read(agent.data_dir.join(f)).unwrap());
    let before = files();
    let proxy = RenewProxy::start(&cp, &agent, bend);
    let out = agent.run(&["node", "--once", "--renew-now"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\n{}",
        proxy.url,
        stderr(&out)
    );
    assert!(files() == before, "bcd keeps its certificate and key");
    assert!(
        !agent.data_dir.join("node.key.next").exists(),
        "the next key is abandoned"
    );
    // The control plane did renew: only bcd's own check refused the answer.
    let renewed = cp
        .events()
        .into_iter()
        .filter(|e| e["type"] == "node.renewed")
        .count();
    assert_eq!(renewed, 1);
    stderr(&out)
}

#[test]
fn a_renewed_certificate_for_another_key_is_refused() {
    let err = renew_against(Bend::OtherKey);
    assert!(err.contains("certifies another key"), "{err}");
}

#[test]
fn a_renewed_certificate_for_another_node_is_refused() {
    let err = renew_against(Bend::OtherNode);
    assert!(
        err.contains("names spiffe://") && err.contains(OTHER_NODE),
        "{err}"
    );
}

#[test]
fn a_renewed_certificate_of_another_trust_domain_is_refused() {
    let err = renew_against(Bend::OtherTrustDomain);
    assert!(err.contains("evil.test"), "{err}");
}

#[test]
fn an_expired_renewed_certificate_is_refused() {
    let err = renew_against(Bend::Expired);
    assert!(err.contains("the renewed certificate expired at"), "{err}");
}

#[test]
fn a_renewal_answer_without_a_chain_is_refused() {
    let err = renew_against(Bend::Empty);
    assert!(err.contains("carries no certificate chain"), "{err}");
}

#[test]
fn a_renewed_certificate_signed_by_another_ca_is_refused() {
    let err = renew_against(Bend::OtherCa);
    assert!(
        err.contains("not signed by the node CA that signed the current one"),
        "{err}"
    );
}

/// A TPM node's renewal answered without the AK statement its certificate
/// carries: bcd refuses it (its certificate would no longer say that the
/// key is its TPM's) and keeps its identity.
#[test]
fn a_renewed_certificate_that_drops_the_ak_statement_is_refused() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    let before = std::fs::read(agent.data_dir.join("identity.json")).unwrap();
    let files = agent.files();
    let _proxy = RenewProxy::start(&cp, &agent, Bend::StatementDropped);
    let out = agent.run(&["node", "--once", "--renew-now"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the renewed certificate drops the statement urn:bc:tpm-ak:"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(agent.data_dir.join("identity.json")).unwrap(),
        before
    );
    assert_eq!(agent.files(), files, "no next key left behind");
}
