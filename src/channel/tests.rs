//! The channel against an in-process WebSocket peer that speaks the
//! frames as the control plane does (plain TCP: the TLS is renewal's,
//! tested there), and the runner on its own.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bc_wire::command::channel::{
    encode_server_frame, parse_agent_frame, verify_proof, ProofExpect, NONCE_LEN,
};
use bc_wire::command::{new_command, verify_result, RunnableCommand};
use bc_wire::command_v1::{ChannelHello, Command, ResultAck};
use bc_wire::endpoints::COMMAND_CHANNEL;
use p256::ecdsa::{Signature, SigningKey};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;

use super::*;
use crate::commands::Done;
use crate::keys::FileKey;

const NODE: &str = "node_abc";

fn cp_key() -> SigningKey {
    SigningKey::from_slice(&[0x42; 32]).unwrap()
}

fn sign_as(key: &SigningKey, c: &Command) -> SignedCommand {
    command::sign(c, "cp".into(), |m| {
        let s: Signature = p256::ecdsa::signature::Signer::sign(key, m);
        Ok::<_, ()>(s.to_bytes().into())
    })
    .unwrap()
}

fn in_a_minute() -> i64 {
    now_ms() + 60_000
}

/// A node identity whose certificate states `scope`.
fn identity(scope: &str) -> Identity {
    let key = FileKey::generate().unwrap();
    let chain = crate::pki::tests::issue(
        key.spki_der(),
        &[&format!("spiffe://bc.test/node/{NODE}"), scope],
        24,
    );
    let cert = crate::pki::check_chain(&chain).unwrap();
    Identity {
        node_id: NODE.to_owned(),
        role: Role::Node,
        trust_domain: "bc.test".to_owned(),
        attestor: "join-token".to_owned(),
        joined_at: cert.not_before,
        chain,
        cert,
        key: Arc::new(key),
    }
}

fn machine(dir: &Path) -> Machine {
    Machine {
        sysfs: dir.join("sys"),
        procfs: dir.join("proc"),
        devfs: dir.join("dev"),
        role: Role::Node,
        data_dir: dir.to_owned(),
        config_path: dir.join("config.toml"),
        tpm: Arc::new(TpmAccess::none()),
        api: None,
    }
}

fn work(dir: &Path, runner: Runner) -> Work {
    Work::new(dir, *cp_key().verifying_key(), machine(dir), runner).unwrap()
}

/// The kinds' real code, counting runs.
fn counting(runs: Arc<AtomicUsize>) -> Runner {
    Runner::with(
        move |c: &RunnableCommand, m: &Machine| {
            runs.fetch_add(1, Ordering::SeqCst);
            crate::commands::run(c, m)
        },
        None,
    )
}

struct PlainDial(SocketAddr);

impl Dial for PlainDial {
    async fn dial(&self, _: &ChannelIdentity) -> Result<Ws, String> {
        let tcp = TcpStream::connect(self.0)
            .await
            .map_err(|e| e.to_string())?;
        dial::upgrade(&format!("ws://{}{COMMAND_CHANNEL}", self.0), Box::new(tcp)).await
    }
}

/// The control plane's end of one connection, proven.
struct Peer {
    ws: WebSocketStream<TcpStream>,
    spki: Vec<u8>,
}

const WAIT: Duration = Duration::from_secs(10);

impl Peer {
    async fn accept(listener: &TcpListener, spki: &[u8]) -> Peer {
        let (tcp, _) = tokio::time::timeout(WAIT, listener.accept())
            .await
            .expect("the agent connects")
            .unwrap();
        let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
        let nonce = [7u8; NONCE_LEN];
        let hello = server_frame::Frame::Hello(ChannelHello {
            nonce: nonce.to_vec(),
            server_time_unix_ms: now_ms(),
        });
        ws.send(Message::binary(encode_server_frame(hello)))
            .await
            .unwrap();
        let mut peer = Peer {
            ws,
            spki: spki.to_vec(),
        };
        let agent_frame::Frame::Proof(proof) = peer.next().await else {
            panic!("the agent's first frame is its proof");
        };
        let expect = ProofExpect {
            nonce: &nonce,
            node_id: NODE,
            node_spki: spki,
            now_ms: now_ms(),
        };
        verify_proof(&proof, &expect).unwrap();
        peer
    }

