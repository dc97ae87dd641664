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
