//! The control plane under load: clients that hold connections without
//! finishing a request, and a flood of refused joins. Each test uses the
//! fewest seconds its claim needs.
//!
//! These tests check what the server did and logged, never how fast: on a
//! shared 2-core machine a timing bound is luck. The timing that code
//! decides is proven on tokio's paused clock (the accept loop's pauses in
//! `controlplane/src/api/http.rs`); the figures (a join behind 2,000 slow
//! clients, the p99 of good joins under the flood) are `scripts/bench`'s,
//! which runs this module on the release build with the full 30 s flood and
//! prints the lines marked `bench:`. `scripts/test` runs the module on its
//! own, one test at a time, after the other tests (`load::` stage).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bc_controlplane::pki::Bundle;
use bc_wire::agent::{JoinRequest, Role};
use prost::Message;

use crate::harness::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn listen_addr(cp: &ControlPlane) -> SocketAddr {
    cp.url
        .strip_prefix("https://")
        .and_then(|a| a.parse().ok())
        .expect("the control plane URL is https://IP:PORT")
}

/// Raises this process's soft descriptor limit to its hard one: the tests
/// hold thousands of sockets.
fn raise_own_fd_limit() {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let hard = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .unwrap_or("4096")
        .to_owned();
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &std::process::id().to_string()])
        .arg(format!("--nofile={hard}:{hard}"))
        .status()
        .expect("run prlimit");
    assert!(status.success(), "cannot raise the test's descriptor limit");
}

/// Lines of the server log that say `accept` failed.
fn accept_failures(cp: &ControlPlane) -> usize {
    cp.log()
        .lines()
        .filter(|l| l.contains("accept failed"))
        .count()
}

/// Opens `n` connections from twenty loopback addresses (127.0.0.2 to .21)
/// all at once, half of them with the start of a TLS record, and holds them.
fn slow_clients(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    n: u32,
) -> Vec<tokio::net::TcpStream> {
    rt.block_on(async {
        let mut connecting = tokio::task::JoinSet::new();
        for i in 0..n {
            let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + (i % 20) as u8));
            connecting.spawn(async move {
                let socket = tokio::net::TcpSocket::new_v4().ok()?;
                socket.bind(SocketAddr::new(source, 0)).ok()?;
                let connect = socket.connect(addr);
                let mut tcp = tokio::time::timeout(Duration::from_secs(5), connect)
                    .await
                    .ok()?
                    .ok()?;
                if i % 2 == 0 {
                    // A ClientHello that never comes.
                    use tokio::io::AsyncWriteExt;
                    let _ = tcp.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).await;
                }
                Some(tcp)
            });
        }
        let mut held = Vec::new();
        while let Some(done) = connecting.join_next().await {
            held.extend(done.ok().flatten());
        }
        held
    })
}

/// 2,000 connections that never finish a handshake, from twenty loopback
/// addresses, against a control plane limited to 1,024 descriptors: a good
/// join from 127.0.0.1 still gets through (how fast is `scripts/bench`'s
/// figure), and `accept` never fails in a loop.
#[test]
fn slow_clients_do_not_lock_out_a_good_join() {
    // The server raises its soft limit to the hard one: cap both.
    raise_own_fd_limit();
    let cp = ControlPlane::start_wrapped(&["prlimit", "--nofile=1024:1024", "--"]);
    let token = cp.token("node", &[]);
    let agent = Agent::new(&cp);
    let addr = listen_addr(&cp);
    let rt = runtime();
    // All at once, as an attacker would: the server must not wait for them.
    let held = slow_clients(&rt, addr, 2000);

    let started = Instant::now();
    let out = agent.join_with_token(&token);
    let took = started.elapsed();
    eprintln!(
        "bench: a good join behind {} slow clients (2,000 tried): {} ms",
        held.len(),
        took.as_millis()
    );
    assert_ok(&out);
    // The server kept accepting them past its cap of 768 (closing the
    // oldest idle ones to make room). How many of the 2,000 got in on this
    // host (a busy one's backlog misses some) is the bench line's figure.
    assert!(
        held.len() > 768,
        "only {} slow clients connected",
        held.len()
    );
    drop(held);
    let failures = accept_failures(&cp);
    assert!(failures <= 5, "{failures} accept failures: {}", cp.log());
    // The cap it derived from its 1,024 descriptors, leaving 256 spare.
    let log = cp.log();
    assert!(
        log.contains("max_connections=768") && log.contains("nofile=1024"),
        "the server says what its limits are: {log}"
    );
}

/// A server configured past its descriptor limit runs out of them: its
/// failing `accept` backs off, one log line a pause, each pause double the
/// last up to 1 s (or 10 ms again after a connection got through), and it
/// reaches the cap. How often that calls `accept` (9 times in 3 s, not 30)
/// is measured on tokio's paused clock in the accept loop's unit tests.
#[test]
fn failing_accepts_back_off() {
    raise_own_fd_limit();
    let cp = ControlPlane::init_only();
    cp.write_config("[server]\nmax_connections = 5000\nmax_connections_per_source = 5000\n");
    let mut cp = cp.serve_wrapped(&["prlimit", "--nofile=1024:1024", "--"]);
    let rt = runtime();
    let held = slow_clients(&rt, listen_addr(&cp), 1500);
    // The pauses sum to a second before the cap is logged.
    let capped = cp.wait_for_log("retry_in_ms=1000", 1);
    drop(held);
    assert!(capped.contains("accept failed"), "{capped}");
    let pauses: Vec<u64> = cp
        .log()
        .lines()
        .filter(|l| l.contains("accept failed"))
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("retry_in_ms="))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no retry_in_ms in {l}"))
        })
        .collect();
    assert_eq!(pauses.first(), Some(&10), "{pauses:?}");
    for pair in pauses.windows(2) {
        assert!(
            pair[1] == (pair[0] * 2).min(1000) || pair[1] == 10,
            "each pause doubles the last (or starts over): {pauses:?}"
        );
    }
}

