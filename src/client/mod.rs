//! The control plane client: protobuf over HTTPS, trusting only the pinned CA.
//!
//! The TLS client knows no roots but `pins.server_ca` (no system store, no
//! proxy-injected CA), so a control plane is reached only under its own CA.
//! Every failure is typed, so the join can tell "unreachable" from "refused"
//! from "answered garbage", and each says where it happened.
//!
//! A client made [`Client::with_identity`] also presents the node
//! certificate, its handshake signed by the node key through
//! [`crate::keys::tls`]: that is how `Renew` (mTLS) is called.
pub mod answer;
pub(crate) mod join;
pub mod renew;
mod site;

use std::sync::Arc;
use std::time::Duration;

use bc_wire::agent;
use bc_wire::endpoints;
use prost::Message;
use reqwest::Url;

use crate::config::Config;
use crate::keys::NodeKey;
use crate::pki::printable;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// No honest answer comes near this; a bigger one is not read into memory.
const MAX_BODY: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot set up the HTTPS client: {0}")]
    Setup(String),
    #[error("cannot reach the control plane at {url}: {cause}")]
    Unreachable { url: String, cause: String },
    #[error("TLS with the control plane at {url} failed: {cause} (is pins.server_ca the control plane's CA?)")]
    Tls { url: String, cause: String },
    #[error(
        "the control plane at {url} refused this node's certificate in the TLS handshake: {cause}"
    )]
    CertificateRefused { url: String, cause: String },
    #[error("this call needs the node certificate (mTLS), and the client has none")]
    NoClientCertificate,
    /// The node key could not sign the handshake (a TPM gone, a helper down).
    #[error("the TLS handshake with the control plane at {url} failed on this side: {cause}")]
    Handshake { url: String, cause: String },
    #[error("the control plane at {url} did not answer within {secs} s")]
    Timeout { url: String, secs: u64 },
    /// Every refusal of the machine, whatever the reason: the reason stays
    /// on the server.
    #[error("access denied: the control plane refused the request")]
    AccessDenied,
    /// A renewal refused by the node's boot evidence: the one refusal whose
    /// reason the control plane tells the node (which proved who it is), so
    /// `bcd doctor` can say why it stopped renewing. The server's words.
    #[error("access denied: {0}")]
    BootRefused(String),
    #[error("the control plane answered HTTP {status}: {code}{message}")]
    Rejected {
        status: u16,
        code: String,
        /// Empty or `": <server message>"`, made printable.
        message: String,
    },
    #[error("the control plane's answer is not a {expected}: {cause}")]
    BadAnswer {
        expected: &'static str,
        cause: String,
    },
    #[error("the control plane's answer is larger than {limit} bytes")]
    TooLarge { limit: usize },
}

/// A client for one control plane.
pub struct Client {
    http: reqwest::Client,
    /// The base URL without a trailing slash, for messages.
    api: String,
    join_url: Url,
    renew_url: Url,
    /// Whether the handshake presents the node certificate.
    mtls: bool,
}

impl Client {
    /// The control plane's base URL, as messages show it.
    pub(crate) fn api(&self) -> &str {
        &self.api
    }

    /// A client that presents no certificate: for `Join`.
    pub fn new(config: &Config) -> Result<Client, ClientError> {
        Client::build(config, None)
    }

    /// A client that presents `chain` (DER, leaf first) and signs the
    /// handshake with `key`, the key its leaf certifies: for `Renew`.
    pub fn with_identity(
        config: &Config,
        chain: &[Vec<u8>],
        key: Arc<dyn NodeKey>,
    ) -> Result<Client, ClientError> {
        Client::build(config, Some(crate::keys::tls::client_identity(chain, key)))
    }