    async fn next(&mut self) -> agent_frame::Frame {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a frame from the agent")
                .unwrap()
                .unwrap();
            if let Message::Binary(b) = msg {
                return parse_agent_frame(&b).unwrap();
            }
        }
    }

    /// The next result, its signature checked with the node key.
    async fn result(&mut self) -> CommandResult {
        let agent_frame::Frame::Result(signed) = self.next().await else {
            panic!("a result");
        };
        verify_result(&signed, &self.spki, NODE).unwrap()
    }

    async fn send(&mut self, frame: server_frame::Frame) {
        self.ws
            .send(Message::binary(encode_server_frame(frame)))
            .await
            .unwrap();
    }

    async fn command(&mut self, signed: SignedCommand) {
        self.send(server_frame::Frame::Command(signed)).await;
    }

    async fn ack(&mut self, id: &str) {
        self.send(server_frame::Frame::Ack(ResultAck { id: id.into() }))
            .await;
    }

    /// Nothing arrives for a while.
    async fn silent(&mut self) {
        let got = tokio::time::timeout(Duration::from_millis(300), self.ws.next()).await;
        assert!(got.is_err(), "unexpected {got:?}");
    }
}

/// A command runs once, its signed result comes back, is sent again on
/// redelivery and on the next connection until acked, and not after.
#[tokio::test]
async fn a_command_runs_once_and_its_result_waits_for_the_ack() {
    let dir = tempfile::tempdir().unwrap();
    let id = identity("urn:bc:scope:node");
    let spki = id.key.spki_der().to_vec();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (handle, mut link) = Link::new(PlainDial(listener.local_addr().unwrap()), &id);
    link.respread = Duration::from_millis(500);
    let agent = tokio::spawn(serve(link, work(dir.path(), counting(runs.clone()))));

    let mut peer = Peer::accept(&listener, &spki).await;
    let ping = new_command(
        "cmd_ping1",
        NODE,
        "diag.ping",
        [("echo".to_owned(), "hello".to_owned())],
        in_a_minute(),
    );
    let signed = sign_as(&cp_key(), &ping);
    peer.command(signed.clone()).await;
    let r = peer.result().await;
    assert_eq!((r.id.as_str(), r.status), ("cmd_ping1", Status::Ok as i32));
    let out: serde_json::Value = serde_json::from_slice(&r.output).unwrap();
    assert_eq!(out["echo"], "hello");
    // Redelivered (at least once): not run again, its result sent again.
    peer.command(signed.clone()).await;
    assert_eq!(peer.result().await, r);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    drop(peer);

    // The next connection sends it again: never acked.
    let mut peer = Peer::accept(&listener, &spki).await;
    assert_eq!(peer.result().await, r);
    peer.ack("cmd_ping1").await;
    peer.silent().await;
    drop(peer);

    let mut peer = Peer::accept(&listener, &spki).await;
    peer.silent().await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A renewal reconnects at once, with the new certificate.
    let renewed = identity("urn:bc:scope:node");
    handle.renewed(&renewed);
    let closed = tokio::time::timeout(WAIT, peer.ws.next()).await.unwrap();
    assert!(
        matches!(closed, None | Some(Ok(Message::Close(_))) | Some(Err(_))),
        "{closed:?}"
    );
    let _peer = Peer::accept(&listener, renewed.key.spki_der()).await;
    drop(handle);
    tokio::time::timeout(WAIT, agent)
        .await
        .expect("the channel stops with the renewal loop")
        .unwrap();
}

