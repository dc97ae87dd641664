//! A TLS-terminating proxy in front of one or more control planes, so that
//! a real `bcd` talks to one URL while each Join goes where the test says
//! (one replica, another, or several at once) and its bytes are kept.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use bc_controlplane::http;
use bc_controlplane::pki::Bundle;
use bc_controlplane::ApiError;
use bc_wire::agent::{tpm_attestation, JoinRequest, TpmAttestation};
use bcd::client::{Client, ClientError};
use prost::Message;

use crate::harness::*;

/// Where one Join went: (upstream, admitted or answered) per upstream.
pub(crate) type Routed = Vec<(usize, bool)>;

/// Where one Join went: (upstream, what it answered) per upstream.
pub(crate) type Outcomes = Vec<(usize, Answer)>;

/// What one upstream answered a forwarded Join.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Admitted, or answered with a deferral.
    Ok,
    /// ACCESS_DENIED: a refusal, whatever its reason.
    AccessDenied,
    /// Anything else (unavailable, internal, transport).
    Failed,
}

/// A TLS-terminating HTTPS server in this process (with the control plane's
/// own server certificate) that forwards each Join to the replica its policy
/// picks: bcd talks to one URL, the rounds go where the test says. It
/// records every Join body as bcd sent it, for tests that replay one.
pub(crate) struct RoutingProxy {
    pub url: String,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Per forwarded Join, in order: each upstream it went to and what
    /// that one answered.
    routed: Arc<Mutex<Vec<Outcomes>>>,
    _server: InProcessServer,
}

impl RoutingProxy {
    /// `agent`'s config pointed at each of `upstreams` in turn; `route` picks
    /// the upstreams of each JoinRequest: it goes to all of them at once, and
    /// bcd gets the first success (else the first answer).
    pub(crate) fn start(
        upstreams: &[&ControlPlane],
        agent: &Agent,
        route: fn(&JoinRequest) -> Vec<usize>,
    ) -> Self {
        RoutingProxy::start_with_hook(upstreams, agent, route, |_| {})
    }

    /// [`RoutingProxy::start`], calling `before` with each JoinRequest
    /// before it is forwarded: a test moves a clock between bcd's rounds
    /// there, rather than waiting.
    pub(crate) fn start_with_hook(
        upstreams: &[&ControlPlane],
        agent: &Agent,
        route: fn(&JoinRequest) -> Vec<usize>,
        before: impl Fn(&JoinRequest) + Send + Sync + 'static,
    ) -> Self {
        let before = Arc::new(before);
        let clients: Vec<Arc<Client>> = upstreams
            .iter()
            .map(|cp| {
                agent.set_api(&cp.url);
                let config = bcd::config::Config::load(&agent.config).expect("agent config");
                Arc::new(Client::new(&config).expect("client"))
            })
            .collect();
        let bundle = Bundle::load(upstreams[0].path()).expect("bundle");
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
        let routed = Arc::new(Mutex::new(Vec::new()));
        let log = routed.clone();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorded = seen.clone();
        let handler = move |body: Bytes| {
            let clients = clients.clone();
            let log = log.clone();
            recorded.lock().expect("body log").push(body.to_vec());
            if let Ok(req) = JoinRequest::decode(body.as_ref()) {
                before(&req);
            }
            async move {
                let Ok(req) = JoinRequest::decode(body.as_ref()) else {
                    return http::error_response(&ApiError::InvalidInput(
                        "not a JoinRequest".into(),
                    ));
                };
                let picked = route(&req);
                // Spawned together, awaited in order: concurrent requests.
                let sent: Vec<_> = picked
                    .iter()
                    .map(|&i| {
                        let (client, req) = (clients[i].clone(), req.clone());
                        tokio::spawn(async move { forward(&client, &req).await })
                    })
                    .collect();
                let mut answers = Vec::new();
                for answer in sent {
                    answers.push(answer.await.unwrap_or_else(|e| {
                        (
                            Answer::Failed,
                            http::error_response(&ApiError::Unavailable(e.to_string())),
                        )
                    }));
                }
                log.lock().expect("route log").push(
                    picked
                        .iter()
                        .copied()
                        .zip(answers.iter().map(|a| a.0))
                        .collect(),
                );
                let first_ok = answers.iter().position(|a| a.0 == Answer::Ok).unwrap_or(0);
                answers.into_iter().nth(first_ok).map_or_else(
                    || http::error_response(&ApiError::Unavailable("no upstream".into())),
                    |a| a.1,
                )
            }
        };
        let router =
            axum::Router::new().route(bc_wire::endpoints::JOIN, axum::routing::post(handler));
        let server = InProcessServer::start(Arc::new(tls), router);
        RoutingProxy {
            url: server.url.clone(),
            seen,
            routed,
            _server: server,
        }
    }

    /// Per forwarded Join: each upstream and whether it admitted or
    /// answered it (`false`: ACCESS_DENIED or a fault).
    pub(crate) fn routed(&self) -> Vec<Routed> {
        self.outcomes()
            .into_iter()
            .map(|join| {
                join.into_iter()
                    .map(|(i, a)| (i, a == Answer::Ok))
                    .collect()
            })
            .collect()
    }

    /// Per forwarded Join: each upstream and what it answered.
    pub(crate) fn outcomes(&self) -> Vec<Outcomes> {
        self.routed.lock().expect("route log").clone()
    }

    /// The recorded bodies whose attestation is a TPM round-2 answer.
    pub(crate) fn answers(&self) -> Vec<Vec<u8>> {
        self.seen
            .lock()
            .expect("body log")
            .iter()
            .filter(|body| JoinRequest::decode(body.as_slice()).is_ok_and(|r| is_answer(&r)))
            .cloned()
            .collect()
    }
}

/// The upstream's answer, and what it was.
async fn forward(upstream: &Client, req: &JoinRequest) -> (Answer, Response) {
    match upstream.join(req).await {
        Ok(resp) => (
            Answer::Ok,
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    bc_wire::endpoints::CONTENT_TYPE,
                )],
                resp.encode_to_vec(),
            )
                .into_response(),
        ),
        Err(ClientError::AccessDenied) => (
            Answer::AccessDenied,
            http::error_response(&ApiError::AccessDenied),
        ),
        Err(e) => (
            Answer::Failed,
            http::error_response(&ApiError::Unavailable(e.to_string())),
        ),
    }
}

pub(crate) fn is_answer(req: &JoinRequest) -> bool {
    matches!(
        TpmAttestation::decode(req.attestation.as_slice()).map(|a| a.round),
        Ok(Some(tpm_attestation::Round::Answer(_)))
    )
}
