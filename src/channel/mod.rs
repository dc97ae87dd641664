//! The command channel, the agent's side (`docs/commands.md`).
//!
//! `bcd node` (and `bcd ramdisk`, which runs the same loop) holds one
//! WebSocket to the control plane over the pinned mTLS of renewal
//! ([`dial`]). On it the server says hello with a nonce, the node key
//! proves the channel (`command-channel`), and commands arrive. Each is
//! verified against the pinned JoinService key, this node's id, the scope
//! its own certificate states and its clock (`bc_wire::command::verify`),
//! then accepted by `journal.db` (once per id), then run ([`run`]: at most
//! [`MAX_RUNNING`] at once, each cut at its kind's deadline). Its result is
//! stored unsigned, signed by the node key when sent (`command-result`),
//! and sent again on every connection until the server acks it.
//!
//! The connection comes back after any loss with exponential backoff and
//! full jitter (1 s to 5 min; a channel that was up comes back within
//! 10 s: a control-plane restart must not bring the fleet back in one
//! second), and at once after a renewal, with the new certificate. Commands run whether or not the connection is up; their
//! results wait in the journal. Nothing the server sends can panic this.
mod dial;
mod run;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bc_wire::agent::Role;
use bc_wire::command::channel::{encode_agent_frame, parse_server_frame, sign_proof};
use bc_wire::command::{self, new_result, AcceptError, Expect, Output, Scope, Times, MAX_RUNNING};
use bc_wire::command_v1::{
    agent_frame, server_frame, CommandResult, SignedCommand, SignedCommandResult, Status,
};
use futures_util::{SinkExt as _, StreamExt as _};
use p256::ecdsa::VerifyingKey;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_tungstenite::tungstenite::Message;

use crate::backoff::Backoff;
use crate::commands::{ApiAccess, Machine};
use crate::config::Config;
use crate::identity::Identity;
use crate::journal::commands::status_name;
use crate::journal::Journal;
use crate::keys::{NodeKey, TpmAccess};

use dial::{Dial, TlsDial, Ws};
use run::Runner;

/// The backoff's bounds: the first wait at most 1 s, none over 5 min.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// The first wait after losing a channel that was up: at most this.
const RESPREAD: Duration = Duration::from_secs(10);
/// The server's hello comes first, at once.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Either side pings an idle channel every 30 s (the agent too, so a
/// dead connection is found whatever the server does; the server's
/// WebSocket answers with a pong): nothing heard for three, it is gone.
const PING_EVERY: Duration = Duration::from_secs(30);
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// A connection that lasted this long (or carried a frame after the proof)
/// was a good one: the backoff starts over.
const STABLE: Duration = Duration::from_secs(30);

/// In a `failpoints` build, `off` keeps the channel closed: for the
/// end-to-end tests that count what the renewal alone costs.
pub const OFF_ENV: &str = "BCD_COMMAND_CHANNEL";

/// What the channel presents and signs with: the node's identity now.
pub(crate) struct ChannelIdentity {
    node_id: String,
    role: Role,
    /// DER, leaf first.
    chain: Vec<Vec<u8>>,
    /// The certificate's `urn:bc:` statements (the scope's among them).
    statements: Vec<String>,
    key: Arc<dyn NodeKey>,
}

impl ChannelIdentity {
    pub(crate) fn of(id: &Identity) -> Arc<ChannelIdentity> {
        Arc::new(ChannelIdentity {
            node_id: id.node_id.clone(),
            role: id.role,
            chain: id.chain.clone(),
            statements: id.cert.statements.clone(),
            key: id.key.clone(),
        })
    }

    /// What this certificate lets the node run. Without a readable scope
    /// statement (a certificate issued before the channel), nothing: every
    /// command is refused `kind-not-allowed` until a renewal brings one.
    fn scope(&self) -> (Scope, Option<command::ScopeError>) {
        match Scope::from_statements(&self.statements) {
            Ok(s) => (s, None),
            Err(e) => (
                Scope {
                    role: self.role,
                    kinds: Some(Vec::new()),
                },
                Some(e),
            ),
        }
    }
}

/// The renewal loop's end of the channel: a new identity reconnects it.
pub(crate) struct Handle {
    identity: watch::Sender<Arc<ChannelIdentity>>,
}