/// Forged, other-node, expired, out-of-scope and unknown commands run
/// nothing; each is reported under the id it claimed, signed by the node
/// key; one without a readable id is only logged.
#[tokio::test]
async fn refused_commands_run_nothing_and_are_reported_signed() {
    let dir = tempfile::tempdir().unwrap();
    let id = identity("urn:bc:scope:node");
    let spki = id.key.spki_der().to_vec();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (_handle, link) = Link::new(PlainDial(listener.local_addr().unwrap()), &id);
    tokio::spawn(serve(link, work(dir.path(), counting(runs.clone()))));
    let mut peer = Peer::accept(&listener, &spki).await;

    let other_key = SigningKey::from_slice(&[0x43; 32]).unwrap();
    let cases = [
        (
            sign_as(
                &other_key,
                &new_command("cmd_forged", NODE, "diag.ping", [], in_a_minute()),
            ),
            Status::Refused,
            "forged",
        ),
        (
            sign_as(
                &cp_key(),
                &new_command("cmd_other", "node_xyz", "diag.ping", [], in_a_minute()),
            ),
            Status::Refused,
            "other-node",
        ),
        (
            sign_as(
                &cp_key(),
                &new_command("cmd_late", NODE, "diag.ping", [], now_ms() - 1_000),
            ),
            Status::Expired,
            "expired",
        ),
        (
            sign_as(
                &cp_key(),
                &new_command(
                    "cmd_wipe",
                    NODE,
                    "disk.wipe",
                    [("devices".to_owned(), "/dev/vda".to_owned())],
                    in_a_minute(),
                ),
            ),
            Status::Refused,
            "kind-not-allowed",
        ),
        (
            sign_as(
                &cp_key(),
                &new_command("cmd_what", NODE, "rm.rf", [], in_a_minute()),
            ),
            Status::Refused,
            "unknown-kind",
        ),
    ];
    for (signed, status, reason) in cases {
        peer.command(signed).await;
        let r = peer.result().await;
        assert_eq!(r.status, status as i32, "{reason}: {r:?}");
        assert!(r.outcome.starts_with(reason), "{reason}: {}", r.outcome);
    }
    // No readable id: nothing to report under.
    peer.command(SignedCommand {
        command: b"garbage".to_vec(),
        signature: vec![],
        key_id: String::new(),
    })
    .await;
    peer.silent().await;
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    // The refused ids were not journaled as seen: the real command runs.
    peer.command(sign_as(
        &cp_key(),
        &new_command("cmd_forged", NODE, "diag.ping", [], in_a_minute()),
    ))
    .await;
    assert_eq!(peer.result().await.status, Status::Ok as i32);
    // A forged copy of a command this node knows is only logged: its
    // refusal is not stored over what the real one did.
    peer.command(sign_as(
        &other_key,
        &new_command("cmd_forged", NODE, "diag.ping", [], in_a_minute()),
    ))
    .await;
    peer.silent().await;
}

/// A certificate without a scope statement runs nothing.
#[tokio::test]
async fn a_certificate_without_a_scope_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let id = identity("urn:bc:something:else");
    let spki = id.key.spki_der().to_vec();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (_handle, link) = Link::new(PlainDial(listener.local_addr().unwrap()), &id);
    tokio::spawn(serve(link, work(dir.path(), counting(runs.clone()))));
    let mut peer = Peer::accept(&listener, &spki).await;
    peer.command(sign_as(
        &cp_key(),
        &new_command("cmd_p", NODE, "diag.ping", [], in_a_minute()),
    ))
    .await;
    let r = peer.result().await;
    assert_eq!(r.status, Status::Refused as i32);
    assert!(r.outcome.starts_with("kind-not-allowed"), "{}", r.outcome);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Verified and accepted commands for the runner tests.
fn accepted(work: &mut Work, n: usize) -> Vec<RunnableCommand> {
    let scope = Scope::from_statements(&["urn:bc:scope:node"]).unwrap();
    let key = *cp_key().verifying_key();
    (0..n)
        .map(|i| {
            let c = new_command(&format!("cmd_{i}"), NODE, "diag.ping", [], in_a_minute());
            let expect = Expect {
                signing_key: &key,
                node_id: NODE,
                scope: &scope,
                now_ms: now_ms(),
            };
            command::verify(&sign_as(&cp_key(), &c), &expect)
                .unwrap()
                .accept(&mut work.journal)
                .unwrap()
        })
        .collect()
}

