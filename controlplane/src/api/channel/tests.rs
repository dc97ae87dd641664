//! The channel over real TLS and a real WebSocket client (the agent's
//! crate): the upgrade's certificate check, the proof, delivery, acks,
//! replacement.

use std::convert::Infallible;
use std::sync::Arc;

use bc_wire::agent::Role;
use bc_wire::command::channel::{encode_agent_frame, parse_server_frame, sign_proof};
use bc_wire::command::{new_result, sign_result, Output, Times};
use bc_wire::command_v1::{agent_frame, server_frame, ChannelHello, Status};
use futures_util::{SinkExt, StreamExt};
use p256::ecdsa::signature::Signer;
use p256::pkcs8::DecodePrivateKey;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::plane::commands::CommandService;
use crate::test_support::{self, Cp};

type Client =
    tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

fn tls_client(cp: &Cp, identity: Option<(&[u8], &rcgen::KeyPair)>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(cp.svc.bundle().tls_ca_der().to_vec()))
        .unwrap();
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut cfg = match identity {
        None => b.with_no_client_auth(),
        Some((cert, key)) => b
            .with_client_auth_cert(
                vec![CertificateDer::from(cert.to_vec())],
                PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

async fn dial(
    addr: std::net::SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> Result<Client, tungstenite::Error> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let url = format!("wss://localhost{}", bc_wire::endpoints::COMMAND_CHANNEL);
    tokio_tungstenite::client_async(url, tls)
        .await
        .map(|(ws, _)| ws)
}

async fn next_frame(ws: &mut Client) -> Option<server_frame::Frame> {
    loop {
        match ws.next().await? {
            Ok(Message::Binary(b)) => return Some(parse_server_frame(&b).unwrap()),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

fn signer(key: &rcgen::KeyPair) -> p256::ecdsa::SigningKey {
    p256::ecdsa::SigningKey::from_pkcs8_der(&key.serialize_der()).unwrap()
}

fn sign_with(
    sk: &p256::ecdsa::SigningKey,
) -> impl FnOnce(&[u8]) -> Result<[u8; 64], Infallible> + '_ {
    move |input| {
        let sig: p256::ecdsa::Signature = sk.sign(input);
        Ok(sig.to_bytes().into())
    }
}

/// Reads the hello and answers a proof signed by `key` for `node_id`.
async fn prove(ws: &mut Client, node_id: &str, key: &rcgen::KeyPair, now_ms: i64) {
    let Some(server_frame::Frame::Hello(hello)) = next_frame(ws).await else {
        panic!("no hello");
    };
    let hello: ChannelHello = hello;
    let sk = signer(key);
    let proof = sign_proof(
        &hello,
        node_id,
        now_ms as u64,
        String::new(),
        sign_with(&sk),
    )
    .unwrap();
    ws.send(Message::Binary(
        encode_agent_frame(agent_frame::Frame::Proof(proof)).into(),
    ))
    .await
    .unwrap();
}

#[test]
fn the_channel_over_tls() {
    let cp = test_support::cp();
    let (body, key) = cp.token_join(Role::Node, None);
    let node_id = body.node_id.clone();
    let leaf = body.chain[0].clone();
    let svc = cp.svc.clone();
    let tls = crate::api::http::tls_config(svc.bundle(), svc.database()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = crate::api::http::router(svc.clone());
        tokio::spawn(crate::api::http::serve(
            listener,
            tls,
            app,
            std::future::pending(),
        ));

        // No client certificate, or one the control plane never issued: 403.
        match dial(addr, tls_client(&cp, None)).await {
            Err(tungstenite::Error::Http(r)) => assert_eq!(r.status(), 403),
            other => panic!("{:?}", other.map(|_| ())),
        }
        let stranger = test_support::key();
        let unknown = cp.issue(&node_id, &stranger, &[], 1, false);
        match dial(addr, tls_client(&cp, Some((&unknown, &stranger)))).await {
            Err(tungstenite::Error::Http(r)) => assert_eq!(r.status(), 403),
            other => panic!("{:?}", other.map(|_| ())),
        }

        let mtls = tls_client(&cp, Some((&leaf, &key)));
        let now = cp.now();
        // A proof by another key: closed, nothing delivered.
        let mut ws = dial(addr, mtls.clone()).await.unwrap();
        prove(&mut ws, &node_id, &stranger, now).await;
        assert!(next_frame(&mut ws).await.is_none(), "closed");
        // A text frame instead of a proof: closed.
        let mut ws = dial(addr, mtls.clone()).await.unwrap();
        assert!(matches!(
            next_frame(&mut ws).await,
            Some(server_frame::Frame::Hello(_))
        ));
        ws.send(Message::Text("hello".into())).await.unwrap();
        assert!(next_frame(&mut ws).await.is_none(), "closed");

        // Proven: a command queued now is delivered; its result acked.
        let mut ws = dial(addr, mtls.clone()).await.unwrap();
        prove(&mut ws, &node_id, &key, now).await;
        let svc2 = svc.clone();
        let n2 = node_id.clone();
        let row = tokio::task::spawn_blocking(move || {
            CommandService::new(&svc2).queue(&n2, "diag.ping", vec![], 60_000)
        })
        .await
        .unwrap()
        .unwrap();
        let Some(server_frame::Frame::Command(cmd)) = next_frame(&mut ws).await else {
            panic!("no command");
        };
        assert_eq!(prost::Message::encode_to_vec(&cmd), row.signed);
        let result = new_result(
            &row.id,
            &node_id,
            "diag.ping",
            Status::Ok,
            "pong",
            Output::new(),
            Times {
                started_ms: now,
                finished_ms: now,
            },
        );
        let sk = signer(&key);
        let signed = sign_result(&result, String::new(), sign_with(&sk)).unwrap();
        ws.send(Message::Binary(
            encode_agent_frame(agent_frame::Frame::Result(signed)).into(),
        ))
        .await
        .unwrap();
        let Some(server_frame::Frame::Ack(ack)) = next_frame(&mut ws).await else {
            panic!("no ack");
        };
        assert_eq!(ack.id, row.id);

        // A second proven channel of the node replaces the first.
        let mut second = dial(addr, mtls).await.unwrap();
        prove(&mut second, &node_id, &key, now).await;
        assert!(next_frame(&mut ws).await.is_none(), "the first is closed");
    });
    let stored = CommandService::new(&cp.svc).list(None, None).unwrap();
    assert_eq!(stored[0].state, "ok");
}

#[test]
fn an_address_that_keeps_failing_is_refused_and_an_open_channel_is_untouched() {
    let cp = test_support::cp();
    let (body, key) = cp.token_join(Role::Node, None);
    let node_id = body.node_id.clone();
    let leaf = body.chain[0].clone();
    let svc = cp.svc.clone();
    let tls = crate::api::http::tls_config(svc.bundle(), svc.database()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = crate::api::http::router(svc.clone());
        tokio::spawn(crate::api::http::serve(
            listener,
            tls,
            app,
            std::future::pending(),
        ));
        let now = cp.now();
        let mut open = dial(addr, tls_client(&cp, Some((&leaf, &key))))
            .await
            .unwrap();
        prove(&mut open, &node_id, &key, now).await;
        // An upgrade of the same node that never proves itself holds no
        // channel: the proven one is not replaced (it gets the command below).
        let mut unproven = dial(addr, tls_client(&cp, Some((&leaf, &key))))
            .await
            .unwrap();
        assert!(matches!(
            next_frame(&mut unproven).await,
            Some(server_frame::Frame::Hello(_))
        ));

        // Refused upgrades (no client certificate) up to the limit: 403
        // (the unproven upgrade's timeout may count as one of them).
        let mut refused = 0;
        for _ in 0..super::flood::LIMIT {
            match dial(addr, tls_client(&cp, None)).await {
                Err(tungstenite::Error::Http(r)) if r.status() == 403 => refused += 1,
                Err(tungstenite::Error::Http(r)) if r.status() == 429 => break,
                other => panic!("{:?}", other.map(|_| ())),
            }
        }
        assert!(refused >= super::flood::LIMIT - 1, "{refused}");
        // Then the address is refused with its reason, even with a good
        // certificate, and holds nothing.
        match dial(addr, tls_client(&cp, Some((&leaf, &key)))).await {
            Err(tungstenite::Error::Http(r)) => {
                assert_eq!(r.status(), 429);
                let body =
                    String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned();
                assert_eq!(body, super::flood::REASON);
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        // The channel open before is still the node's and still delivers.
        let svc2 = svc.clone();
        let n2 = node_id.clone();
        let row = tokio::task::spawn_blocking(move || {
            CommandService::new(&svc2).queue(&n2, "diag.ping", vec![], 60_000)
        })
        .await
        .unwrap()
        .unwrap();
        let Some(server_frame::Frame::Command(cmd)) = next_frame(&mut open).await else {
            panic!("no command");
        };
        assert_eq!(prost::Message::encode_to_vec(&cmd), row.signed);
        drop(unproven);
    });
}

/// A result the database cannot store (here: another writer holds SQLite's
/// lock past the busy timeout, as a thousand results racing for it did in
/// bench-cp's channel flow) is not acked, and the channel is closed, so
/// that the agent sends it again on its next channel, where it is stored.
/// Before, the channel stayed open and the result was never stored.
#[test]
fn a_result_that_cannot_be_stored_closes_the_channel_and_is_stored_when_sent_again() {
    let cp = test_support::cp();
    let (body, key) = cp.token_join(Role::Node, None);
    let node_id = body.node_id.clone();
    let leaf = body.chain[0].clone();
    let svc = cp.svc.clone();
    let tls = crate::api::http::tls_config(svc.bundle(), svc.database()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = crate::api::http::router(svc.clone());
        tokio::spawn(crate::api::http::serve(
            listener,
            tls,
            app,
            std::future::pending(),
        ));
        let mtls = tls_client(&cp, Some((&leaf, &key)));
        let now = cp.now();
        let mut ws = dial(addr, mtls.clone()).await.unwrap();
        prove(&mut ws, &node_id, &key, now).await;
        let svc2 = svc.clone();
        let n2 = node_id.clone();
        let row = tokio::task::spawn_blocking(move || {
            CommandService::new(&svc2).queue(&n2, "diag.ping", vec![], 120_000)
        })
        .await
        .unwrap()
        .unwrap();
        let Some(server_frame::Frame::Command(_)) = next_frame(&mut ws).await else {
            panic!("no command");
        };
        let result = new_result(
            &row.id,
            &node_id,
            "diag.ping",
            Status::Ok,
            "pong",
            Output::new(),
            Times {
                started_ms: now,
                finished_ms: now,
            },
        );
        let sk = signer(&key);
        let signed = sign_result(&result, String::new(), sign_with(&sk)).unwrap();
        let frame = encode_agent_frame(agent_frame::Frame::Result(signed));

        // Another writer holds the lock until told.
        let (held_tx, held) = std::sync::mpsc::channel::<()>();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let svc3 = svc.clone();
        let holder = std::thread::spawn(move || {
            svc3.database().write(|_tx| {
                let _ = held_tx.send(());
                let _ = release_rx.recv();
                Ok::<_, crate::store::DbError>(())
            })
        });
        held.recv().unwrap();
        ws.send(Message::Binary(frame.clone().into()))
            .await
            .unwrap();
        let closed = tokio::time::timeout(std::time::Duration::from_secs(30), next_frame(&mut ws))
            .await
            .expect("the channel is closed once the result cannot be stored");
        assert!(closed.is_none(), "not acked: {closed:?}");
        release.send(()).unwrap();
        holder.join().unwrap().unwrap();

        // The agent's next channel: the command again, the result again,
        // stored and acked.
        let mut ws = dial(addr, mtls).await.unwrap();
        prove(&mut ws, &node_id, &key, now).await;
        let Some(server_frame::Frame::Command(again)) = next_frame(&mut ws).await else {
            panic!("the command is delivered again");
        };
        assert_eq!(prost::Message::encode_to_vec(&again), row.signed);
        ws.send(Message::Binary(frame.into())).await.unwrap();
        let Some(server_frame::Frame::Ack(ack)) = next_frame(&mut ws).await else {
            panic!("no ack");
        };
        assert_eq!(ack.id, row.id);
    });
    let stored = CommandService::new(&cp.svc).get(&row_id_of(&cp)).unwrap();
    assert_eq!(stored.map(|r| r.state), Some("ok".to_owned()));
}

/// The one command queued in `cp`.
fn row_id_of(cp: &Cp) -> String {
    let rows = CommandService::new(&cp.svc).list(None, None).unwrap();
    assert_eq!(rows.len(), 1);
    rows[0].id.clone()
}

/// `scripts/bench-cp`'s channel figure (ignored; run with `--ignored`):
/// `BENCHCP_CHANNELS` (1,000) nodes token-joined through the control
/// plane's own join, a `BENCHCP_SERVE` (`bc-controlplane`) `serve` process on
/// its directory (SQLite), and a load client speaking the real channel
/// (TLS with each node's certificate, the proof, verified commands, signed
/// results). Prints the serve's peak RSS with every channel open, and the
/// time from queueing one diag.ping per node until every result is stored.
#[test]
#[ignore]
fn channel_load() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;
    let n: usize = std::env::var("BENCHCP_CHANNELS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let serve_bin = std::env::var("BENCHCP_SERVE").expect("BENCHCP_SERVE: a bc-controlplane");
    let cp = test_support::cp();
    let t = Instant::now();
    let nodes: Vec<(String, Vec<u8>, rcgen::KeyPair)> = (0..n)
        .map(|_| {
            let (body, key) = cp.token_join(Role::Node, None);
            (body.node_id.clone(), body.chain[0].clone(), key)
        })
        .collect();
    eprintln!("joined {n} nodes in {:.1} s", t.elapsed().as_secs_f64());
    let ids: Vec<String> = nodes.iter().map(|(id, _, _)| id.clone()).collect();

    /// The serve, killed however the test ends (a failed assertion left
    /// it running before).
    struct Serve(std::process::Child);
    impl Drop for Serve {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut serve = std::process::Command::new(&serve_bin)
        .args(["serve", "--dir"])
        .arg(cp.path())
        .args(["--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(cp.path().join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    let stdout = serve.stdout.take().unwrap();
    let serve = Serve(serve);
    let pid = serve.0.id();
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut first).unwrap();
    let url = first.trim().trim_start_matches("listening on ").to_owned();
    let addr: std::net::SocketAddr = url
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let hwm = || {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .map(|v| v.trim().to_owned())
            .unwrap_or_default()
    };
    eprintln!("serve {pid} on {addr}, VmHWM before channels: {}", hwm());

    let key = *cp.svc.signing_key().verifying_key();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let proven = Arc::new(AtomicUsize::new(0));
    let acked = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    rt.block_on(async {
        let t = Instant::now();
        for (node_id, leaf, nkey) in nodes {
            let cfg = tls_client(&cp, Some((&leaf, &nkey)));
            let (proven, acked, gate) = (proven.clone(), acked.clone(), gate.clone());
            let now = cp.now();
            tokio::spawn(async move {
                let permit = gate.acquire_owned().await.unwrap();
                let mut ws = dial(addr, cfg).await.unwrap();
                prove(&mut ws, &node_id, &nkey, now).await;
                drop(permit);
                proven.fetch_add(1, Ordering::SeqCst);
                let scope = bc_wire::command::Scope::from_statements(&["urn:bc:scope:node"]).unwrap();
                let sk = signer(&nkey);
                while let Some(frame) = next_frame(&mut ws).await {
                    match frame {
                        server_frame::Frame::Command(cmd) => {
                            let now = std::time::SystemTime::now()
                                .duration_since(std::time::UNIX_EPOCH)
                                .unwrap()
                                .as_millis() as i64;
                            let v = bc_wire::command::verify(
                                &cmd,
                                &bc_wire::command::Expect {
                                    signing_key: &key,
                                    node_id: &node_id,
                                    scope: &scope,
                                    now_ms: now,
                                },
                            )
                            .unwrap();
                            let result = new_result(
                                v.id(),
                                &node_id,
                                "diag.ping",
                                Status::Ok,
                                "pong",
                                Output::new(),
                                Times {
                                    started_ms: now,
                                    finished_ms: now,
                                },
                            );
                            let signed =
                                sign_result(&result, String::new(), sign_with(&sk)).unwrap();
                            ws.send(Message::Binary(
                                encode_agent_frame(agent_frame::Frame::Result(signed)).into(),
                            ))
                            .await
                            .unwrap();
                        }
                        server_frame::Frame::Ack(_) => {
                            acked.fetch_add(1, Ordering::SeqCst);
                        }
                        _ => {}
                    }
                }
            });
        }
        while proven.load(Ordering::SeqCst) < n {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            assert!(
                t.elapsed().as_secs() < 300,
                "{} of {n} channels proven in 300 s",
                proven.load(Ordering::SeqCst)
            );
        }
        eprintln!("{n} channels proven in {:.1} s", t.elapsed().as_secs_f64());
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        // The serve's CPU (user + system ticks) over 10 s of idle channels.
        let ticks = || {
            let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            let after = &s[s.rfind(')').unwrap() + 2..];
            let f: Vec<&str> = after.split_whitespace().collect();
            f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
        };
        let before = ticks();
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        let idle_cpu = (ticks() - before) as f64 / 10.0; // % of a core at 100 Hz
        println!(
            "BENCH channels={n} serve_vmhwm_idle=\"{}\" serve_idle_cpu_pct={idle_cpu:.1}",
            hwm()
        );

        let t = Instant::now();
        let svc = cp.svc.clone();
        let svc2 = svc.clone();
        let queued = tokio::task::spawn_blocking(move || {
            for id in &ids {
                CommandService::new(&svc2)
                    .queue(id, "diag.ping", vec![], 300_000)
                    .unwrap();
            }
            ids.len()
        })
        .await
        .unwrap();
        let queue_s = t.elapsed().as_secs_f64();
        eprintln!("queued {queued} in {queue_s:.1} s");
        let mut last = Instant::now();
        while acked.load(Ordering::SeqCst) < queued {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            if last.elapsed().as_secs() >= 5 {
                last = Instant::now();
                eprintln!("{} acked after {:.1} s", acked.load(Ordering::SeqCst), t.elapsed().as_secs_f64());
            }
            if t.elapsed().as_secs() > 120 {
                let log = std::fs::read_to_string(cp.path().join("serve.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                panic!("not all results within 120 s; serve.log's end:\n{}", tail.join("\n"));
            }
        }
        let all_s = t.elapsed().as_secs_f64();
        let ok = CommandService::new(&svc)
            .list(None, Some("ok"))
            .unwrap()
            .len();
        println!(
            "BENCH channels={n} queue_s={queue_s:.2} all_results_stored_s={all_s:.2} stored_ok={ok} serve_vmhwm=\"{}\"",
            hwm()
        );
    });
    drop(serve);
}
