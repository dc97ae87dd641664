//! HTTPS transport: an axum router for the JoinService endpoints (`Join`,
//! and `Renew` over mTLS) and an accept loop (tokio-rustls + hyper) that
//! serves it.
//!
//! The accept loop is our own rather than `axum::serve` so that each request
//! can carry its connection's TLS client certificate chain
//! ([`PeerCertificates`]), which Renew over mTLS needs, and its source
//! address ([`PeerAddr`]), which refusal events name; and so that it holds
//! the connection limits of [`crate::api::connlimit`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use bc_connlimit::{serve_connections, AcceptPolicy, RefusedCount, Stop};
use bc_wire::endpoints;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prost::Message;
use rustls::pki_types::CertificateDer;
use tokio::net::TcpListener;

use crate::api::channel::{Channels, ConnSlot, ConnStop};
use crate::api::client_auth::{DbClock, DbTimeClientVerifier};
use crate::api::connlimit::{Deadline, Limits, Refusal, RequestGate, Slot, Tracker};
use crate::api::header_errors::WithErrorBodies;
use crate::pki::Bundle;
use crate::plane::api_error::ApiError;
use crate::plane::join::JoinService;
use crate::plane::renew::RenewService;
use crate::plane::siteapi::SiteService;
use crate::plane::ControlPlane;
use crate::store::Store;

/// Largest request body accepted.
pub(crate) const BODY_LIMIT: usize = 64 * 1024;

/// Largest join request body: a tpm join's round 2 may carry the TCG event
/// log a pool's boot policy judges ([`bc_wire::tpm::MAX_EVENT_LOG`]).
pub(crate) const JOIN_BODY_LIMIT: usize = BODY_LIMIT + bc_wire::tpm::MAX_EVENT_LOG;

/// Largest renewal body: under a pool's boot policy it carries the event log
/// too (the caller authenticated with its node certificate first).
const RENEW_BODY_LIMIT: usize = JOIN_BODY_LIMIT;
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections get to finish after shutdown starts.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// A failing `accept` (out of descriptors, ...) is retried after a pause
/// that doubles from 10 ms to 1 s while it keeps failing; open connections
/// get [`DRAIN_TIMEOUT`] to finish after shutdown starts.
const ACCEPT: AcceptPolicy = AcceptPolicy {
    backoff_first: Duration::from_millis(10),
    backoff_max: Duration::from_secs(1),
    drain: Some(DRAIN_TIMEOUT),
};
/// Connections refused by the limits are logged at most this often.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

/// The client certificate chain of the request's TLS connection (leaf
/// first); empty when the client sent none.
#[derive(Clone, Debug, Default)]
pub(crate) struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// The connection's request deadline (an extension of every request), for
/// a response whose body may rightly take longer (`GET /v1/images/…`).
#[derive(Clone)]
pub(crate) struct ConnDeadline(pub Deadline);

/// The address of the request's TCP peer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerAddr(pub SocketAddr);

/// The rustls server config: the bundle's TLS server certificate, TLS 1.2+,
/// ring only. Client certificates are asked for and, when sent, verified
/// against the node CA at the database's time (`db`'s clock, see
/// [`crate::api::client_auth`]); they are optional so that machines without an
/// identity can join.
pub fn tls_config(bundle: &Bundle, db: &Store) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(bundle.node_ca.cert_der().to_vec()))?;
    let webpki = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| rustls::Error::General(e.to_string()))?;
    let clock = DbClock::for_store(db).map_err(|e| {
        rustls::Error::General(format!("the database clock ({}): {e}", db.describe()))
    })?;
    let verifier = Arc::new(DbTimeClientVerifier::new(webpki, clock));
    let (chain, key) = bundle.tls_server_identity();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The control plane's HTTP routes, one handler per service call.