/// On the agent's current-thread runtime tasks first run in the order
/// they were spawned, so they queue for a slot in arrival order.
#[tokio::test]
async fn at_most_max_running_at_once_in_arrival_order() {
    let dir = tempfile::tempdir().unwrap();
    let now = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(Mutex::new(Vec::new()));
    let (n, m, o) = (now.clone(), most.clone(), order.clone());
    let runner = Runner::with(
        move |c: &RunnableCommand, _: &Machine| {
            o.lock().unwrap().push(c.id().to_owned());
            let running = n.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(running, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(200));
            n.fetch_sub(1, Ordering::SeqCst);
            Done::failed("done")
        },
        None,
    );
    let mut w = work(dir.path(), runner.clone());
    let commands = accepted(&mut w, MAX_RUNNING + 3);
    for c in commands {
        run::start(
            c,
            w.slots.clone(),
            w.machine.clone(),
            runner.clone(),
            w.done_tx.clone(),
        );
    }
    for _ in 0..MAX_RUNNING + 3 {
        let r = tokio::time::timeout(WAIT, w.done_rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(r.outcome, "done");
    }
    assert_eq!(most.load(Ordering::SeqCst), MAX_RUNNING);
    // The first four ran first; the others waited for a slot.
    let mut order = order.lock().unwrap().clone();
    order[..MAX_RUNNING].sort();
    order[MAX_RUNNING..].sort();
    let want: Vec<String> = (0..MAX_RUNNING + 3).map(|i| format!("cmd_{i}")).collect();
    assert_eq!(order, want);
}

#[tokio::test]
async fn a_command_past_its_deadline_fails_and_frees_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let runner = Runner::with(
        |c: &RunnableCommand, _: &Machine| {
            if c.id() == "cmd_0" {
                std::thread::sleep(Duration::from_secs(2));
            }
            Done::failed("finished")
        },
        Some(Duration::from_millis(100)),
    );
    let mut w = work(dir.path(), runner.clone());
    for c in accepted(&mut w, 2) {
        run::start(
            c,
            w.slots.clone(),
            w.machine.clone(),
            runner.clone(),
            w.done_tx.clone(),
        );
    }
    let mut results = Vec::new();
    for _ in 0..2 {
        results.push(
            tokio::time::timeout(Duration::from_secs(1), w.done_rx.recv())
                .await
                .expect("within the deadline, not the 2 s the code takes")
                .unwrap(),
        );
    }
    results.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(results[0].status, Status::Failed as i32);
    assert!(
        results[0].outcome.starts_with("deadline: diag.ping"),
        "{}",
        results[0].outcome
    );
    assert_eq!(results[1].outcome, "finished");
    // Stored, it is what the next connection sends.
    for r in &results {
        w.store(r);
    }
    assert_eq!(w.journal.unacked().unwrap().len(), 2);
}

#[tokio::test]
async fn commands_cut_off_by_a_stop_are_reported_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = work(dir.path(), Runner::kinds());
    let _ = accepted(&mut w, 1);
    drop(w);
    let mut w = work(dir.path(), Runner::kinds());
    w.report_interrupted(NODE);
    let pending = w.journal.unacked().unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].status, Status::Failed as i32);
    assert!(pending[0].outcome.starts_with("interrupted"));
    w.report_interrupted(NODE);
    assert_eq!(w.journal.unacked().unwrap().len(), 1, "reported once");
}

#[test]
fn jitter_stays_within_its_cap() {
    for _ in 0..100 {
        assert!(full_jitter(Duration::from_secs(1)) <= Duration::from_secs(1));
    }
    assert_eq!(full_jitter(Duration::ZERO), Duration::ZERO);
    let spread: std::collections::BTreeSet<_> = (0..20)
        .map(|_| full_jitter(Duration::from_secs(300)))
        .collect();
    assert!(spread.len() > 15, "spread over the wait");
}

