//! A captured join cannot be replayed: a real `bcd join --attestor tpm`
//! against swtpm goes through a recording proxy (TLS-terminating, with the
//! control plane's own server certificate, forwarding each Join to the real
//! control plane), and the exact round-2 bytes bcd sent are sent again.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use bc_controlplane::http;
use bc_controlplane::join::ApiError;
use bc_controlplane::pki::Bundle;
use bc_wire::agent::{tpm_attestation, JoinRequest, TpmAttestation};
use bcd::client::{Client, ClientError};
use prost::Message;

use crate::harness::*;

/// An HTTPS server in this process that records every Join body and
/// forwards it, unchanged, to the control plane.
struct RecordingProxy {
    url: String,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
    _server: InProcessServer,
}

impl RecordingProxy {
    /// Forwards with `agent`'s config as it is now (pointing at `cp`).
    fn start(cp: &ControlPlane, agent: &Agent) -> Self {
        let config = bcd::config::Config::load(&agent.config).expect("agent config");
        let upstream = Arc::new(Client::new(&config).expect("client"));
        let bundle = Bundle::load(cp.path()).expect("bundle");
        let (chain, key) = bundle.tls_server_identity();
        let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let handler = move |body: Bytes| {
            recorded.lock().unwrap().push(body.to_vec());
            let upstream = upstream.clone();
            async move { forward(&upstream, &body).await }
        };
        let router =
            axum::Router::new().route(bc_wire::endpoints::JOIN, axum::routing::post(handler));
        let server = InProcessServer::start(Arc::new(tls), router);
        RecordingProxy {
            url: server.url.clone(),
            seen,
            _server: server,
        }
    }

    /// The recorded bodies whose attestation is a TPM round-2 answer.
    fn answers(&self) -> Vec<Vec<u8>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|body| {
                let req = JoinRequest::decode(body.as_slice()).expect("a JoinRequest");
                matches!(
                    TpmAttestation::decode(req.attestation.as_slice()).map(|a| a.round),
                    Ok(Some(tpm_attestation::Round::Answer(_)))
                )
            })
            .cloned()
            .collect()
    }
}

async fn forward(upstream: &Client, body: &[u8]) -> Response {
    let Ok(req) = JoinRequest::decode(body) else {
        return http::error_response(&ApiError::InvalidInput("not a JoinRequest".into()));
    };
    match upstream.join(&req).await {
        Ok(resp) => (
            [(
                axum::http::header::CONTENT_TYPE,
                bc_wire::endpoints::CONTENT_TYPE,
            )],
            resp.encode_to_vec(),
        )
            .into_response(),
        Err(ClientError::AccessDenied) => http::error_response(&ApiError::AccessDenied),
        Err(e) => http::error_response(&ApiError::Unavailable(e.to_string())),
    }
}

#[test]
fn a_replayed_tpm_answer_is_refused_and_the_node_keeps_renewing() {
    let cp = ControlPlane::start_trusting_test_maker();
    let tpm = Swtpm::start();
    let agent = Agent::with_tpm(&cp, &tpm);
    agent.allow_ek(&cp);
    let proxy = RecordingProxy::start(&cp, &agent);
    agent.set_api(&proxy.url);
    assert_ok(&agent.run(&["join", "--attestor", "tpm"]));
    agent.set_api(&cp.url);
    let node_id = agent.status_json()["nodeId"]
        .as_str()
        .expect("nodeId")
        .to_owned();
    let answers = proxy.answers();
    assert_eq!(answers.len(), 1, "bcd sent one round-2 answer");
    drop(proxy);

    // The exact bytes again, while the challenge is still open.
    let captured = &answers[0];
    let request = JoinRequest::decode(captured.as_slice()).unwrap();
    assert_eq!(
        &request.encode_to_vec(),
        captured,
        "the replay sends bcd's bytes"
    );
    let config = bcd::config::Config::load(&agent.config).unwrap();
    let client = Client::new(&config).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for _ in 0..2 {
        match rt.block_on(client.join(&request)) {
            Err(ClientError::AccessDenied) => {}
            other => panic!("expected ACCESS_DENIED, got {:?}", other.map(|_| ())),
        }
    }

    let refusals = cp.refusals();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    for r in &refusals {
        assert_eq!(
            (r["attestor"].as_str(), r["reason"].as_str()),
            (Some("tpm"), Some("challenge-reused"))
        );
    }
    let log = cp.log();
    assert!(
        log.lines()
            .any(|l| l.contains("join refused") && l.contains("challenge-reused")),
        "{log}"
    );
    let joined = cp
        .events()
        .into_iter()
        .filter(|e| e["type"] == "node.joined")
        .count();
    assert_eq!(joined, 1);
    let row = cp
        .nodes()
        .into_iter()
        .find(|n| n["nodeId"] == node_id.as_str())
        .expect("node listed");
    assert_eq!(row["identityGeneration"], 1);

    // The real node is untouched: it renews.
    assert_ok(&agent.run(&["node", "--once", "--renew-now"]));
    assert_eq!(agent.status_json()["nodeId"], node_id.as_str());
}