impl Handle {
    /// The node has a new certificate (renewed, re-joined, reloaded).
    pub(crate) fn renewed(&self, id: &Identity) {
        let changed = self.identity.borrow().chain != id.chain;
        if changed {
            self.identity.send_replace(ChannelIdentity::of(id));
        }
    }
}

/// Starts the channel on a thread of its own for the node `identity` of
/// `config` (read from `config_path`). `None` when it cannot run (the
/// journal does not open, the API URL is unusable): logged, and the node
/// runs on without it.
pub(crate) fn start(
    config: &Config,
    config_path: &Path,
    tpm: Arc<TpmAccess>,
    identity: &Identity,
) -> Option<Handle> {
    #[cfg(feature = "failpoints")]
    if std::env::var_os(OFF_ENV).is_some_and(|v| v == "off") {
        tracing::warn!("test build: no command channel ({OFF_ENV}=off)");
        return None;
    }
    let dial = match TlsDial::new(config) {
        Ok(d) => d,
        Err(e) => {
            tracing::error!(error = %e, "the command channel cannot start");
            return None;
        }
    };
    let (handle, link) = Link::new(dial, identity);
    let api = match crate::client::pinned_tls(config) {
        Ok(tls) => {
            let current = link.identity.clone();
            Some(Arc::new(ApiAccess {
                base: config.api.as_str().trim_end_matches('/').to_owned(),
                tls,
                identity: Box::new(move || {
                    let id = current.borrow().clone();
                    (id.chain.clone(), id.key.clone())
                }),
            }))
        }
        Err(e) => {
            tracing::error!(error = %e, "commands cannot reach the control plane");
            None
        }
    };
    let machine = Machine::this(config_path, &config.data_dir, tpm, identity.role, api);
    let work = match Work::new(
        &config.data_dir,
        config.pins.join_signing_key,
        machine,
        Runner::kinds(),
    ) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "the command channel cannot start");
            return None;
        }
    };
    // Its own thread and runtime: a node key that signs slowly (a TPM, a
    // stalled helper) in the channel's TLS handshake never holds up the
    // renewal loop, and the reverse.
    let spawned = std::thread::Builder::new()
        .name("command-channel".into())
        .spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(serve(link, work)),
                Err(e) => {
                    tracing::error!(error = %e, "the command channel cannot start its runtime")
                }
            }
        });
    match spawned {
        Ok(_) => Some(handle),
        Err(e) => {
            tracing::error!(error = %e, "the command channel cannot start its thread");
            None
        }
    }
}

/// The connection's side: how to dial, as whom, and when to retry.
struct Link<D> {
    dial: D,
    identity: watch::Receiver<Arc<ChannelIdentity>>,
    backoff: Backoff,
    /// [`RESPREAD`] (shorter in tests).
    respread: Duration,
}

impl<D: Dial> Link<D> {
    fn new(dial: D, identity: &Identity) -> (Handle, Link<D>) {
        let (tx, rx) = watch::channel(ChannelIdentity::of(identity));
        (
            Handle { identity: tx },
            Link {
                dial,
                identity: rx,
                backoff: Backoff::new(BACKOFF_MIN, BACKOFF_MAX),
                respread: RESPREAD,
            },
        )
    }
}

/// The commands' side: the journal, what runs, and its results.
struct Work {
    signing_key: VerifyingKey,
    journal: Journal,
    done_tx: mpsc::UnboundedSender<CommandResult>,
    done_rx: mpsc::UnboundedReceiver<CommandResult>,
    slots: Arc<Semaphore>,
    machine: Arc<Machine>,
    runner: Runner,
}

/// How a connection ended.
enum End {
    /// A new certificate: reconnect now.
    Renewed,
    /// The renewal loop is gone: so is the channel.
    Stopped,
    Lost {
        /// It carried frames after the proof, or lasted: the backoff starts over.
        good: bool,
        why: String,
    },
}

