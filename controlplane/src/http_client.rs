//! The control plane's outbound HTTP: one constructor, below every client
//! (the EK services reach the TPM makers with it, cloud-iid's OIDC
//! providers their issuers; the server side is [`crate::api::http`]).

/// Every HTTP client the control plane makes (a maker's EK service) starts
/// here, with TCP_NODELAY, for the reason [`crate::api::http`]'s `accept` sets it.
pub(crate) fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().tcp_nodelay(true)
}

/// An HTTPS-only client that trusts exactly `roots` (DER), keeps no idle
/// connection, and ends each request after `timeout`.
pub(crate) fn https_client(
    roots: &[Vec<u8>],
    timeout: std::time::Duration,
    redirect: reqwest::redirect::Policy,
) -> Result<reqwest::Client, String> {
    let mut builder = client_builder()
        .https_only(true)
        .tls_built_in_root_certs(false)
        .pool_max_idle_per_host(0)
        .timeout(timeout)
        .redirect(redirect);
    let mut added = 0;
    for der in roots {
        if let Ok(c) = reqwest::Certificate::from_der(der) {
            builder = builder.add_root_certificate(c);
            added += 1;
        }
    }
    if added == 0 {
        return Err("none of the CA certificates is usable".to_owned());
    }
    builder.build().map_err(|e| e.to_string())
}

/// A reqwest error with its causes, for the log.
pub(crate) fn cause(e: &reqwest::Error) -> String {
    let mut out = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The system's CA certificates: `SSL_CERT_FILE`, else the first bundle
/// of the usual places that exists; the error names `setting`, the key
/// that names a bundle instead.
pub(crate) fn system_roots(setting: &str) -> Result<Vec<Vec<u8>>, String> {
    use std::path::PathBuf;
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(f) = std::env::var_os("SSL_CERT_FILE") {
        candidates.push(f.into());
    }
    for p in [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/cert.pem",
        "/etc/ssl/ca-bundle.pem",
    ] {
        candidates.push(p.into());
    }
    for path in &candidates {
        let Ok(pem) = crate::fsutil::read_ca_bundle(path) else {
            continue;
        };
        let certs: Vec<Vec<u8>> = rustls_pemfile::certs(&mut pem.as_slice())
            .filter_map(|c| c.ok().map(|c| c.to_vec()))
            .collect();
        if !certs.is_empty() {
            return Ok(certs);
        }
    }
    Err(format!(
        "no CA bundle at {} (set {setting})",
        candidates
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::client_builder;

    /// The one constructor of the control plane's HTTP clients sets
    /// TCP_NODELAY (reqwest shows it in the builder's Debug).
    #[test]
    fn outbound_clients_set_nodelay() {
        assert!(
            format!("{:?}", client_builder()).contains("tcp_nodelay: true"),
            "{:?}",
            client_builder()
        );
    }
}