/// Anything else is a protobuf NOT_FOUND.
pub fn router(service: Arc<ControlPlane>) -> Router {
    let gate = Arc::new(RequestGate::new());
    let channels = Channels::new();
    // The poller advances the workflows too, which must not wait for a
    // first channel; outside a runtime it starts with the first channel.
    if tokio::runtime::Handle::try_current().is_ok() {
        channels.start_poller(service.clone());
    }
    Router::new()
        .route(
            endpoints::JOIN,
            post(join_handler).layer(DefaultBodyLimit::max(JOIN_BODY_LIMIT)),
        )
        .route(
            endpoints::RENEW,
            post(renew_handler).layer(DefaultBodyLimit::max(RENEW_BODY_LIMIT)),
        )
        .route(endpoints::COMMAND_CHANNEL, get(channel_handler))
        .route(endpoints::ACQUIRE_LEASE, site_route(SiteCall::AcquireLease))
        .route(endpoints::RENEW_LEASE, site_route(SiteCall::RenewLease))
        .route(endpoints::RELEASE_LEASE, site_route(SiteCall::ReleaseLease))
        .route(endpoints::GET_SECRET, site_route(SiteCall::GetSecret))
        .route(
            endpoints::LIST_BOOT_ENTRIES,
            site_route(SiteCall::ListBootEntries),
        )
        .method_not_allowed_fallback(|| async {
            error_response(&ApiError::NotFound("endpoints take POST".to_owned()))
        })
        .fallback(|| async { error_response(&ApiError::NotFound("no such endpoint".to_owned())) })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(Extension(gate))
        .layer(Extension(channels))
        .with_state(service)
}

/// The command channel's upgrade ([`crate::api::channel`]).
async fn channel_handler(
    State(service): State<Arc<ControlPlane>>,
    Extension(channels): Extension<Arc<Channels>>,
    addr: Option<Extension<PeerAddr>>,
    peer: Option<Extension<PeerCertificates>>,
    req: axum::extract::Request,
) -> Response {
    let source = addr.map(|Extension(p)| p.0);
    crate::api::channel::upgrade(service, channels, client_leaf(peer), source, req).await
}

async fn join_handler(
    State(service): State<Arc<ControlPlane>>,
    Extension(gate): Extension<Arc<RequestGate>>,
    peer: Option<Extension<PeerAddr>>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let source = peer.map(|Extension(p)| p.0.ip());
    call_service("join", &gate, source, &headers, body, move |body| {
        JoinService::new(&service)
            .join_bytes(body, source)
            .map(|r| r.encode_to_vec())
    })
    .await
}

/// `Renew`: the TLS client's leaf certificate (verified against the node CA
/// during the handshake, which the leaf's key signed) is the caller's
/// identity; without one the request is refused (`no-client-certificate`).
async fn renew_handler(
    State(service): State<Arc<ControlPlane>>,
    Extension(gate): Extension<Arc<RequestGate>>,
    addr: Option<Extension<PeerAddr>>,
    peer: Option<Extension<PeerCertificates>>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let source = addr.map(|Extension(p)| p.0.ip());
    let leaf = client_leaf(peer);
    call_service("renew", &gate, source, &headers, body, move |body| {
        RenewService::new(&service)
            .renew_bytes(leaf.as_deref(), body)
            .map(|r| r.encode_to_vec())
    })
    .await
}

/// The site endpoints (see [`crate::plane::siteapi`]), one route each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SiteCall {
    AcquireLease,
    RenewLease,
    ReleaseLease,
    GetSecret,
    ListBootEntries,
}

/// The POST route of one site endpoint.
fn site_route(call: SiteCall) -> axum::routing::MethodRouter<Arc<ControlPlane>> {
    post(move |state, gate, addr, peer, headers, body| {
        site_handler(call, state, gate, addr, peer, headers, body)
    })
}

