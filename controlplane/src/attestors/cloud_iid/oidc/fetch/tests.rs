//! The fetch's bounds against a real local HTTPS issuer (its own test CA):
//! the keys of a well-behaved one, and an error, never keys, for an answer
//! too large, a redirect, a jwks_uri off the issuer's host, another issuer,
//! and an issuer that stalls past the timeout. Then the cache's rules.

use std::sync::Arc;

use super::*;
use crate::attestors::cloud_iid::oidc::tests::p256_jwk;

/// What the test issuer answers to a path: status, extra headers, body,
/// and how long it waits first.
struct Answer {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    delay: Duration,
}

impl Answer {
    fn ok(body: String) -> Answer {
        Answer {
            status: 200,
            headers: Vec::new(),
            body,
            delay: Duration::ZERO,
        }
    }
}

type Route = Arc<dyn Fn(&str) -> Answer + Send + Sync>;

/// A local HTTPS server (its own test CA; one request per connection, as
/// this client sends them) answering with `route(url)`; its URL and CA
/// roots. It stops when the runtime drops.
fn issuer(route: impl FnOnce(String) -> Route) -> (tokio::runtime::Runtime, String, Vec<Vec<u8>>) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let bc_test_support::tls::LoopbackTls {
        ca: ca_cert,
        server: tls,
    } = bc_test_support::tls::loopback_tls("bcd OIDC fetch test CA");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    let route = route(url.clone());
    rt.spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, route) = (acceptor.clone(), route.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&request);
                let path = text.split(' ').nth(1).unwrap_or("/").to_owned();
                let answer = route(&path);
                tokio::time::sleep(answer.delay).await;
                let mut head = format!(
                    "HTTP/1.1 {} X\r\ncontent-length: {}\r\nconnection: close\r\n",
                    answer.status,
                    answer.body.len()
                );
                for (k, v) in &answer.headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = tls.write_all(head.as_bytes()).await;
                let _ = tls.write_all(answer.body.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (rt, url, vec![ca_cert.der().to_vec()])
}

fn jwks() -> String {
    let key = p256::ecdsa::SigningKey::from_slice(&[7u8; 32]).unwrap();
    serde_json::json!({"keys": [p256_jwk(&key, "k1")]}).to_string()
}

/// An issuer whose openid-configuration names `jwks_uri` (`{url}` is its own
/// address) and `issuer`, and serves `jwks` at /jwks.
fn router_with(
    jwks_uri: &'static str,
    issuer: Option<&'static str>,
    jwks: String,
) -> impl FnOnce(String) -> Route {
    move |url: String| {
        let conf = serde_json::json!({
            "issuer": issuer.map_or(url.clone(), str::to_owned),
            "jwks_uri": jwks_uri.replace("{url}", &url),
        })
        .to_string();
        Arc::new(move |path: &str| match path {
            "/.well-known/openid-configuration" => Answer::ok(conf.clone()),
            "/jwks" => Answer::ok(jwks.clone()),
            _ => Answer {
                status: 404,
                ..Answer::ok(String::new())
            },
        })
    }
}

fn config(roots: Vec<Vec<u8>>, timeout_ms: i64) -> FetchConfig {
    FetchConfig {
        ca_roots: Some(roots),
        timeout_ms,
        cache_ms: DEFAULT_CACHE_MS,
    }
}

#[test]
fn a_well_behaved_issuer_gives_its_keys() {
    let (_rt, url, roots) = issuer(router_with("{url}/jwks", None, jwks()));
    let keys = fetch_jwks(&url, &config(roots.clone(), 5000)).unwrap();
    assert!(keys.knows(Some("k1")));
    // The configured issuer may end in '/'.
    assert!(fetch_jwks(&format!("{url}/"), &config(roots, 5000)).is_ok());
}

#[test]
fn an_answer_past_the_cap_is_refused() {
    let huge = format!("{{\"keys\":[],\"pad\":\"{}\"}}", "A".repeat(MAX_BODY_TEST));
    let (_rt, url, roots) = issuer(router_with("{url}/jwks", None, huge));
    assert!(matches!(
        fetch_jwks(&url, &config(roots, 5000)),
        Err(FetchError::TooLarge { .. })
    ));
}
const MAX_BODY_TEST: usize = super::super::MAX_JWKS_LEN + 1;