/// The channel, until the node stops.
async fn serve<D: Dial>(mut link: Link<D>, mut work: Work) {
    let first = link.identity.borrow().clone();
    work.report_interrupted(&first.node_id);
    loop {
        let id = link.identity.borrow_and_update().clone();
        let dialed = work.storing(link.dial.dial(&id)).await;
        let mut was_up = false;
        let why = match dialed {
            Ok(mut ws) => match work.session(&mut ws, &id, &mut link.identity).await {
                End::Renewed => {
                    tracing::info!("command channel: reconnecting with the renewed certificate");
                    link.backoff.succeed();
                    continue;
                }
                End::Stopped => return,
                End::Lost { good, why } => {
                    if good {
                        link.backoff.succeed();
                        was_up = true;
                    }
                    why
                }
            },
            Err(why) => why,
        };
        let (attempt, cap) = link.backoff.fail();
        // A fleet that lost a restarting control plane together comes
        // back over RESPREAD, not within the first second.
        let wait = full_jitter(if was_up { cap.max(link.respread) } else { cap });
        tracing::warn!(
            attempt,
            retryIn = %format!("{:.1}s", wait.as_secs_f64()),
            error = %why,
            "command channel down; reconnecting"
        );
        let identity = &mut link.identity;
        let stopped = work
            .storing(async {
                tokio::select! {
                    () = tokio::time::sleep(wait) => false,
                    changed = identity.changed() => changed.is_err(),
                }
            })
            .await;
        if stopped {
            return;
        }
    }
}

/// A wait uniformly within `[0, cap]` ("full jitter"): agents that lost
/// the control plane together come back spread over the whole wait.
fn full_jitter(cap: Duration) -> Duration {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return cap;
    }
    let cap_ms = u64::try_from(cap.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(u64::from_le_bytes(bytes) % cap_ms.saturating_add(1))
}

fn now_ms() -> i64 {
    i64::try_from(crate::clock::unix_ms(crate::clock::now())).unwrap_or(i64::MAX)
}

impl Work {
    fn new(
        data_dir: &Path,
        signing_key: VerifyingKey,
        machine: Machine,
        runner: Runner,
    ) -> Result<Work, crate::journal::JournalError> {
        let journal = Journal::open_commands(data_dir)?;
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Ok(Work {
            signing_key,
            journal,
            done_tx,
            done_rx,
            slots: Arc::new(Semaphore::new(MAX_RUNNING)),
            machine: Arc::new(machine),
            runner,
        })
    }

    /// `fut`, storing the results of commands that finish meanwhile.
    async fn storing<F: Future>(&mut self, fut: F) -> F::Output {
        tokio::pin!(fut);
        loop {
            tokio::select! {
                out = &mut fut => return out,
                Some(result) = self.done_rx.recv() => self.store(&result),
            }
        }
    }

    fn store(&mut self, result: &CommandResult) {
        tracing::info!(
            id = %result.id,
            kind = %result.kind,
            status = status_name(result),
            outcome = %result.outcome,
            "command finished"
        );
        if let Err(e) = self.journal.store_result(result, now_ms()) {
            tracing::error!(id = %result.id, error = %e, "cannot store a command's result");
        }
    }

