//! The command channel's transport: the WebSocket at
//! [`endpoints::COMMAND_CHANNEL`] (tokio-tungstenite over hyper's upgrade,
//! the same crate and version as bcd's side), over [`CommandService`].
//! [`crate::api::http`] routes to [`upgrade`].
//!
//! 1. **Upgrade.** The client certificate must be a current `node_certs`
//!    row, not revoked, of a node not retired, valid at database time
//!    ([`CommandService::channel_auth`]); otherwise 403 and nothing kept.
//! 2. **Hello, proof.** The server sends a fresh nonce; the agent has
//!    [`PROOF_TIMEOUT_MS`] to answer a proof that verifies. Until then the
//!    connection keeps its connection-limit slot (so unproven upgrades are
//!    bounded like any connection, and evictable) and is nobody's channel:
//!    it holds no place in [`Channels`].
//! 3. **Channel.** The proven connection replaces the node's previous one
//!    ([`Channels`]), gives its slot back, and delivers the node's queued
//!    commands: at once, whenever this process queues one for it, and on
//!    a short poll (commands another process or replica queued). A result
//!    is acked once stored. It is closed when its certificate stops being
//!    good (revoked, expired, renewed, the node retired), when the node
//!    opens another, at shutdown, and when it stays silent through two
//!    pings.
//!
//! Idle channels cost the database nothing each: one poller per process
//! asks, every [`POLL`], which of all the channels' certificates are still
//! good and which nodes have something queued (a few queries, whatever
//! the number of channels), and wakes or closes only those channels.
//! The channels' own database calls (upgrade, delivery, results) take
//! turns, at most [`DB_CALLS`] at once, first come first served: a
//! command for a thousand nodes is a queue here, not a thousand writers
//! racing for SQLite's lock (where some lost for the whole busy timeout
//! and their results were dropped). A result that still cannot be stored
//! closes its channel: the agent sends every unacknowledged result again
//! on its next channel.
//!
//! An address whose upgrades or proofs keep failing is refused (429, a
//! logged reason) before any certificate or database work, for a while
//! ([`flood`]); nothing else changes.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bc_connlimit::Stop;
use bc_wire::command::channel::{
    encode_server_frame, parse_agent_frame, verify_proof, ProofExpect, MAX_AGENT_FRAME, NONCE_LEN,
    PROOF_TIMEOUT_MS,
};
use bc_wire::command_v1::{agent_frame, server_frame, ChannelHello, ResultAck, SignedCommand};
use futures_util::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use prost::Message as _;
use tokio::sync::{Notify, Semaphore};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::api::connlimit::Slot;
use crate::plane::commands::{ChannelAuth, CommandService, Taken};
use crate::plane::workflows::WorkflowService;
use crate::plane::ControlPlane;

/// How often the poller looks for commands other processes queued,
/// expires what is due, and checks the channels' certificates.
const POLL: Duration = Duration::from_secs(1);
/// How often a channel checks whether it has been silent too long (no
/// database work).
const SILENCE_CHECK: Duration = Duration::from_secs(2);
/// A channel silent this long is pinged; silent twice as long, closed.
const PING_EVERY: Duration = Duration::from_secs(30);
/// How many of this process's channel database calls run at once.
const DB_CALLS: usize = 8;

/// The connection's slot in the connection limits, which an unproven
/// upgrade keeps (an extension of every request).
#[derive(Clone)]
pub(crate) struct ConnSlot(pub Arc<Slot>);

/// The server's shutdown signal (an extension of every request).
#[derive(Clone)]
pub(crate) struct ConnStop(pub Stop);

type Ws = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// The proven channels, one per node, and the poller that wakes them.
pub(crate) struct Channels {
    by_node: Mutex<HashMap<String, Entry>>,
    next: Mutex<u64>,
    poller: std::sync::Once,
    failures: flood::Failures,
    /// Turns for the channels' database calls ([`DB_CALLS`], FIFO).
    db: Semaphore,
}

struct Entry {
    conn: u64,
    /// The certificate the channel was proven with.
    serial: String,
    wake: Arc<Notify>,
    close: Arc<Close>,
}