#[test]
fn a_jwks_uri_off_the_issuers_host_or_port_is_refused_unfetched() {
    for uri in [
        "https://localhost:1/jwks",
        "https://127.0.0.2/jwks",
        "http://127.0.0.1/jwks",
        "https://evil.example/jwks",
    ] {
        let (_rt, url, roots) = issuer(router_with(uri, None, jwks()));
        assert!(
            matches!(
                fetch_jwks(&url, &config(roots, 5000)),
                Err(FetchError::OffHost(_))
            ),
            "{uri}"
        );
    }
    // Another issuer's configuration.
    let (_rt, url, roots) = issuer(router_with(
        "{url}/jwks",
        Some("https://other.example"),
        jwks(),
    ));
    assert!(matches!(
        fetch_jwks(&url, &config(roots, 5000)),
        Err(FetchError::IssuerMismatch(_))
    ));
}

#[test]
fn a_redirect_is_not_followed() {
    let (_rt, url, roots) = issuer(|url: String| {
        Arc::new(move |_: &str| Answer {
            status: 302,
            headers: vec![("location", format!("{url}/elsewhere"))],
            ..Answer::ok(String::new())
        })
    });
    assert!(matches!(
        fetch_jwks(&url, &config(roots, 5000)),
        Err(FetchError::Redirect { status: 302, .. })
    ));
}

#[test]
fn an_issuer_that_stalls_is_given_up_on_at_the_timeout() {
    let (_rt, url, roots) = issuer(|_| {
        Arc::new(|_: &str| Answer {
            delay: Duration::from_secs(30),
            ..Answer::ok("{}".to_owned())
        })
    });
    let started = Instant::now();
    let e = fetch_jwks(&url, &config(roots, 300)).unwrap_err();
    assert!(
        matches!(e, FetchError::Timeout(300) | FetchError::Unreachable { .. }),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_cache_refetches_an_unknown_kid_at_most_once_a_minute() {
    let (_rt, url, roots) = issuer(router_with("{url}/jwks", None, jwks()));
    let cfg = config(roots, 5000);
    let provider = crate::attestors::cloud_iid::oidc::OidcProvider {
        name: "wi".into(),
        issuer: url,
        audience: "a".into(),
        keys: crate::attestors::cloud_iid::oidc::KeySource::Fetch(cfg.clone()),
        account_claim: None,
        zone_claim: None,
        instance_claim: "sub".into(),
        max_age_ms: 600_000,
    };
    let cache = JwksCache::default();
    let t0 = Instant::now();
    assert!(matches!(
        cache.lookup("wi", &cfg, Some("k1"), t0),
        Cached::Fetch(Need::Refresh)
    ));
    cache.refresh(&provider, &cfg, Need::Refresh, t0).unwrap();
    assert!(matches!(
        cache.lookup("wi", &cfg, Some("k1"), t0),
        Cached::Keys(_)
    ));
    // An unknown kid within the minute: the cached keys (which refuse it).
    assert!(matches!(
        cache.lookup("wi", &cfg, Some("k9"), t0 + Duration::from_secs(59)),
        Cached::Keys(_)
    ));
    let later = t0 + Duration::from_secs(61);
    assert!(matches!(
        cache.lookup("wi", &cfg, Some("k9"), later),
        Cached::Fetch(Need::UnknownKid)
    ));
    cache
        .refresh(&provider, &cfg, Need::UnknownKid, later)
        .unwrap();
    // Fetched once: another join's refresh within the minute fetches nothing.
    assert!(matches!(
        cache.lookup("wi", &cfg, Some("k9"), later),
        Cached::Keys(_)
    ));
    // Past the cache's lifetime: fetched again.
    let expired = later + Duration::from_millis(DEFAULT_CACHE_MS as u64);
    assert!(matches!(
        cache.lookup("wi", &cfg, Some("k1"), expired),
        Cached::Fetch(Need::Refresh)
    ));
}

#[test]
fn a_failed_fetch_is_not_tried_again_at_once() {
    let cfg = FetchConfig {
        ca_roots: Some(Vec::new()),
        ..FetchConfig::default()
    };
    let provider = crate::attestors::cloud_iid::oidc::OidcProvider {
        name: "down".into(),
        issuer: "https://127.0.0.1:1".into(),
        audience: "a".into(),
        keys: crate::attestors::cloud_iid::oidc::KeySource::Fetch(cfg.clone()),
        account_claim: None,
        zone_claim: None,
        instance_claim: "sub".into(),
        max_age_ms: 600_000,
    };
    let cache = JwksCache::default();
    let t0 = Instant::now();
    assert!(matches!(
        cache.refresh(&provider, &cfg, Need::Refresh, t0),
        Err(FetchError::NoRoots(_))
    ));
    assert_eq!(
        cache.refresh(&provider, &cfg, Need::Refresh, t0 + Duration::from_secs(1)),
        Err(FetchError::RecentlyFailed)
    );
    assert!(matches!(
        cache.refresh(&provider, &cfg, Need::Refresh, t0 + RETRY_AFTER_FAILURE),
        Err(FetchError::NoRoots(_))
    ));
}