    /// Commands accepted before bcd stopped and never finished: they do
    /// not run again (at most once); each is reported `failed`.
    fn report_interrupted(&mut self, node_id: &str) {
        let interrupted = match self.journal.interrupted() {
            Ok(i) => i,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the commands journal");
                return;
            }
        };
        for (id, kind) in interrupted {
            let now = now_ms();
            let result = new_result(
                &id,
                node_id,
                &kind,
                Status::Failed,
                "interrupted: bcd stopped while it ran; it does not run again",
                Output::new(),
                Times {
                    started_ms: now,
                    finished_ms: now,
                },
            );
            self.store(&result);
        }
    }

    /// One connection, from the hello to its loss.
    async fn session(
        &mut self,
        ws: &mut Ws,
        id: &ChannelIdentity,
        renewed: &mut watch::Receiver<Arc<ChannelIdentity>>,
    ) -> End {
        let lost = |good, why: String| End::Lost { good, why };
        let hello = match self
            .storing(tokio::time::timeout(HELLO_TIMEOUT, ws.next()))
            .await
        {
            Err(_) => return lost(false, "no hello from the control plane within 10 s".into()),
            Ok(next) => match frame(next) {
                Ok(Some(server_frame::Frame::Hello(h))) => h,
                Ok(_) => {
                    return lost(
                        false,
                        "the control plane's first frame is not a hello".into(),
                    )
                }
                Err(why) => return lost(false, why),
            },
        };
        let key = id.key.clone();
        let node_id = id.node_id.clone();
        let client_ms = crate::clock::unix_ms(crate::clock::now());
        let proof = tokio::task::spawn_blocking(move || {
            sign_proof(&hello, &node_id, client_ms, key.kid(), |m| key.sign(m))
        })
        .await;
        let proof = match proof {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                return lost(
                    false,
                    format!("the node key cannot sign the channel proof: {e}"),
                )
            }
            Err(e) => return lost(false, format!("the channel proof's signer stopped: {e}")),
        };
        if let Err(why) = send(ws, agent_frame::Frame::Proof(proof)).await {
            return lost(false, why);
        }
        let (scope, missing) = id.scope();
        match missing {
            Some(e) => tracing::warn!(
                node_id = %id.node_id,
                error = %e,
                "command channel up; this certificate allows no command kind until it is renewed"
            ),
            // A leased node's certificate names its lessee (the scope is
            // then narrowed to what a lessee's node runs).
            None => tracing::info!(
                node_id = %id.node_id,
                scope = %scope.statement(),
                lessee = %command::scope::lessee(&id.statements).unwrap_or("none"),
                "command channel up"
            ),
        }
        let since = tokio::time::Instant::now();
        let mut carried = false;
        let good = |carried: bool| carried || since.elapsed() >= STABLE;
        let pending = self.journal.unacked_ids().unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot read the unacknowledged results");
            Vec::new()
        });
        for rid in pending {
            let stored = self.journal.stored(&rid).unwrap_or_else(|e| {
                tracing::error!(error = %e, "cannot read a stored result");
                None
            });
            if let Some(r) = stored {
                if let Err(why) = self.send_result(ws, id, &r).await {
                    return lost(good(carried), why);
                }
            }
        }
        let mut heard = tokio::time::Instant::now();
        let mut ping = tokio::time::interval_at(heard + PING_EVERY, PING_EVERY);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(heard + IDLE_TIMEOUT) => {
                    return lost(good(carried), format!("nothing from the control plane for {} s", IDLE_TIMEOUT.as_secs()));
                }
                _ = ping.tick() => {
                    if let Err(e) = ws.send(Message::Ping(Default::default())).await {
                        return lost(good(carried), format!("cannot send to the control plane: {e}"));
                    }
                }
                next = ws.next() => {
                    heard = tokio::time::Instant::now();
                    match frame(next) {
                        Err(why) => {
                            let _ = ws.close(None).await;
                            return lost(good(carried), why);
                        }
                        Ok(None) => {}
                        Ok(Some(f)) => {
                            carried = true;
                            let reply = match f {
                                server_frame::Frame::Hello(_) => {
                                    let _ = ws.close(None).await;
                                    return lost(true, "a second hello".into());
                                }
                                server_frame::Frame::Command(c) => self.on_command(c, id, &scope),
                                server_frame::Frame::Ack(a) => {
                                    self.on_ack(&a.id);
                                    None
                                }
                            };
                            if let Some(r) = reply {
                                if let Err(why) = self.send_result(ws, id, &r).await {
                                    return lost(true, why);
                                }
                            }
                        }
                    }
                }
                Some(result) = self.done_rx.recv() => {
                    self.store(&result);
                    if let Err(why) = self.send_result(ws, id, &result).await {
                        return lost(good(carried), why);
                    }
                }
                changed = renewed.changed() => {
                    let _ = ws.close(None).await;
                    return if changed.is_err() { End::Stopped } else { End::Renewed };
                }
            }
        }
    }

    fn on_ack(&mut self, id: &str) {
        // A reboot (boot.kexec) may be waiting for this one.
        crate::commands::acked(id);
        match self.journal.ack(id) {
            Ok(true) => tracing::debug!(id = %printable(id), "result acknowledged"),
            Ok(false) => {
                tracing::debug!(id = %printable(id), "an acknowledgement of no stored result")
            }
            Err(e) => tracing::error!(error = %e, "cannot record an acknowledgement"),
        }
    }

    /// A command frame: verified, journaled, started. What to send back
    /// now: a refusal's result, or a redelivered command's stored result.
    fn on_command(
        &mut self,
        signed: SignedCommand,
        id: &ChannelIdentity,
        scope: &Scope,
    ) -> Option<CommandResult> {
        let now = now_ms();
        let expect = Expect {
            signing_key: &self.signing_key,
            node_id: &id.node_id,
            scope,
            now_ms: now,
        };
        let verified = match command::verify(&signed, &expect) {
            Ok(v) => v,
            Err(refused) => {
                tracing::warn!(
                    id = refused.claimed_id.as_deref().unwrap_or("?"),
                    kind = refused.claimed_kind.as_deref().unwrap_or("?"),
                    reason = refused.refusal.reason(),
                    error = %refused.refusal,
                    "command refused; nothing runs"
                );
                let result = refused.result(&id.node_id, now)?;
                match self.journal.knows(&result.id) {
                    Ok(false) => {}
                    // A refused copy of a command this node knows says
                    // nothing about the real one: logged only.
                    Ok(true) => return None,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read the commands journal");
                        return None;
                    }
                }
                self.store(&result);
                return Some(result);
            }
        };
        let (cid, kind) = (verified.id().to_owned(), verified.kind().name);
        match verified.accept(&mut self.journal) {
            Ok(runnable) => {
                tracing::info!(id = %cid, kind, "command accepted");
                run::start(
                    runnable,
                    self.slots.clone(),
                    self.machine.clone(),
                    self.runner.clone(),
                    self.done_tx.clone(),
                );
                None
            }
            Err(AcceptError::Replayed(_)) => {
                tracing::info!(id = %cid, kind, reason = "replayed", "command seen before; it runs at most once");
                match self.journal.resend(&cid) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read a stored result");
                        None
                    }
                }
            }
            Err(AcceptError::Journal(e)) => {
                tracing::error!(id = %cid, kind, error = %e, "the journal cannot record the command; it does not run");
                None
            }
        }
    }

    /// Signs `result` with the node key held now and sends it.
    async fn send_result(
        &mut self,
        ws: &mut Ws,
        id: &ChannelIdentity,
        result: &CommandResult,
    ) -> Result<(), String> {
        let signed = sign(id, result.clone()).await?;
        send(ws, agent_frame::Frame::Result(signed)).await
    }
}