/// Tells a channel to end, and why.
#[derive(Default)]
struct Close {
    notify: Notify,
    why: Mutex<Option<&'static str>>,
}

impl Close {
    fn close(&self, why: &'static str) {
        self.why
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(why);
        self.notify.notify_one();
    }

    async fn closed(&self) -> &'static str {
        self.notify.notified().await;
        self.why
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or("closed")
    }
}

const REPLACED: &str = "replaced by a newer channel of the node";
const RESULT_NOT_STORED: &str = "a result could not be stored (the agent sends it again)";
const NOT_GOOD: &str =
    "the certificate is no longer good (revoked, expired, renewed or the node retired)";

impl Channels {
    pub(crate) fn new() -> Arc<Channels> {
        Arc::new(Channels {
            by_node: Mutex::new(HashMap::new()),
            next: Mutex::new(0),
            poller: std::sync::Once::new(),
            failures: flood::Failures::default(),
            db: Semaphore::new(DB_CALLS),
        })
    }

    /// Makes `node_id`'s channel the connection `conn` (proven with the
    /// certificate `serial`), closing the one before it.
    fn register(
        &self,
        node_id: &str,
        serial: &str,
        conn: u64,
        wake: Arc<Notify>,
        close: Arc<Close>,
    ) {
        let old = self
            .by_node
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                node_id.to_owned(),
                Entry {
                    conn,
                    serial: serial.to_owned(),
                    wake,
                    close,
                },
            );
        if let Some(old) = old {
            old.close.close(REPLACED);
        }
    }

    /// `(node_id, conn)` of every channel now.
    fn open(&self) -> Vec<(String, u64)> {
        self.by_node
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, e)| (n.clone(), e.conn))
            .collect()
    }

    /// Closes each channel of `looked` (still the same connection) whose
    /// certificate is not among `good`.
    fn close_not_good(&self, looked: &[(String, u64)], good: &HashSet<(String, String)>) {
        let map = self.by_node.lock().unwrap_or_else(|p| p.into_inner());
        for (node, conn) in looked {
            if let Some(e) = map.get(node).filter(|e| e.conn == *conn) {
                if !good.contains(&(node.clone(), e.serial.clone())) {
                    e.close.close(NOT_GOOD);
                }
            }
        }
    }

    fn unregister(&self, node_id: &str, conn: u64) {
        let mut map = self.by_node.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(node_id).is_some_and(|e| e.conn == conn) {
            map.remove(node_id);
        }
    }

    /// Counts a failed upgrade or proof from `peer`.
    fn failed(&self, peer: Option<SocketAddr>) {
        if let Some(p) = peer {
            self.failures.failed(p.ip(), Instant::now());
        }
    }

    fn next_conn(&self) -> u64 {
        let mut n = self.next.lock().unwrap_or_else(|p| p.into_inner());
        *n += 1;
        *n
    }

    fn wake(&self, node_ids: &[String]) {
        let map = self.by_node.lock().unwrap_or_else(|p| p.into_inner());
        for id in node_ids {
            if let Some(e) = map.get(id) {
                e.wake.notify_one();
            }
        }
    }

    /// Starts, once, the task that wakes the channels: at once the node's
    /// when this process queues for it, and every [`POLL`] those with what
    /// others queued (expiring what is due, and closing the channels whose
    /// certificate stopped being good).
    pub(crate) fn start_poller(self: &Arc<Self>, cp: Arc<ControlPlane>) {
        let channels = Arc::downgrade(self);
        self.poller.call_once(|| {
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(POLL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        () = cp.queued_notified() => {
                            let Some(ch) = channels.upgrade() else { return };
                            ch.wake(&cp.take_queued_nodes());
                        }
                        _ = tick.tick() => {
                            let Some(ch) = channels.upgrade() else { return };
                            let looked = ch.open();
                            let nodes: Vec<String> = looked.iter().map(|(n, _)| n.clone()).collect();
                            let cp2 = cp.clone();
                            let due = tokio::task::spawn_blocking(move || {
                                let s = CommandService::new(&cp2);
                                s.expire()?;
                                // The workflows advance here too: one poller
                                // per process (docs/workflows.md).
                                if let Err(e) = WorkflowService::new(&cp2).tick() {
                                    tracing::warn!(error = %e, "workflow tick failed");
                                }
                                s.channels_tick(&nodes)
                            })
                            .await;
                            match due {
                                Ok(Ok(t)) => {
                                    ch.close_not_good(&looked, &t.good);
                                    ch.wake(&t.queued);
                                }
                                Ok(Err(e)) => tracing::warn!(error = %e, "command channel poll failed"),
                                Err(e) => tracing::warn!(error = %e, "command channel poll panicked"),
                            }
                        }
                    }
                }
            });
        });
    }
}