/// The real dial: TCP, the pinned TLS with the node certificate as client
/// certificate (the server sees the node's leaf), ALPN http/1.1, and the
/// upgrade at the channel's path, against an in-process TLS server.
#[tokio::test]
async fn the_dial_presents_the_node_certificate_under_the_pinned_ca() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let server_key = KeyPair::generate().unwrap();
    let mut server = CertificateParams::new(Vec::<String>::new()).unwrap();
    server.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
    let server_cert = server.signed_by(&server_key, &issuer).unwrap();

    let id = identity("urn:bc:scope:node");
    let mut node_roots = rustls::RootCertStore::empty();
    node_roots
        .add(CertificateDer::from(id.chain[1].clone()))
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(node_roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![server_cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        )
        .unwrap();
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let mut parts =
        crate::config::tests::Parts::new(&format!("https://{addr}"), dir.path().to_str().unwrap());
    parts.server_ca = ca_cert.pem();
    let config = Config::parse(Path::new("c.toml"), &parts.render()).unwrap();
    let dial = TlsDial::new(&config).unwrap();

    let leaf = id.chain[0].clone();
    let spki = id.key.spki_der().to_vec();
    let served = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let stream = acceptor.accept(tcp).await.unwrap();
        let (_, conn) = stream.get_ref();
        assert_eq!(conn.alpn_protocol(), Some(&b"http/1.1"[..]));
        let presented = conn.peer_certificates().unwrap()[0].to_vec();
        assert_eq!(presented, leaf, "the node certificate");
        let path = Arc::new(Mutex::new(String::new()));
        let mut ws = tokio_tungstenite::accept_hdr_async(stream, PathOf(path.clone()))
            .await
            .unwrap();
        assert_eq!(*path.lock().unwrap(), COMMAND_CHANNEL);
        let nonce = [9u8; NONCE_LEN];
        let hello = server_frame::Frame::Hello(ChannelHello {
            nonce: nonce.to_vec(),
            server_time_unix_ms: now_ms(),
        });
        ws.send(Message::binary(encode_server_frame(hello)))
            .await
            .unwrap();
        let Some(Ok(Message::Binary(b))) = ws.next().await else {
            panic!("a proof");
        };
        let agent_frame::Frame::Proof(proof) = parse_agent_frame(&b).unwrap() else {
            panic!("a proof");
        };
        let expect = ProofExpect {
            nonce: &nonce,
            node_id: NODE,
            node_spki: &spki,
            now_ms: now_ms(),
        };
        verify_proof(&proof, &expect).unwrap();
    });

    let me = ChannelIdentity::of(&id);
    let mut ws = dial.dial(&me).await.unwrap();
    let (_tx, mut renewed) = watch::channel(me.clone());
    let mut w = work(dir.path(), Runner::kinds());
    let session = w.session(&mut ws, &me, &mut renewed);
    let end = tokio::time::timeout(WAIT, session).await.unwrap();
    assert!(matches!(end, End::Lost { .. }), "the server closed");
    served.await.unwrap();
}

/// Keeps the path of the upgrade request.
struct PathOf(Arc<Mutex<String>>);

impl tokio_tungstenite::tungstenite::handshake::server::Callback for PathOf {
    fn on_request(
        self,
        request: &tokio_tungstenite::tungstenite::handshake::server::Request,
        response: tokio_tungstenite::tungstenite::handshake::server::Response,
    ) -> Result<
        tokio_tungstenite::tungstenite::handshake::server::Response,
        tokio_tungstenite::tungstenite::handshake::server::ErrorResponse,
    > {
        *self.0.lock().unwrap() = request.uri().path().to_owned();
        Ok(response)
    }
}

/// What the server must not send ends the connection, never the agent:
/// a text message, a frame that does not parse, one over the cap, a
/// second hello. Each time it comes back and proves itself again.
#[tokio::test]
async fn bad_frames_end_the_connection_and_the_agent_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let id = identity("urn:bc:scope:node");
    let spki = id.key.spki_der().to_vec();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (_handle, mut link) = Link::new(PlainDial(listener.local_addr().unwrap()), &id);
    // Five failures in a row: the test's backoff is short.
    link.backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(100));
    tokio::spawn(serve(link, work(dir.path(), counting(runs.clone()))));
    let hello = encode_server_frame(server_frame::Frame::Hello(ChannelHello {
        nonce: vec![1; NONCE_LEN],
        server_time_unix_ms: 0,
    }));
    let bad = [
        Message::text("hello"),
        Message::binary(vec![0xff; 16]),
        Message::binary(vec![0u8; bc_wire::command::channel::MAX_SERVER_FRAME + 1]),
        Message::binary(hello),
        Message::binary(Vec::new()),
    ];
    for msg in bad {
        let mut peer = Peer::accept(&listener, &spki).await;
        let _ = peer.ws.send(msg).await;
        let end = tokio::time::timeout(WAIT, async {
            loop {
                match peer.ws.next().await {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                    Some(Ok(_)) => {}
                }
            }
        })
        .await;
        assert!(end.is_ok(), "the agent closes the connection");
    }
    // And it still works.
    let mut peer = Peer::accept(&listener, &spki).await;
    peer.command(sign_as(
        &cp_key(),
        &new_command("cmd_after", NODE, "diag.ping", [], in_a_minute()),
    ))
    .await;
    assert_eq!(peer.result().await.status, Status::Ok as i32);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