/// The site endpoints (see [`crate::plane::siteapi`]): like Renew, the TLS
/// client's leaf is the caller. `call` picks the endpoint.
async fn site_handler(
    call: SiteCall,
    State(service): State<Arc<ControlPlane>>,
    Extension(gate): Extension<Arc<RequestGate>>,
    addr: Option<Extension<PeerAddr>>,
    peer: Option<Extension<PeerCertificates>>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let source = addr.map(|Extension(p)| p.0.ip());
    let leaf = client_leaf(peer);
    call_service("site", &gate, source, &headers, body, move |body| {
        let leaf = leaf.as_deref();
        let service = SiteService::new(&service);
        match call {
            SiteCall::AcquireLease => service.acquire_lease_bytes(leaf, body, source),
            SiteCall::RenewLease => service.renew_lease_bytes(leaf, body, source),
            SiteCall::ReleaseLease => service.release_lease_bytes(leaf, body, source),
            SiteCall::GetSecret => service.get_secret_bytes(leaf, body, source),
            SiteCall::ListBootEntries => service.list_boot_entries_bytes(leaf, body, source),
        }
    })
    .await
}

/// The TLS client's leaf certificate (DER), the caller of the mTLS endpoints.
fn client_leaf(peer: Option<Extension<PeerCertificates>>) -> Option<Vec<u8>> {
    peer.and_then(|Extension(p)| p.0.first().map(|c| c.as_ref().to_vec()))
}

/// What every endpoint does around its service call: checks the content
/// type and the body, waits for its place in the handlers (see
/// [`RequestGate`]), runs `call` on a blocking thread (SQLite and signing
/// block; they must not stall the async workers) and answers its protobuf
/// or its error.
async fn call_service(
    what: &'static str,
    gate: &RequestGate,
    source: Option<std::net::IpAddr>,
    headers: &HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
    call: impl FnOnce(&[u8]) -> Result<Vec<u8>, ApiError> + Send + 'static,
) -> Response {
    if let Err(e) = check_content_type(headers) {
        return error_response(&e);
    }
    let body = match read_body(body) {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let Ok(pass) = gate.enter(source).await else {
        return error_response(&ApiError::Unavailable(
            "the request gate is closed".to_owned(),
        ));
    };
    let result = tokio::task::spawn_blocking(move || call(&body)).await;
    drop(pass);
    match result {
        Ok(Ok(resp)) => protobuf_response(StatusCode::OK, resp),
        Ok(Err(e)) => error_response(&e),
        Err(e) => error_response(&ApiError::Internal(format!("{what} task failed: {e}"))),
    }
}

fn read_body(
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        ApiError::InvalidInput(if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            format!("the body is larger than {BODY_LIMIT} bytes")
        } else {
            format!("cannot read the body: {e}")
        })
    })
}

/// Requests are protobuf; a missing content type is tolerated, another one
/// is not. Parameters (`; charset=utf-8`) are allowed and ignored.
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    match headers.get(header::CONTENT_TYPE) {
        None => Ok(()),
        Some(v) if is_protobuf(v.as_bytes()) => Ok(()),
        Some(v) => Err(ApiError::InvalidInput(format!(
            "content-type must be {}, not {:?}",
            endpoints::CONTENT_TYPE,
            String::from_utf8_lossy(v.as_bytes())
        ))),
    }
}

/// Whether a content-type value is the protobuf media type, whatever its
/// parameters and case.
fn is_protobuf(value: &[u8]) -> bool {
    let media_type = value.split(|b| *b == b';').next().unwrap_or_default();
    media_type
        .trim_ascii()
        .eq_ignore_ascii_case(endpoints::CONTENT_TYPE.as_bytes())
}

/// An error as the wire carries it: HTTP status and an `agent::Error` body.
pub fn error_response(e: &ApiError) -> Response {
    if let ApiError::Internal(detail) = e {
        tracing::error!(error = %detail, "request failed");
    }
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    protobuf_response(status, e.to_wire().encode_to_vec())
}

fn protobuf_response(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(endpoints::CONTENT_TYPE),
        )],
        Body::from(body),
    )
        .into_response()
}

/// Serves `router` over TLS on `listener` until `shutdown` completes, then
/// stops accepting, lets open connections finish their requests (at most
/// ten seconds) and returns. The limits are the defaults for this process's
/// descriptor limit; see [`serve_with`].
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let limits = Limits::for_process(&crate::config::ServerConfig::default());
    serve_with(listener, tls, router, limits, shutdown).await
}