/// The WebSocket configuration: agent frames up to a result at its cap,
/// read [`READ_BUFFER`] at a time.
fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_AGENT_FRAME))
        .max_frame_size(Some(MAX_AGENT_FRAME))
        .read_buffer_size(READ_BUFFER)
}

/// tungstenite zero-fills its read buffer up to this size at every read,
/// so an idle channel holds this much: its default (128 KiB) was most of
/// the serve's RSS with 1,000 idle channels (166 MB). A larger frame still
/// grows the buffer as it arrives.
const READ_BUFFER: usize = 8 * 1024;

fn status(code: StatusCode, text: &'static str) -> Response {
    (code, text).into_response()
}

/// `GET` [`bc_wire::endpoints::COMMAND_CHANNEL`] with `Upgrade:
/// websocket`, from the client whose TLS leaf is `leaf` (the router's
/// handler passes it, and the peer's address). An address refused for
/// its failures gets 429 at once; a refused upgrade counts as a failure.
pub(crate) async fn upgrade(
    cp: Arc<ControlPlane>,
    channels: Arc<Channels>,
    leaf: Option<Vec<u8>>,
    peer: Option<SocketAddr>,
    req: Request,
) -> Response {
    if let Some(p) = peer {
        if channels.failures.refused(p.ip(), Instant::now()) {
            let mut r = status(StatusCode::TOO_MANY_REQUESTS, flood::REASON);
            r.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(flood::WINDOW.as_secs()),
            );
            return r;
        }
    }
    let resp = accept(cp, channels.clone(), leaf, peer, req).await;
    if matches!(
        resp.status(),
        StatusCode::BAD_REQUEST | StatusCode::FORBIDDEN
    ) {
        channels.failed(peer);
    }
    resp
}

/// [`upgrade`] past the flood check.
async fn accept(
    cp: Arc<ControlPlane>,
    channels: Arc<Channels>,
    leaf: Option<Vec<u8>>,
    peer: Option<SocketAddr>,
    mut req: Request,
) -> Response {
    let headers = req.headers();
    let has = |name: header::HeaderName, want: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(want)))
        })
    };
    if !has(header::UPGRADE, "websocket") || !has(header::CONNECTION, "upgrade") {
        return status(StatusCode::BAD_REQUEST, "a WebSocket upgrade is expected\n");
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .map(HeaderValue::as_bytes)
        != Some(b"13")
    {
        return status(
            StatusCode::BAD_REQUEST,
            "WebSocket version 13 is expected\n",
        );
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return status(StatusCode::BAD_REQUEST, "no Sec-WebSocket-Key\n");
    };
    let slot = req.extensions().get::<ConnSlot>().cloned();
    let stop = req.extensions().get::<ConnStop>().cloned();
    let Some(on_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return status(
            StatusCode::BAD_REQUEST,
            "this connection cannot be upgraded\n",
        );
    };
    let Some(leaf) = leaf else {
        return status(StatusCode::FORBIDDEN, "a node certificate is required\n");
    };
    let auth = blocking(&cp, &channels.db, move |s| s.channel_auth(&leaf)).await;
    let auth = match auth {
        Ok(Some(a)) => a,
        Ok(None) => {
            tracing::info!(peer = ?peer, "command channel refused: not a current node certificate");
            return status(
                StatusCode::FORBIDDEN,
                "the certificate is not a current, unrevoked node certificate of a live node\n",
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, "command channel: database");
            return status(StatusCode::SERVICE_UNAVAILABLE, "database unavailable\n");
        }
    };
    channels.start_poller(cp.clone());
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(ws_config()),
                )
                .await;
                run(cp, channels, auth, ws, peer, slot, stop).await;
            }
            Err(e) => tracing::debug!(peer = ?peer, error = %e, "command channel upgrade failed"),
        }
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Ok(v) = HeaderValue::from_str(
        &tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()),
    ) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    resp
}

