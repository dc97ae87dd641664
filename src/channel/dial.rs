//! Opening the channel: TCP, the pinned TLS of every control-plane call
//! ([`crate::client::pinned_tls`]) with the node certificate as client
//! certificate (its handshake signed by the node key through
//! [`crate::keys::tls`]: the TPM, or `bcd helper`), then the WebSocket
//! upgrade (tokio-tungstenite) at [`endpoints::COMMAND_CHANNEL`].
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bc_wire::command::channel::MAX_SERVER_FRAME;
use bc_wire::endpoints;
use reqwest::Url;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::WebSocketStream;

use super::ChannelIdentity;
use crate::config::Config;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The TLS handshake and the upgrade, each.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// A byte stream the WebSocket runs over (TLS in production, plain TCP in
/// the unit tests' peer).
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

pub(crate) type Ws = WebSocketStream<Box<dyn Io>>;

/// How the channel reaches the control plane.
pub(crate) trait Dial: Send + Sync + 'static {
    /// A WebSocket to the control plane, upgraded, as `identity`.
    fn dial(&self, identity: &ChannelIdentity) -> impl Future<Output = Result<Ws, String>> + Send;
}

/// What the agent accepts from the server: one frame at most a command and
/// its envelope.
pub(crate) fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_SERVER_FRAME))
        .max_frame_size(Some(MAX_SERVER_FRAME))
}

/// The control plane of the config, over its pinned TLS.
pub(crate) struct TlsDial {
    /// `wss://…/bettercompute.command.v1.CommandService/Channel`.
    url: String,
    /// The host as TCP and the TLS server name take it (no IPv6 brackets).
    host: String,
    port: u16,
    tls: rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>,
}

impl TlsDial {
    pub(crate) fn new(config: &Config) -> Result<TlsDial, String> {
        let api: &Url = &config.api;
        let host = api
            .host_str()
            .ok_or_else(|| format!("{api} names no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = api
            .port_or_known_default()
            .ok_or_else(|| format!("{api} names no port"))?;
        let base = api.as_str().trim_end_matches('/');
        let url = match base.strip_prefix("https://") {
            Some(rest) => format!("wss://{rest}{}", endpoints::COMMAND_CHANNEL),
            None => return Err(format!("{api} is not https")),
        };
        Ok(TlsDial {
            url,
            host,
            port,
            tls: crate::client::pinned_tls(config)?,
        })
    }
}

impl Dial for TlsDial {
    async fn dial(&self, identity: &ChannelIdentity) -> Result<Ws, String> {
        let at = format!("{}:{}", self.host, self.port);
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| format!("cannot reach {at} within {} s", CONNECT_TIMEOUT.as_secs()))?
        .map_err(|e| format!("cannot reach {at}: {e}"))?;
        // The proof and results go out in small writes.
        tcp.set_nodelay(true)
            .map_err(|e| format!("cannot set TCP_NODELAY: {e}"))?;
        let mut tls =
            self.tls
                .clone()
                .with_client_cert_resolver(crate::keys::tls::client_identity(
                    &identity.chain,
                    identity.key.clone(),
                ));
        // The upgrade is HTTP/1.1's.
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| format!("{}: not a TLS server name: {e}", self.host))?;
        let stream = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            tokio_rustls::TlsConnector::from(Arc::new(tls)).connect(name, tcp),
        )
        .await
        .map_err(|_| {
            format!(
                "TLS with {at}: no handshake within {} s",
                HANDSHAKE_TIMEOUT.as_secs()
            )
        })?
        .map_err(|e| format!("TLS with {at} failed: {}", chain_text(&e)))?;
        upgrade(&self.url, Box::new(stream)).await
    }
}

/// The WebSocket upgrade over `stream`.
pub(crate) async fn upgrade(url: &str, stream: Box<dyn Io>) -> Result<Ws, String> {
    use tokio_tungstenite::tungstenite::Error;
    let upgraded = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_tungstenite::client_async_with_config(url, stream, Some(ws_config())),
    )
    .await
    .map_err(|_| {
        format!(
            "no WebSocket upgrade within {} s",
            HANDSHAKE_TIMEOUT.as_secs()
        )
    })?;
    match upgraded {
        Ok((ws, _)) => Ok(ws),
        Err(Error::Http(resp)) => Err(match resp.status().as_u16() {
            404 => "the control plane has no command channel (HTTP 404: an older control plane?)"
                .to_owned(),
            403 => "the control plane refused this node's channel (HTTP 403: a certificate revoked, expired or replaced, or the node retired)".to_owned(),
            s => format!("the control plane refused the upgrade: HTTP {s}"),
        }),
        Err(e) => Err(format!("the WebSocket upgrade failed: {e}")),
    }
}

/// An error and its causes, each once (TLS errors travel inside I/O errors
/// that print the same words).
fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in crate::client::causes(e) {
        let text = c.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
    }
    parts.join(": ")
}