/// [`serve`] with explicit connection limits.
///
/// Failed handshakes and broken connections are logged at debug and never
/// stop the server. A failing `accept` (e.g. out of file descriptors) is
/// retried with a doubling pause, logged once per pause. Connections over
/// the limits are closed at once (see [`crate::api::connlimit`]), logged at most
/// every ten seconds with how many. The accept loop is
/// [`bc_connlimit::serve_connections`], which `bcd site` runs too.
pub async fn serve_with(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    tracing::info!(
        max_connections = limits.max_connections,
        max_connections_per_source = limits.max_per_source,
        request_timeout_s = limits.request_timeout.as_secs(),
        "connection limits"
    );
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let tracker = Tracker::new(limits.max_connections, limits.max_per_source);
    let mut refused = RefusedCount::new(REFUSED_LOG_EVERY);
    serve_connections(
        listener,
        &tracker,
        ACCEPT,
        shutdown,
        |why, peer| log_refused(&mut refused, why, peer, &limits),
        |tcp, peer, slot, stop| {
            let server = Server {
                acceptor: acceptor.clone(),
                router: router.clone(),
                limits,
            };
            serve_connection(server, tcp, peer, slot, stop)
        },
    )
    .await;
    Ok(())
}

/// Logs a connection refused by the limits: at most every
/// [`REFUSED_LOG_EVERY`], with how many since the last line.
fn log_refused(count: &mut RefusedCount, why: Refusal, peer: SocketAddr, l: &Limits) {
    let Some(refused) = count.note() else {
        return;
    };
    tracing::warn!(
        refused,
        last_peer = %peer,
        last_reason = ?why,
        max_connections = l.max_connections,
        max_connections_per_source = l.max_per_source,
        "connections refused: the server is at its connection limits \
         ([server] max_connections, max_connections_per_source)"
    );
}

/// What every connection is served with.
struct Server {
    acceptor: tokio_rustls::TlsAcceptor,
    router: Router,
    limits: Limits,
}

/// One connection: the TLS handshake, then HTTP/1.1 requests, under the
/// whole-request deadline, and closed when the server needs its slot.
async fn serve_connection(
    server: Server,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    slot: Slot,
    stop: Stop,
) {
    let slot = Arc::new(slot);
    let deadline = Deadline::after(server.limits.request_timeout);
    let work = handle_connection(server, tcp, peer, slot.clone(), deadline.clone(), stop);
    tokio::select! {
        () = work => {}
        () = deadline.passed() => {
            tracing::debug!(peer = %peer, "request timed out; connection closed");
        }
        () = slot.evicted() => {
            tracing::debug!(peer = %peer, "idle connection closed to make room");
        }
    }
}