/// Waits for a stop signal (never, without one).
async fn stopped(stop: &mut Option<ConnStop>) {
    match stop {
        Some(ConnStop(s)) => {
            if s.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// Runs a blocking `CommandService` call off the runtime, in its turn
/// (`turns`: [`Channels`]' [`DB_CALLS`]).
async fn blocking<T: Send + 'static>(
    cp: &Arc<ControlPlane>,
    turns: &Semaphore,
    f: impl FnOnce(CommandService<'_>) -> Result<T, crate::store::DbError> + Send + 'static,
) -> Result<T, String> {
    // Never closed: an error here would only be a bug's.
    let _turn = turns.acquire().await.map_err(|e| e.to_string())?;
    let cp = cp.clone();
    tokio::task::spawn_blocking(move || f(CommandService::new(&cp)))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// One upgraded connection: the proof, then the channel.
async fn run(
    cp: Arc<ControlPlane>,
    channels: Arc<Channels>,
    auth: ChannelAuth,
    mut ws: Ws,
    peer: Option<SocketAddr>,
    slot: Option<ConnSlot>,
    mut stop: Option<ConnStop>,
) {
    let node_id = auth.node_id.clone();
    let mut nonce = [0u8; NONCE_LEN];
    if getrandom::fill(&mut nonce).is_err() {
        tracing::error!("command channel: no randomness for the nonce");
        return;
    }
    let hello = server_frame::Frame::Hello(ChannelHello {
        nonce: nonce.to_vec(),
        server_time_unix_ms: auth.now_ms,
    });
    if ws
        .send(Message::Binary(encode_server_frame(hello).into()))
        .await
        .is_err()
    {
        return;
    }
    // Unproven: the slot is held, and eviction or shutdown end it.
    let evicted = async {
        match &slot {
            Some(s) => s.0.evicted().await,
            None => std::future::pending().await,
        }
    };
    let proof = tokio::select! {
        p = tokio::time::timeout(Duration::from_millis(PROOF_TIMEOUT_MS as u64), ws.next()) => p,
        () = evicted => {
            tracing::debug!(peer = ?peer, node_id, "unproven command channel closed to make room");
            return;
        }
        () = stopped(&mut stop) => return,
    };
    let proof = match proof {
        Ok(Some(Ok(Message::Binary(bytes)))) => match parse_agent_frame(&bytes) {
            Ok(agent_frame::Frame::Proof(p)) => p,
            _ => {
                refuse(&channels, &mut ws, peer, &node_id, "malformed").await;
                return;
            }
        },
        Err(_) => {
            refuse(&channels, &mut ws, peer, &node_id, "timeout").await;
            return;
        }
        _ => {
            refuse(&channels, &mut ws, peer, &node_id, "malformed").await;
            return;
        }
    };
    let now = match blocking(&cp, &channels.db, |s| s.now()).await {
        Ok(now) => now,
        Err(e) => {
            tracing::warn!(error = %e, "command channel: database");
            return;
        }
    };
    if let Err(e) = verify_proof(
        &proof,
        &ProofExpect {
            nonce: &nonce,
            node_id: &node_id,
            node_spki: &auth.spki_der,
            now_ms: now,
        },
    ) {
        tracing::warn!(peer = ?peer, node_id, reason = e.reason(), error = %e, "command channel proof refused");
        channels.failed(peer);
        let _ = ws.close(None).await;
        return;
    }
    // Proven: the node's channel now, holding no connection slot.
    drop(slot);
    let conn = channels.next_conn();
    let wake = Arc::new(Notify::new());
    let close = Arc::new(Close::default());
    channels.register(&node_id, &auth.serial, conn, wake.clone(), close.clone());
    tracing::info!(peer = ?peer, node_id, serial = %auth.serial, "command channel open");
    let why = serve(&cp, &channels.db, &auth, &mut ws, &wake, &close, &mut stop).await;
    channels.unregister(&node_id, conn);
    tracing::info!(node_id, serial = %auth.serial, why, "command channel closed");
    let _ = ws.close(None).await;
}

async fn refuse(
    channels: &Channels,
    ws: &mut Ws,
    peer: Option<SocketAddr>,
    node_id: &str,
    reason: &'static str,
) {
    tracing::warn!(peer = ?peer, node_id, reason, "command channel proof refused");
    channels.failed(peer);
    let _ = ws.close(None).await;
}

/// The proven channel's loop; returns why it ended.
async fn serve(
    cp: &Arc<ControlPlane>,
    turns: &Semaphore,
    auth: &ChannelAuth,
    ws: &mut Ws,
    wake: &Notify,
    close: &Close,
    stop: &mut Option<ConnStop>,
) -> &'static str {
    let mut sent: HashSet<String> = HashSet::new();
    let mut recheck = tokio::time::interval(SILENCE_CHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_heard = tokio::time::Instant::now();
    let mut last_ping = last_heard;
    let mut deliver = true;
    loop {
        if deliver {
            deliver = false;
            let node = auth.node_id.clone();
            let due = match blocking(cp, turns, move |s| s.deliverable(&node)).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(error = %e, "command channel: database");
                    Vec::new()
                }
            };
            for (id, signed) in due {
                if sent.contains(&id) {
                    continue;
                }
                let Ok(cmd) = SignedCommand::decode(signed.as_slice()) else {
                    continue;
                };
                let frame = encode_server_frame(server_frame::Frame::Command(cmd));
                if ws.send(Message::Binary(frame.into())).await.is_err() {
                    return "send failed";
                }
                tracing::info!(id, node_id = %auth.node_id, "command delivered");
                sent.insert(id);
            }
        }
        tokio::select! {
            () = wake.notified() => deliver = true,
            why = close.closed() => return why,
            () = stopped(stop) => return "shutdown",
            _ = recheck.tick() => {
                let silent = last_heard.elapsed();
                if silent >= 2 * PING_EVERY {
                    return "silent through two pings";
                }
                if silent >= PING_EVERY && last_ping.elapsed() >= PING_EVERY {
                    last_ping = tokio::time::Instant::now();
                    if ws.send(Message::Ping(Vec::new().into())).await.is_err() {
                        return "ping failed";
                    }
                }
            }
            msg = ws.next() => {
                last_heard = tokio::time::Instant::now();
                match msg {
                    None => return "the agent closed it",
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, node_id = %auth.node_id, "command channel error");
                        return "a protocol error";
                    }
                    Some(Ok(Message::Binary(bytes))) => match parse_agent_frame(&bytes) {
                        Ok(agent_frame::Frame::Result(r)) => {
                            let a = auth.clone();
                            let taken = blocking(cp, turns, move |s| s.take_result(&a, &r)).await;
                            let ack = match taken {
                                Ok(Taken::Stored(id) | Taken::Unknown(id)) => id,
                                Ok(Taken::Refused(_)) => continue,
                                Err(e) => {
                                    // Not acked, and the agent sends a result
                                    // again only on a new channel: end this one.
                                    tracing::warn!(error = %e, node_id = %auth.node_id,
                                        "command result not stored; closing the channel so that the agent sends it again");
                                    return RESULT_NOT_STORED;
                                }
                            };
                            sent.remove(&ack);
                            let frame = encode_server_frame(server_frame::Frame::Ack(ResultAck { id: ack }));
                            if ws.send(Message::Binary(frame.into())).await.is_err() {
                                return "send failed";
                            }
                        }
                        Ok(agent_frame::Frame::Proof(_)) => return "a second proof",
                        Err(e) => {
                            tracing::warn!(error = %e, node_id = %auth.node_id, "command channel frame refused");
                            return "a malformed frame";
                        }
                    },
                    Some(Ok(Message::Text(_))) => return "a text frame",
                    Some(Ok(Message::Close(_))) => return "the agent closed it",
                    Some(Ok(_)) => {}
                }
            }
        }
    }
}

mod flood;
#[cfg(test)]
mod tests;