/// The node key's signature over a result (`command-result`), off the
/// runtime's thread: a TPM or the helper takes its time.
async fn sign(id: &ChannelIdentity, result: CommandResult) -> Result<SignedCommandResult, String> {
    let key = id.key.clone();
    tokio::task::spawn_blocking(move || {
        command::sign_result(&result, key.kid(), |m| key.sign(m))
            .map_err(|e| format!("the node key cannot sign a result: {e}"))
    })
    .await
    .map_err(|e| format!("the result's signer stopped: {e}"))?
}

async fn send(ws: &mut Ws, frame: agent_frame::Frame) -> Result<(), String> {
    ws.send(Message::binary(encode_agent_frame(frame)))
        .await
        .map_err(|e| format!("cannot send to the control plane: {e}"))
}

/// One message from the server as a frame: `None` for control messages
/// (tungstenite answers pings itself), an error for what ends the
/// connection (a close, a text message, a frame that does not parse).
fn frame(
    next: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>,
) -> Result<Option<server_frame::Frame>, String> {
    match next {
        None => Err("the connection closed".into()),
        Some(Err(e)) => Err(format!("the connection failed: {e}")),
        Some(Ok(Message::Binary(bytes))) => parse_server_frame(&bytes)
            .map(Some)
            .map_err(|e| format!("protocol error: {e}")),
        Some(Ok(Message::Text(_))) => Err("protocol error: a text message".into()),
        Some(Ok(Message::Close(f))) => Err(match f {
            Some(f) => format!(
                "the control plane closed the channel ({}: {})",
                u16::from(f.code),
                printable(&f.reason)
            ),
            None => "the control plane closed the channel".into(),
        }),
        Some(Ok(_)) => Ok(None),
    }
}

fn printable(s: &str) -> String {
    crate::pki::printable(s)
}