    fn build(
        config: &Config,
        identity: Option<Arc<rustls::sign::SingleCertAndKey>>,
    ) -> Result<Client, ClientError> {
        let tls = pinned_tls(config).map_err(ClientError::Setup)?;
        let mtls = identity.is_some();
        let tls = match identity {
            Some(resolver) => tls.with_client_cert_resolver(resolver),
            None => tls.with_no_client_auth(),
        };
        let http = https_client(
            tls,
            CONNECT_TIMEOUT,
            REQUEST_TIMEOUT,
            concat!("bcd/", env!("CARGO_PKG_VERSION")),
        )
        .map_err(ClientError::Setup)?;
        let api = config.api.as_str().trim_end_matches('/').to_owned();
        let url = |path: &str| {
            Url::parse(&format!("{api}{path}")).map_err(|e| ClientError::Setup(e.to_string()))
        };
        let join_url = url(endpoints::JOIN)?;
        let renew_url = url(endpoints::RENEW)?;
        Ok(Client {
            http,
            api,
            join_url,
            renew_url,
            mtls,
        })
    }

    /// One `Join` call. Deferrals are the caller's business ([`join::run`]).
    pub async fn join(
        &self,
        request: &agent::JoinRequest,
    ) -> Result<agent::JoinResponse, ClientError> {
        let answer = self.post(&self.join_url, request.encode_to_vec()).await?;
        let bad = |cause: String| ClientError::BadAnswer {
            expected: "JoinResponse",
            cause,
        };
        let resp = agent::JoinResponse::decode(answer.body.as_slice())
            .map_err(|e| bad(format!("{e}{}", answer.content_type_hint())))?;
        // Every JoinResponse has a body; an empty one is not worth a signature check.
        if resp.body.is_empty() {
            return Err(bad("it carries no body".to_owned()));
        }
        Ok(resp)
    }

    /// POSTs a protobuf body; a 2xx answer, or the typed refusal.
    async fn post(&self, url: &Url, body: Vec<u8>) -> Result<Answer, ClientError> {
        let mut resp = self
            .http
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, endpoints::CONTENT_TYPE)
            .header(reqwest::header::ACCEPT, endpoints::CONTENT_TYPE)
            .body(body)
            .send()
            .await
            .map_err(|e| self.transport_error(&e))?;
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .map(|v| printable(&String::from_utf8_lossy(v.as_bytes())));
        let body = self.read_capped(&mut resp).await?;
        if status.is_success() {
            return Ok(Answer { body, content_type });
        }
        tracing::debug!(
            status = status.as_u16(),
            "the control plane refused the call"
        );
        match agent::Error::decode(body.as_slice()) {
            Ok(err) if err.code == agent::Code::AccessDenied as i32 => {
                if err.message.starts_with(bc_wire::tpm::RENEW_REFUSED_BOOT) {
                    return Err(ClientError::BootRefused(printable(&err.message)));
                }
                Err(ClientError::AccessDenied)
            }
            Ok(err) if err.code != agent::Code::Unspecified as i32 => {
                let code = agent::Code::try_from(err.code)
                    .map(|c| c.as_str_name().to_owned())
                    .unwrap_or_else(|_| format!("error code {}", err.code));
                let message = printable(&err.message);
                Err(ClientError::Rejected {
                    status: status.as_u16(),
                    code,
                    message: if message.is_empty() {
                        message
                    } else {
                        format!(": {message}")
                    },
                })
            }
            _ => Err(ClientError::Rejected {
                status: status.as_u16(),
                code: status.canonical_reason().unwrap_or("error").to_owned(),
                message: " (without an error body)".to_owned(),
            }),
        }
    }

    async fn read_capped(&self, resp: &mut reqwest::Response) -> Result<Vec<u8>, ClientError> {
        let too_big = || ClientError::TooLarge { limit: MAX_BODY };
        if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
            return Err(too_big());
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.transport_error(&e))? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(too_big());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    fn transport_error(&self, e: &reqwest::Error) -> ClientError {
        let url = self.api.clone();
        if e.is_timeout() {
            let secs = if e.is_connect() {
                CONNECT_TIMEOUT
            } else {
                REQUEST_TIMEOUT
            }
            .as_secs();
            return ClientError::Timeout { url, secs };
        }
        if let Some(tls) = find_rustls_error(e) {
            if self.mtls && refuses_certificate(tls) {
                return ClientError::CertificateRefused {
                    url,
                    cause: tls.to_string(),
                };
            }
            if let rustls::Error::General(cause) = tls {
                return ClientError::Handshake {
                    url,
                    cause: cause.clone(),
                };
            }
            return ClientError::Tls {
                url,
                cause: tls.to_string(),
            };
        }
        ClientError::Unreachable {
            url,
            cause: root_cause(e),
        }
    }
}