async fn handle_connection(
    server: Server,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    slot: Arc<Slot>,
    deadline: Deadline,
    mut stop: Stop,
) {
    let Server {
        acceptor,
        router,
        limits,
    } = server;
    let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(peer = %peer, "TLS handshake timed out");
            return;
        }
    };
    let certs = PeerCertificates(Arc::new(
        tls.get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default(),
    ));
    let svc = TowerToHyperService::new(router);
    let conn_stop = ConnStop(stop.clone());
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(certs.clone());
        req.extensions_mut().insert(PeerAddr(peer));
        // An upgrade to the command channel keeps the slot until proven.
        req.extensions_mut().insert(ConnSlot(slot.clone()));
        req.extensions_mut().insert(conn_stop.clone());
        // A long download (a deploy image) moves the request deadline.
        req.extensions_mut().insert(ConnDeadline(deadline.clone()));
        let call = svc.call(req);
        let (slot, deadline) = (slot.clone(), deadline.clone());
        async move {
            slot.busy();
            let resp = call.await;
            deadline.reset(limits.request_timeout);
            slot.idle();
            resp
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(WithErrorBodies::new(tls)), svc)
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(peer = %peer, error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use bc_wire::agent::{JoinResponse, JoinResponseBody, Role};
    use rcgen::PublicKeyData;
    use rustls::pki_types::{PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    /// A minimal HTTP/1.1 client over rustls: enough to talk to the server
    /// the way an agent does.
    async fn call(
        addr: SocketAddr,
        cfg: Arc<rustls::ClientConfig>,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/x-protobuf\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        call_raw(addr, cfg, &head, body).await
    }

    /// Sends `head` (the request line and headers, as given) and `body`.
    async fn call_raw(
        addr: SocketAddr,
        cfg: Arc<rustls::ClientConfig>,
        head: &str,
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(cfg)
            .connect(name, tcp)
            .await
            .unwrap();
        tls.write_all(head.as_bytes()).await.unwrap();
        tls.write_all(body).await.unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match tls.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let split = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let status_line = std::str::from_utf8(&buf[..split])
            .unwrap()
            .lines()
            .next()
            .unwrap();
        let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
        (status, buf[split + 4..].to_vec())
    }

    fn client(bundle: &Bundle, identity: Option<(Vec<u8>, Vec<u8>)>) -> Arc<rustls::ClientConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(bundle.tls_ca_der().to_vec()))
            .unwrap();
        let b = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(match identity {
            None => b.with_no_client_auth(),
            Some((cert, key)) => b
                .with_client_auth_cert(
                    vec![CertificateDer::from(cert)],
                    PrivateKeyDer::Pkcs8(key.into()),
                )
                .unwrap(),
        })
    }

    /// A POST to Join with `content_type` and `extra` header lines.
    fn post_head(content_type: &str, extra: &str, len: usize) -> String {
        format!(
            "POST {} HTTP/1.1\r\nhost: localhost\r\ncontent-type: {content_type}\r\n{extra}\
             content-length: {len}\r\nconnection: close\r\n\r\n",
            endpoints::JOIN
        )
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn media_type_parameters_and_error_bodies() {
        let cp = crate::test_support::cp();
        let svc = cp.svc.clone();
        let tls = tls_config(svc.bundle(), svc.database()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, tls, router(svc.clone()), async {
            let _ = stopped.await;
        }));
        let anonymous = client(svc.bundle(), None);
        let error = |body: &[u8]| bc_wire::agent::Error::decode(body).unwrap();

        // Parameters on the media type are accepted, in any case and spacing.
        let (req, _) = cp.token_request(Role::Node, None);
        let body = req.encode_to_vec();
        let head = post_head("application/x-protobuf; charset=utf-8", "", body.len());
        let (status, _) = call_raw(addr, anonymous.clone(), &head, &body).await;
        assert_eq!(status, 200);
        let head = post_head("Application/X-Protobuf ;charset=\"utf-8\"", "", 2);
        let (status, body) = call_raw(addr, anonymous.clone(), &head, b"\xff\xff").await;
        assert_eq!(status, 400);
        assert!(error(&body).message.contains("not a JoinRequest"));
        // Other media types are still refused.
        for other in [
            "text/plain",
            "application/x-protobuffer",
            "application/json; x=application/x-protobuf",
        ] {
            let (status, body) =
                call_raw(addr, anonymous.clone(), &post_head(other, "", 0), b"").await;
            assert_eq!(status, 400, "{other}");
            assert!(error(&body).message.contains("content-type"), "{other}");
        }

        // Too many headers: hyper's 431, with the protobuf Error body.
        let many: String = (0..120).map(|i| format!("x-h{i}: v\r\n")).collect();
        let (status, body) = call_raw(
            addr,
            anonymous.clone(),
            &post_head(endpoints::CONTENT_TYPE, &many, 0),
            b"",
        )
        .await;
        assert_eq!(status, 431);
        let err = error(&body);
        assert_eq!(err.code, bc_wire::agent::Code::InvalidInput as i32);
        assert!(err.message.contains("headers"), "{}", err.message);
        // The server goes on serving.
        let (status, _) = call(addr, anonymous, "POST", endpoints::JOIN, b"\xff").await;
        assert_eq!(status, 400);

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    /// Reads until the server closes; how long that took (on tokio's
    /// clock: paused, it is the server's timers that decide it).
    async fn closed_after(mut s: impl tokio::io::AsyncRead + Unpin) -> Duration {
        let started = Instant::now();
        let mut buf = [0u8; 1024];
        let wait = async {
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .expect("the server closes the connection");
        started.elapsed()
    }

    /// The request deadline runs to the end of the response body: a
    /// download the client stops reading is cut when it passes. The clock
    /// is paused once the answer has begun (the file was read before, on
    /// the blocking pool, which a paused clock would not wait for), then
    /// the client stalls past the deadline on that clock.
    #[tokio::test]
    async fn a_stalled_download_is_cut_at_the_request_deadline() {
        let cp = crate::test_support::cp();
        let svc = cp.svc.clone();
        // Larger than loopback's socket buffers can take.
        const SIZE: usize = 48 << 20;
        let file = cp.path().join("bcd_1_amd64.deb");
        std::fs::write(&file, vec![7u8; SIZE]).unwrap();
        crate::model::dist::add(cp.path(), &file).unwrap();
        let tls = tls_config(svc.bundle(), svc.database()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            max_connections: 100,
            max_per_source: 100,
            request_timeout: DEADLINE,
        };
        // Far past what the real clock may take to the answer's head.
        const DEADLINE: Duration = Duration::from_secs(600);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_with(
            listener,
            tls,
            crate::api::dist_serve::with_dist(router(svc.clone()), cp.path()),
            limits,
            async {
                let _ = stopped.await;
            },
        ));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(client(svc.bundle(), None))
            .connect(name, tcp)
            .await
            .unwrap();
        tls.write_all(b"GET /dist/bcd_1_amd64.deb HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        tls.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        tokio::time::pause();
        tokio::time::sleep(DEADLINE).await;
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf)).await
        {
            if n == 0 {
                break;
            }
            got += n;
        }
        assert!(
            got < SIZE,
            "the whole {SIZE} bytes arrived after the deadline"
        );

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    /// On tokio's paused clock (loopback I/O is seen before it advances):
    /// a connection is closed the request deadline after it was accepted,
    /// whatever it sent meanwhile, not a deadline after its head.
    #[tokio::test(start_paused = true)]
    async fn a_request_has_one_deadline_from_accept_to_answer() {
        let cp = crate::test_support::cp();
        let svc = cp.svc.clone();
        let tls = tls_config(svc.bundle(), svc.database()).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            max_connections: 100,
            max_per_source: 100,
            request_timeout: Duration::from_secs(1),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_with(
            listener,
            tls,
            router(svc.clone()),
            limits,
            async {
                let _ = stopped.await;
            },
        ));

        // A client that never starts its handshake.
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert_eq!(closed_after(tcp).await, Duration::from_secs(1));
        // One that sends its head, then a body that never ends.
        let accepted = Instant::now();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(client(svc.bundle(), None))
            .connect(name, tcp)
            .await
            .unwrap();
        tls.write_all(post_head(endpoints::CONTENT_TYPE, "", 100).as_bytes())
            .await
            .unwrap();
        tls.write_all(&[0; 10]).await.unwrap();
        closed_after(tls).await;
        assert_eq!(accepted.elapsed(), Duration::from_secs(1));

        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    crate::test_support::both_backends!(join_over_https_then_mtls);

    /// A join, mTLS and renewals over HTTPS, on both databases (PostgreSQL:
    /// the verifier's clock thread). The test touches the database off the
    /// runtime, as `serve` does (its handlers run on spawn_blocking).
    fn join_over_https_then_mtls(backend: crate::test_support::Backend) {
        let cp = crate::test_support::cp_on(backend);
        let svc = cp.svc.clone();
        let tls = tls_config(svc.bundle(), svc.database()).unwrap();
        let (req, key) = cp.token_request(Role::Node, None);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let app =
                router(svc.clone()).route(
                    "/peer",
                    get(|Extension(p): Extension<PeerCertificates>| async move {
                        p.0.len().to_string()
                    }),
                );
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let server = tokio::spawn(serve(listener, tls, app, async {
                let _ = stopped.await;
            }));

            let anonymous = client(svc.bundle(), None);
            let (status, body) = call(
                addr,
                anonymous.clone(),
                "POST",
                endpoints::JOIN,
                &req.encode_to_vec(),
            )
            .await;
            assert_eq!(status, 200);
            let resp = JoinResponse::decode(body.as_slice()).unwrap();
            let joined = JoinResponseBody::decode(resp.body.as_slice()).unwrap();
            assert_eq!(joined.csr_sha256, bc_wire::sha256(&req.csr));

            // The same request again: the token is spent; a bare 403.
            let (status, body) = call(
                addr,
                anonymous.clone(),
                "POST",
                endpoints::JOIN,
                &req.encode_to_vec(),
            )
            .await;
            assert_eq!(status, 403);
            let err = bc_wire::agent::Error::decode(body.as_slice()).unwrap();
            assert_eq!(err.code, bc_wire::agent::Code::AccessDenied as i32);
            assert_eq!(err.message, "join refused");

            // Garbage is INVALID_INPUT.
            let (status, _) = call(
                addr,
                anonymous.clone(),
                "POST",
                endpoints::JOIN,
                b"\xff\xff",
            )
            .await;
            assert_eq!(status, 400);

            // The node certificate works as a client certificate, and the
            // handler sees it.
            let (_, n) = call(addr, anonymous, "GET", "/peer", b"").await;
            assert_eq!(n, b"0");
            let mtls = client(
                svc.bundle(),
                Some((joined.chain[0].clone(), key.serialize_der())),
            );
            let (status, n) = call(addr, mtls.clone(), "GET", "/peer", b"").await;
            assert_eq!((status, n.as_slice()), (200, b"1".as_slice()));

            // Renew over mTLS: a new certificate for the new key, same node.
            let key2 = crate::test_support::key();
            let renew = bc_wire::agent::RenewRequest {
                csr: crate::test_support::plain_csr(&key2),
                key_attestation: None,
                boot: None,
            };
            let (status, body) =
                call(addr, mtls, "POST", endpoints::RENEW, &renew.encode_to_vec()).await;
            assert_eq!(status, 200);
            let renewed = bc_wire::agent::RenewResponse::decode(body.as_slice()).unwrap();
            assert_eq!(renewed.chain.len(), 2);
            assert_eq!(renewed.chain[1], svc.node_ca_der());
            let id = crate::pki::node_cert_identity(&renewed.chain[0]).unwrap();
            assert_eq!(id.node_id, joined.node_id);
            assert_eq!(id.spki_der, key2.subject_public_key_info());
            // With the new certificate, renewing works again.
            let mtls2 = client(
                svc.bundle(),
                Some((renewed.chain[0].clone(), key2.serialize_der())),
            );
            let (status, _) = call(
                addr,
                mtls2,
                "POST",
                endpoints::RENEW,
                &renew.encode_to_vec(),
            )
            .await;
            assert_eq!(status, 200);
            // Without a client certificate: a bare 403 with the spec's message.
            let anonymous = client(svc.bundle(), None);
            let (status, body) = call(
                addr,
                anonymous,
                "POST",
                endpoints::RENEW,
                &renew.encode_to_vec(),
            )
            .await;
            assert_eq!(status, 403);
            let err = bc_wire::agent::Error::decode(body.as_slice()).unwrap();
            assert_eq!(err.code, bc_wire::agent::Code::AccessDenied as i32);
            assert_eq!(err.message, "Renew refused");
            stop.send(()).unwrap();
            server.await.unwrap().unwrap();
        });
        let events = crate::model::records::list_events(svc.database()).unwrap();
        let kinds: Vec<_> = events.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "node.joined",
                "security.join.refused",
                "node.renewed",
                "node.renewed",
                "security.renew.refused"
            ]
        );
        assert_eq!(events[4].reason.as_deref(), Some("no-client-certificate"));
    }
}