/// A pinned HTTPS client for raw JoinService calls; `reuse` keeps its
/// connections alive between requests.
fn client(bundle: &Bundle, reuse: bool, source: IpAddr) -> reqwest::Client {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(
            bundle.tls_ca_der().to_vec(),
        ))
        .expect("tls ca");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("tls versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut b = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .local_address(source)
        .timeout(Duration::from_secs(30));
    if !reuse {
        b = b.pool_max_idle_per_host(0);
    }
    b.build().expect("client")
}

/// A JoinRequest carrying `token`, sealed to the control plane.
fn join_request(bundle: &Bundle, token: &str) -> Vec<u8> {
    let csr = throwaway_csr();
    let sealed = bc_wire::sealing::SealingKey::from_spki_der(bundle.join_encryption_spki_der())
        .expect("sealing key")
        .seal(&bc_wire::sha256(&csr), token.as_bytes())
        .expect("seal");
    JoinRequest {
        csr,
        role: Role::Node as i32,
        sealed_token: sealed,
        ..Default::default()
    }
    .encode_to_vec()
}

async fn post(client: &reqwest::Client, url: &str, body: Vec<u8>) -> Option<u16> {
    let resp = client
        .post(url)
        .header("content-type", "application/x-protobuf")
        .body(body)
        .send()
        .await
        .ok()?;
    let status = resp.status().as_u16();
    resp.bytes().await.ok()?;
    Some(status)
}

/// How long the flood lasts: 10 s in the suite, `BCD_LOAD_FLOOD_SECS` (30
/// in `scripts/bench`) for the figures.
fn flood_time() -> Duration {
    let secs = std::env::var("BCD_LOAD_FLOOD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    Duration::from_secs(secs)
}
const FLOODERS: usize = 500;
const FLOOD_SOURCE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// 500 clients on one address (127.0.0.2) sending refused joins (a real
/// token id with a wrong secret) for 10 s: the database stays small, the
/// refusal counts add up exactly to the refusals answered, and good joins
/// made meanwhile from another address all get through (their p99 is
/// `scripts/bench`'s figure, over a 30 s flood).
#[test]
fn a_refusal_flood_is_counted_not_stored_row_by_row() {
    raise_own_fd_limit();
    let cp = ControlPlane::start();
    let bundle = Bundle::load(cp.path()).expect("bundle");
    let good = cp.token("node", &["--uses", "100000"]);
    let (id, _) = good.split_once('.').expect("token id");
    let forged = format!("{id}.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    let bad_body = join_request(&bundle, &forged);
    let url = format!("{}{}", cp.url, bc_wire::endpoints::JOIN);
    let rt = runtime();
    let refused = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let flood = flood_time();
    let latencies = rt.block_on(async {
        let mut flooders = Vec::new();
        for _ in 0..FLOODERS {
            let client = client(&bundle, true, FLOOD_SOURCE);
            let (url, body) = (url.clone(), bad_body.clone());
            let (refused, other, stop) = (refused.clone(), other.clone(), stop.clone());
            flooders.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match post(&client, &url, body.clone()).await {
                        Some(403) => refused.fetch_add(1, Ordering::Relaxed),
                        _ => other.fetch_add(1, Ordering::Relaxed),
                    };
                }
            }));
        }
        // Good joins, one after another, each on a new connection as an
        // agent makes them.
        let good_client = client(&bundle, false, IpAddr::V4(Ipv4Addr::LOCALHOST));
        let started = Instant::now();
        let mut latencies = Vec::new();
        while started.elapsed() < flood {
            let body = join_request(&bundle, &good);
            let t = Instant::now();
            let status = post(&good_client, &url, body).await;
            latencies.push(t.elapsed());
            assert_eq!(status, Some(200), "a good join failed under the flood");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        stop.store(true, Ordering::Relaxed);
        for f in flooders {
            f.await.expect("flooder");
        }
        latencies
    });
    let refused = refused.load(Ordering::Relaxed);
    let other = other.load(Ordering::Relaxed);
    let mut sorted = latencies.clone();
    sorted.sort();
    let p99 = sorted[(sorted.len() * 99).div_ceil(100) - 1];

    let events = cp.refusals();
    let counted: u64 = events
        .iter()
        .map(|e| e["data"]["count"].as_u64().unwrap_or(1))
        .sum();
    // The database's own size (pages in use, the WAL's included).
    let db = rusqlite::Connection::open(cp.path().join("controlplane.db")).expect("open db");
    let pages: u64 = db
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .expect("page_count");
    let page_size: u64 = db
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .expect("page_size");
    let size = pages * page_size;
    eprintln!(
        "bench: a {}-s flood of {FLOODERS} clients: {refused} refused ({other} other), {} refusal rows, \
         database {size} bytes; {} good joins meanwhile, p99 {} ms",
        flood.as_secs(),
        events.len(),
        latencies.len(),
        p99.as_millis()
    );
    assert!(refused > 0);
    assert_eq!(other, 0, "every flooding request is answered 403");
    assert_eq!(
        counted, refused,
        "the refusal counts add up to the refusals"
    );
    assert!(
        events.iter().all(|e| e["reason"] == "token-secret"
            && e["tokenId"] == id
            && e["data"]["source"] == "127.0.0.2"),
        "refusals keep their reason, token and source"
    );
    assert!(size < 5 * 1024 * 1024, "the database grew to {size} bytes");
    // Nor the log: the first refusal of a minute is logged, repeats counted.
    let logged = cp.log().matches("join refused").count();
    assert!(logged <= 4, "{logged} refusals logged");
}