/// A 2xx answer.
struct Answer {
    body: Vec<u8>,
    content_type: Option<String>,
}

impl Answer {
    /// Names a content type that explains why a body does not decode.
    fn content_type_hint(&self) -> String {
        match &self.content_type {
            Some(ct) if !ct.starts_with(endpoints::CONTENT_TYPE) => {
                format!(" (content-type {ct}, expected {})", endpoints::CONTENT_TYPE)
            }
            _ => String::new(),
        }
    }
}

pub(crate) type DynError = dyn std::error::Error + 'static;

/// The causes of `e`, outermost first. `io::Error::source` skips the error
/// it wraps (and rustls errors travel inside nested `io::Error`s inside
/// hyper's errors), so wrapped errors are visited explicitly.
pub(crate) fn causes(e: &DynError) -> Vec<&DynError> {
    let mut out = Vec::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        out.push(err);
        cur = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &DynError),
            None => err.source(),
        };
    }
    out
}

/// The alerts a server sends about the client's certificate.
fn refuses_certificate(e: &rustls::Error) -> bool {
    use rustls::AlertDescription as A;
    matches!(
        e,
        rustls::Error::AlertReceived(
            A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::AccessDenied
                | A::CertificateRequired
                | A::DecryptError
        )
    )
}

fn find_rustls_error(e: &reqwest::Error) -> Option<&rustls::Error> {
    causes(e)
        .into_iter()
        .find_map(|c| c.downcast_ref::<rustls::Error>())
}

/// The innermost cause, in words an operator recognises.
fn root_cause(e: &DynError) -> String {
    let all = causes(e);
    if let Some((_, words)) = io_words(&all) {
        return words.to_owned();
    }
    all.last().map_or_else(|| e.to_string(), |c| c.to_string())
}

/// The innermost `io::Error` of `chain` (from [`causes`]) when its kind says
/// it best ("connection refused"): its kind, and those words.
pub(crate) fn io_words(chain: &[&DynError]) -> Option<(std::io::ErrorKind, &'static str)> {
    use std::io::ErrorKind::*;
    let kind = chain
        .iter()
        .rev()
        .find_map(|c| c.downcast_ref::<std::io::Error>())?
        .kind();
    let words = match kind {
        ConnectionRefused => "connection refused",
        ConnectionReset => "connection reset",
        ConnectionAborted => "connection aborted",
        UnexpectedEof => "the connection closed early",
        TimedOut => "timed out",
        _ => return None,
    };
    Some((kind, words))
}

/// How long an idle pooled connection may be reused: under the control
/// plane's 10 s for the next request head, after which it closes an idle
/// keep-alive. A request sent on a connection the server is closing fails
/// with "the connection closed early" (seen by `bcd site` listing boot
/// entries after a quiet spell); a fresh connection costs one handshake.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// HTTPS with `tls` only: no redirect (it could lead away from the pinned
/// control plane), and bounded waits.
pub(crate) fn https_client(
    tls: rustls::ClientConfig,
    connect: Duration,
    total: Duration,
    user_agent: &str,
) -> Result<reqwest::Client, String> {
    crate::http_builder::http_builder()
        .use_preconfigured_tls(tls)
        .https_only(true)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(connect)
        .timeout(total)
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .user_agent(user_agent)
        .build()
        .map_err(|e| chain_message(&e))
}

/// TLS that trusts `pins.server_ca` and nothing else (no system store, no
/// proxy-injected CA); the caller says which certificate, if any, to present.
pub(crate) fn pinned_tls(
    config: &Config,
) -> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in &config.pins.server_ca {
        roots
            .add(ca.clone())
            .map_err(|e| format!("pins.server_ca: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots))
}

fn chain_message(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![e.to_string()];
    let mut cur = e.source();
    while let Some(err) = cur {
        parts.push(err.to_string());
        cur = err.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    /// The one constructor of bcd's HTTP clients sets TCP_NODELAY (reqwest
    /// shows it in the builder's Debug).
    #[test]
    fn http_clients_set_nodelay() {
        let builder = crate::http_builder::http_builder();
        assert!(
            format!("{builder:?}").contains("tcp_nodelay: true"),
            "{builder:?}"
        );
    }
}
