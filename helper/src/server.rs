//! The root side: accepts callers on a unix socket, serves those whose uid
//! is allowed (SO_PEERCRED, checked before a byte is read) and refuses and
//! logs anyone else. Requests are served in turn through one [`Backend`]
//! (one TPM connection, called on the connection's task: the runtime's
//! thread waits for the TPM like every caller does); a malformed, oversized or slow request closes its
//! connection only. The caller owns the listener and says when to stop
//! (`shutdown`), so a test, systemd's socket or `bcd helper` can drive it.
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use crate::proto::{self, response, Hash, Operation, Response};

/// Why the backend could not do an operation, in words the caller may see
/// (a TPM's error: no secret in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendError(pub String);

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The AK as `tpm.ak` returns it.
#[derive(Debug, Clone)]
pub struct AkInfo {
    /// TPMT_PUBLIC.
    pub public: Vec<u8>,
    /// TPM name.
    pub name: Vec<u8>,
    /// Which TPM, in words.
    pub tpm: String,
}

/// `tpm.certify_quote`'s result: a key's certification and the AK's quote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertifiedQuote {
    pub certify_info: Vec<u8>,
    pub signature: Vec<u8>,
    pub quote: Vec<u8>,
    pub quote_signature: Vec<u8>,
    pub pcr_values: Vec<Vec<u8>>,
}

/// What the helper does with its TPM: the bcd binary implements it with its
/// `tpm` module. Calls are blocking and never concurrent.
pub trait Backend: Send + 'static {
    /// `tpm.ak`: the AK (a primary of the endorsement hierarchy).
    fn ak(&mut self) -> Result<AkInfo, BackendError>;
    /// `tpm.nodekey`: the node key derived from `unique`; its TPMT_PUBLIC.
    fn node_key(&mut self, unique: &[u8; 32]) -> Result<Vec<u8>, BackendError>;
    /// `tpm.sign`: ECDSA by that key over `digest` (made with `hash`), P1363.
    fn sign(
        &mut self,
        unique: &[u8; 32],
        hash: Hash,
        digest: &[u8],
    ) -> Result<[u8; 64], BackendError>;
    /// `tpm.certify`: TPM2_Certify of that key by the AK over `qualifying`:
    /// TPMS_ATTEST and TPMT_SIGNATURE.
    fn certify(
        &mut self,
        unique: &[u8; 32],
        qualifying: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), BackendError>;
    /// `tpm.certify_quote`: [`Self::certify`], then a quote by the AK over
    /// `extra` of `pcrs` in every populated bank, in the same TPM
    /// connection: the certification and the quote's values. A backend
    /// without quotes says so.
    fn certify_quote(
        &mut self,
        unique: &[u8; 32],
        qualifying: &[u8],
        extra: &[u8],
        pcrs: &[u32],
    ) -> Result<CertifiedQuote, BackendError> {
        let _ = (unique, qualifying, extra, pcrs);
        Err(BackendError("this helper does not quote".into()))
    }
    /// `machine.ids`: the machine's root-only identifiers and its TPM's.
    /// A backend without them says so.
    fn machine(&mut self) -> Result<proto::MachineResponse, BackendError> {
        Err(BackendError("this helper does not read the machine".into()))
    }
    /// `eventlog.read`: the TCG event log, at most
    /// [`bc_wire::tpm::MAX_EVENT_LOG`] bytes. A backend without one says so.
    fn event_log(&mut self) -> Result<Vec<u8>, BackendError> {
        Err(BackendError(
            "this helper does not read the event log".into(),
        ))
    }
}

/// The uids the helper serves: root and the configured user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    uids: Vec<u32>,
}

impl Allowed {
    /// Root and `uid`.
    pub fn root_and(uid: u32) -> Allowed {
        Allowed { uids: vec![0, uid] }
    }

    /// Exactly `uids`, root only if listed: for tests of the refusal,
    /// which run as root.
    #[cfg(test)]
    fn only(uids: &[u32]) -> Allowed {
        Allowed {
            uids: uids.to_vec(),
        }
    }

    pub(crate) fn allows(&self, uid: u32) -> bool {
        self.uids.contains(&uid)
    }
}

/// Bounds on what a caller can make the helper hold.
#[derive(Debug, Clone)]
pub struct Limits {
    /// How long a connection may sit between requests (the node keeps one
    /// open and reconnects when it was closed, so this can be short).
    pub idle: Duration,
    /// How long one request may take to arrive, once it started, and its
    /// response to be taken.
    pub request: Duration,
    /// Connections open at once; more are answered "too many connections"
    /// and closed (and logged, a line a minute).
    pub connections: usize,
    /// Of those, how many only root may take: the helper's user cannot
    /// lock root out by holding connections open.
    pub reserved_for_root: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            idle: Duration::from_secs(30),
            request: Duration::from_secs(5),
            connections: 32,
            reserved_for_root: 4,
        }
    }
}

/// Why the helper stopped serving on its own: it must exit (nonzero), so
/// that systemd starts a fresh one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServeError {
    #[error("the TPM backend panicked; its state is unknown, so the helper exits to be restarted")]
    BackendPanicked,
}

/// The answer to a caller over the limit, sent before its connection is
/// closed: `bcd doctor` shows it.
pub const TOO_MANY: &str = "too many connections open to bcd helper; try again later";

/// Connection slots: a shared pool anyone served may take, and root's
/// reserve.
struct Slots {
    shared: Arc<Semaphore>,
    root: Arc<Semaphore>,
}

impl Slots {
    fn new(limits: &Limits) -> Slots {
        let reserved = limits.reserved_for_root.min(limits.connections);
        Slots {
            shared: Arc::new(Semaphore::new(limits.connections - reserved)),
            root: Arc::new(Semaphore::new(reserved)),
        }
    }

    fn take(&self, uid: u32) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.shared
            .clone()
            .try_acquire_owned()
            .ok()
            .or_else(|| (uid == 0).then(|| self.root.clone().try_acquire_owned().ok())?)
    }
}

/// Serves `listener` until `shutdown` completes. Connections in progress
/// are dropped with the runtime.
pub async fn serve<B: Backend>(
    listener: UnixListener,
    backend: B,
    allowed: Allowed,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let shared = Arc::new(Shared {
        backend: Mutex::new(backend),
        limits,
        warnings: Mutex::new(Refusals::default()),
        fatal: tokio::sync::Notify::new(),
        journal: Arc::new(Semaphore::new(1)),
    });
    let slots = Slots::new(&shared.limits);
    tokio::pin!(shutdown);
    let mut accept_backoff = Duration::from_millis(100);
    let mut refusals = Refusals::default();
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = shared.fatal.notified() => {
                tracing::error!("{}", ServeError::BackendPanicked);
                return Err(ServeError::BackendPanicked);
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    accept_backoff = Duration::from_millis(100);
                    stream
                }
                Err(e) => {
                    // Out of descriptors, usually: wait before trying again.
                    tracing::warn!(error = %e, retryIn = ?accept_backoff, "cannot accept a connection");
                    tokio::time::sleep(accept_backoff).await;
                    accept_backoff = (accept_backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
        };
        let Some((uid, pid)) = peer(&stream) else {
            continue;
        };
        if !allowed.allows(uid) {
            if let Some(count) = refusals.note(uid, std::time::Instant::now()) {
                tracing::warn!(
                    uid,
                    pid,
                    count,
                    "refused a caller that is neither root nor the helper's user"
                );
            }
            continue;
        }
        let Some(slot) = slots.take(uid) else {
            if let Some(count) = shared.warn_due(uid, "too-many") {
                tracing::warn!(
                    uid,
                    pid,
                    count,
                    limit = shared.limits.connections,
                    reservedForRoot = shared.limits.reserved_for_root,
                    "refused a connection: too many open"
                );
            }
            // Said, not only closed, so the caller can tell this from a
            // refused uid: one write of a few bytes into a fresh socket's
            // empty buffer, on the descriptor itself (tokio's try_write
            // would wait for a readiness event not seen yet).
            if let Ok(mut s) = stream.into_std() {
                let _ = std::io::Write::write(&mut s, &proto::frame(&error(TOO_MANY)));
            }
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            connection(stream, uid, &shared).await;
            drop(slot);
        });
    }
}

/// What every connection's task uses.
struct Shared<B> {
    backend: Mutex<B>,
    limits: Limits,
    /// Per-connection warnings, a line a minute per uid and kind: a caller
    /// looping bad frames does not flood the journal.
    warnings: Mutex<Refusals<(u32, &'static str)>>,
    /// Told when the backend panicked: serve returns.
    fatal: tokio::sync::Notify,
    /// One `system.journal` read at a time: a caller cannot make the
    /// helper run many `journalctl`s at once.
    journal: Arc<Semaphore>,
}

impl<B> Shared<B> {
    /// The count to log with a warning of `kind` for `uid`, when one is due.
    fn warn_due(&self, uid: u32, kind: &'static str) -> Option<u64> {
        // Counters only: a poisoned lock still holds usable ones.
        let mut w = self.warnings.lock().unwrap_or_else(|p| p.into_inner());
        w.note((uid, kind), std::time::Instant::now())
    }
}

/// Refused callers (and other warnings), counted so that a loop of
/// connections is one log line a minute per key (a uid, or a uid and a
/// kind), not one per connection.
struct Refusals<K = u32> {
    /// key → when its last line was logged, and refusals since.
    seen: std::collections::HashMap<K, (std::time::Instant, u64)>,
}

impl<K> Default for Refusals<K> {
    fn default() -> Self {
        Refusals {
            seen: std::collections::HashMap::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Copy> Refusals<K> {
    const EVERY: Duration = Duration::from_secs(60);
    /// More keys than this and the table starts over (a uid is 32 bits).
    const MAX_UIDS: usize = 256;

    /// Counts a refusal of `uid`; the count to log, when a line is due.
    fn note(&mut self, uid: K, now: std::time::Instant) -> Option<u64> {
        if self.seen.len() >= Self::MAX_UIDS && !self.seen.contains_key(&uid) {
            self.seen.clear();
        }
        match self.seen.get_mut(&uid) {
            None => {
                self.seen.insert(uid, (now, 0));
                Some(1)
            }
            Some((at, count)) => {
                *count += 1;
                if now.duration_since(*at) < Self::EVERY {
                    return None;
                }
                let logged = *count;
                *at = now;
                *count = 0;
                Some(logged)
            }
        }
    }
}

/// The peer's uid and pid, or `None` (logged) when the kernel cannot say.
fn peer(stream: &UnixStream) -> Option<(u32, i32)> {
    match peer_cred(stream) {
        Ok(cred) => Some((cred.uid(), cred.pid().unwrap_or(0))),
        Err(e) => {
            tracing::warn!(error = %e, "refused a caller whose credentials are unknown");
            None
        }
    }
}

/// SO_PEERCRED; in test builds its failure when `BCD_FAILPOINT` names
/// `helper-peer-credentials-unknown` (the kernel does not fail it on Linux).
fn peer_cred(stream: &UnixStream) -> std::io::Result<tokio::net::unix::UCred> {
    #[cfg(feature = "failpoints")]
    if std::env::var("BCD_FAILPOINT").is_ok_and(|v| v == "helper-peer-credentials-unknown") {
        return Err(std::io::Error::other(
            "failpoint: the kernel gave no credentials",
        ));
    }
    stream.peer_cred()
}

/// One caller's requests, in order, until it closes or misbehaves.
async fn connection<B: Backend>(mut stream: UnixStream, uid: u32, shared: &Shared<B>) {
    let limits = &shared.limits;
    let mut inbox = Inbox::new();
    loop {
        let op = match read_request(&mut stream, &mut inbox, limits).await {
            Ok(Some(op)) => op,
            Ok(None) => return,
            Err(why) => {
                if let Some(count) = shared.warn_due(uid, "closed") {
                    tracing::warn!(uid, count, "closed a connection: {why}");
                }
                return;
            }
        };
        let name = op.name();
        let result = if let Operation::Journal(query) = op {
            // Not the TPM's: off the backend's lock, on a blocking thread
            // (it may take up to its time limit).
            Some(journal(&shared.journal, query).await)
        } else {
            backend_op(shared, &op)
        };
        let Some(result) = result else {
            shared.fatal.notify_one();
            let frame = proto::frame(&error(
                "the helper's TPM backend failed; the helper restarts",
            ));
            let _ = tokio::time::timeout(limits.request, stream.write_all(&frame)).await;
            return;
        };
        if let Some(response::Result::Error(e)) = &result.result {
            if let Some(count) = shared.warn_due(uid, "failed") {
                tracing::warn!(uid, count, operation = name, error = %e.message, "operation failed");
            }
        } else {
            tracing::debug!(uid, operation = name, "served");
        }
        let frame = proto::frame(&result);
        match tokio::time::timeout(limits.request, stream.write_all(&frame)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => {
                tracing::debug!(uid, "the caller left before its response");
                return;
            }
        }
    }
}

/// `op` on the backend; `None` when it panicked.
fn backend_op<B: Backend>(shared: &Shared<B>, op: &Operation) -> Option<Response> {
    // On this task, not a blocking thread: the TPM is one resource used
    // in turn anyway, and a hand-off to another thread and back would
    // cost a signature through the helper about a tenth of its time.
    // A panic in the backend leaves the TPM in a state nobody knows:
    // answered as an error, and the helper exits.
    match shared.backend.lock() {
        Ok(mut b) => {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&mut *b, op))).ok()
        }
        Err(_) => None,
    }
}

/// `system.journal`, when no other read is running.
async fn journal(slot: &Arc<Semaphore>, query: crate::journal::Query) -> Response {
    let Ok(_permit) = slot.clone().try_acquire_owned() else {
        return error("another system journal read is running in bcd helper; try again later");
    };
    match tokio::task::spawn_blocking(move || crate::journal::read(&query)).await {
        Ok(Ok(text)) => Response {
            result: Some(response::Result::Journal(proto::JournalResponse { text })),
        },
        Ok(Err(why)) => error(&why),
        Err(_) => error("the system journal read failed in bcd helper"),
    }
}

/// What a caller sent and the helper has not used yet: at most one whole
/// request (the largest frame fits, nothing bigger is kept), so a request
/// usually arrives in one read.
struct Inbox {
    buf: Box<[u8; 4 + proto::MAX_REQUEST]>,
    filled: usize,
}

impl Inbox {
    fn new() -> Inbox {
        Inbox {
            buf: Box::new([0; 4 + proto::MAX_REQUEST]),
            filled: 0,
        }
    }

    /// The length of the whole frame at the front, once it is all here.
    fn frame_len(&self) -> Result<Option<usize>, &'static str> {
        let Some(prefix) = self.buf[..self.filled].first_chunk::<4>() else {
            return Ok(None);
        };
        let len = 4 + proto::body_len(*prefix, proto::MAX_REQUEST)?;
        Ok((self.filled >= len).then_some(len))
    }

    /// One read; 0 when the caller closed.
    async fn fill(&mut self, stream: &mut UnixStream) -> std::io::Result<usize> {
        let n = stream.read(&mut self.buf[self.filled..]).await?;
        self.filled += n;
        Ok(n)
    }

    /// Takes the frame of `len` bytes at the front: its body.
    fn take(&mut self, len: usize) -> Vec<u8> {
        let body = self.buf[4..len].to_vec();
        self.buf.copy_within(len..self.filled, 0);
        self.filled -= len;
        body
    }
}

/// The next request: `None` when the caller closed between requests.
async fn read_request(
    stream: &mut UnixStream,
    inbox: &mut Inbox,
    limits: &Limits,
) -> Result<Option<Operation>, String> {
    // Waiting for a request's first byte is idle time; the rest of it must
    // follow promptly.
    if inbox.filled == 0 {
        match tokio::time::timeout(limits.idle, inbox.fill(stream)).await {
            Err(_) => return Err("idle for too long".into()),
            Ok(Err(e)) => return Err(format!("cannot read: {e}")),
            Ok(Ok(0)) => return Ok(None),
            Ok(Ok(_)) => {}
        }
    }
    let deadline = tokio::time::Instant::now() + limits.request;
    let len = loop {
        if let Some(len) = inbox.frame_len().map_err(|e| format!("bad request: {e}"))? {
            break len;
        }
        match tokio::time::timeout_at(deadline, inbox.fill(stream)).await {
            Err(_) => return Err("a request that did not arrive in time".into()),
            Ok(Err(e)) => return Err(format!("bad request: {e}")),
            Ok(Ok(0)) => return Err("the caller closed in the middle of a request".into()),
            Ok(Ok(_)) => {}
        }
    };
    let body = inbox.take(len);
    let request =
        proto::Request::decode(body.as_slice()).map_err(|_| "a request that does not decode")?;
    Operation::from_request(request)
        .map(Some)
        .map_err(|e| format!("bad request: {e}"))
}

fn error(message: &str) -> Response {
    Response {
        result: Some(response::Result::Error(proto::ErrorResponse {
            message: message.to_owned(),
        })),
    }
}

/// One operation on the backend, as its response.
fn run<B: Backend>(backend: &mut B, op: &Operation) -> Response {
    use response::Result as R;
    let result = match op {
        Operation::Ak => backend.ak().map(|ak| {
            R::Ak(proto::AkResponse {
                public: ak.public,
                name: ak.name,
                tpm: ak.tpm,
            })
        }),
        Operation::NodeKey { unique } => backend
            .node_key(unique)
            .map(|public| R::NodeKey(proto::NodeKeyResponse { public })),
        Operation::Sign {
            unique,
            hash,
            digest,
        } => backend.sign(unique, *hash, digest).map(|s| {
            R::Sign(proto::SignResponse {
                signature: s.to_vec(),
            })
        }),
        Operation::Machine => backend.machine().map(R::Machine),
        Operation::EventLog => backend
            .event_log()
            .map(|log| R::EventLog(proto::EventLogResponse { log })),
        // Served by `journal`, never the backend.
        Operation::Journal(_) => Err(BackendError("system.journal is not the TPM's".into())),
        Operation::CertifyQuote {
            unique,
            qualifying,
            extra,
            pcrs,
        } => backend
            .certify_quote(unique, qualifying, extra, pcrs)
            .map(|q| {
                R::CertifyQuote(proto::CertifyQuoteResponse {
                    certify: Some(proto::CertifyResponse {
                        certify_info: q.certify_info,
                        signature: q.signature,
                    }),
                    quote: q.quote,
                    quote_signature: q.quote_signature,
                    pcr_values: q.pcr_values,
                })
            }),
        Operation::Certify { unique, qualifying } => {
            backend
                .certify(unique, qualifying)
                .map(|(certify_info, signature)| {
                    R::Certify(proto::CertifyResponse {
                        certify_info,
                        signature,
                    })
                })
        }
    };
    match result {
        Ok(r) => Response { result: Some(r) },
        Err(e) => error(&e.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};

    /// Answers with fixed bytes; counts what it served.
    struct Fixed;

    impl Backend for Fixed {
        fn ak(&mut self) -> Result<AkInfo, BackendError> {
            Ok(AkInfo {
                public: vec![1],
                name: vec![2],
                tpm: "test".into(),
            })
        }
        fn node_key(&mut self, unique: &[u8; 32]) -> Result<Vec<u8>, BackendError> {
            Ok(unique.to_vec())
        }
        fn sign(&mut self, u: &[u8; 32], _: Hash, _: &[u8]) -> Result<[u8; 64], BackendError> {
            let mut s = [0u8; 64];
            s[..32].copy_from_slice(u);
            Ok(s)
        }
        fn certify(&mut self, _: &[u8; 32], _: &[u8]) -> Result<(Vec<u8>, Vec<u8>), BackendError> {
            Err(BackendError("no AK here".into()))
        }
        fn event_log(&mut self) -> Result<Vec<u8>, BackendError> {
            Ok(vec![7; 100_000])
        }
    }

    struct Running {
        path: std::path::PathBuf,
        _dir: tempfile::TempDir,
        _rt: tokio::runtime::Runtime,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
    }

    impl Drop for Running {
        fn drop(&mut self) {
            if let Some(s) = self.stop.take() {
                let _ = s.send(());
            }
        }
    }

    fn start(allowed: Allowed, limits: Limits) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("helper.sock");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt.block_on(async { UnixListener::bind(&path) }).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(serve(listener, Fixed, allowed, limits, async {
            let _ = stopped.await;
        }));
        Running {
            path,
            _dir: dir,
            _rt: rt,
            stop: Some(stop),
        }
    }

    fn me() -> u32 {
        std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
            .unwrap()
    }

    fn ask(s: &mut std::os::unix::net::UnixStream, op: &Operation) -> Option<Response> {
        s.write_all(&proto::frame(&op.to_request())).ok()?;
        let mut prefix = [0u8; 4];
        s.read_exact(&mut prefix).ok()?;
        let mut body = vec![0u8; u32::from_be_bytes(prefix) as usize];
        s.read_exact(&mut body).ok()?;
        Response::decode(body.as_slice()).ok()
    }

    fn connect(r: &Running) -> std::os::unix::net::UnixStream {
        let s = std::os::unix::net::UnixStream::connect(&r.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    fn closed(s: &mut std::os::unix::net::UnixStream) -> bool {
        let mut b = [0u8; 1];
        matches!(s.read(&mut b), Ok(0)) || s.read(&mut b).is_err()
    }

    #[test]
    fn serves_requests_in_order_and_reports_backend_errors() {
        let r = start(Allowed::only(&[me()]), Limits::default());
        let mut s = connect(&r);
        let got = ask(&mut s, &Operation::NodeKey { unique: [9; 32] }).unwrap();
        assert_eq!(
            got.result,
            Some(response::Result::NodeKey(proto::NodeKeyResponse {
                public: vec![9; 32]
            }))
        );
        let op = Operation::Certify {
            unique: [1; 32],
            qualifying: vec![0; 32],
        };
        let got = ask(&mut s, &op).unwrap();
        assert!(
            matches!(got.result, Some(response::Result::Error(ref e)) if e.message == "no AK here"),
            "{got:?}"
        );
        // A log larger than any TPM answer, whole.
        let got = ask(&mut s, &Operation::EventLog).unwrap();
        assert!(
            matches!(got.result, Some(response::Result::EventLog(ref l)) if l.log == vec![7; 100_000]),
            "{:?}",
            got.result.map(|_| ())
        );
        // A backend that does not read the machine says so.
        let got = ask(&mut s, &Operation::Machine).unwrap();
        assert!(
            matches!(got.result, Some(response::Result::Error(ref e)) if e.message.contains("does not read the machine")),
            "{got:?}"
        );
    }

    #[test]
    fn refuses_a_uid_it_does_not_serve_before_reading() {
        let r = start(Allowed::only(&[me().wrapping_add(1)]), Limits::default());
        let mut s = connect(&r);
        assert!(ask(&mut s, &Operation::Ak).is_none());
        assert!(closed(&mut s));
    }

    #[test]
    fn a_bad_frame_closes_its_connection_only() {
        let r = start(Allowed::only(&[me()]), Limits::default());
        let mut good = connect(&r);
        assert!(ask(&mut good, &Operation::Ak).is_some());
        // Oversized: refused on its length alone.
        let mut big = connect(&r);
        big.write_all(&(proto::MAX_REQUEST as u32 + 1).to_be_bytes())
            .unwrap();
        assert!(closed(&mut big));
        // Malformed: not protobuf.
        let mut junk = connect(&r);
        junk.write_all(&[0, 0, 0, 3, 0xff, 0xff, 0xff]).unwrap();
        assert!(closed(&mut junk));
        // Well-formed protobuf, bad operation: a 31-byte unique.
        let mut short = connect(&r);
        let req = proto::Request {
            op: Some(proto::request::Op::NodeKey(proto::NodeKeyRequest {
                unique: vec![0; 31],
            })),
        };
        short.write_all(&proto::frame(&req)).unwrap();
        assert!(closed(&mut short));
        // The first caller is still served.
        assert!(ask(&mut good, &Operation::NodeKey { unique: [1; 32] }).is_some());
    }

    #[test]
    fn refusals_are_one_line_a_minute_per_uid() {
        let mut r = Refusals::<u32>::default();
        let t0 = std::time::Instant::now();
        assert_eq!(r.note(7, t0), Some(1));
        for i in 1..100 {
            assert_eq!(r.note(7, t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(r.note(8, t0), Some(1), "another uid is its own line");
        assert_eq!(r.note(7, t0 + Duration::from_secs(61)), Some(100));
        assert_eq!(r.note(7, t0 + Duration::from_secs(62)), None);
        for uid in 1000..1300 {
            r.note(uid, t0);
        }
        assert!(r.seen.len() <= Refusals::<u32>::MAX_UIDS);
    }

    #[test]
    fn requests_split_or_sent_together_are_each_answered() {
        let r = start(Allowed::only(&[me()]), Limits::default());
        let mut s = connect(&r);
        let one = proto::frame(&Operation::NodeKey { unique: [1; 32] }.to_request());
        let two = proto::frame(&Operation::NodeKey { unique: [2; 32] }.to_request());
        // Two in one write, then one a byte at a time.
        s.write_all(&[one.clone(), two].concat()).unwrap();
        for b in &one {
            s.write_all(std::slice::from_ref(b)).unwrap();
        }
        for want in [1u8, 2, 1] {
            let mut prefix = [0u8; 4];
            s.read_exact(&mut prefix).unwrap();
            let mut body = vec![0u8; u32::from_be_bytes(prefix) as usize];
            s.read_exact(&mut body).unwrap();
            let got = Response::decode(body.as_slice()).unwrap();
            assert_eq!(
                got.result,
                Some(response::Result::NodeKey(proto::NodeKeyResponse {
                    public: vec![want; 32]
                }))
            );
        }
    }

    #[test]
    fn a_request_that_stalls_is_cut_and_others_go_on() {
        let limits = Limits {
            request: Duration::from_millis(200),
            ..Limits::default()
        };
        let r = start(Allowed::only(&[me()]), limits);
        let mut slow = connect(&r);
        slow.write_all(&[0, 0]).unwrap();
        let mut other = connect(&r);
        assert!(ask(&mut other, &Operation::Ak).is_some());
        assert!(closed(&mut slow));
    }

    #[test]
    fn concurrent_callers_are_all_served() {
        let r = start(Allowed::only(&[me()]), Limits::default());
        let path = r.path.clone();
        let threads: Vec<_> = (0..8u8)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
                    (0..20)
                        .filter(|_| {
                            let op = Operation::Sign {
                                unique: [i; 32],
                                hash: Hash::Sha256,
                                digest: vec![0; 32],
                            };
                            matches!(ask(&mut s, &op).and_then(|r| r.result),
                                Some(response::Result::Sign(sig)) if sig.signature[0] == i)
                        })
                        .count()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 20);
        }
    }

    /// Panics at its first `tpm.ak`.
    struct Panics;

    impl Backend for Panics {
        fn ak(&mut self) -> Result<AkInfo, BackendError> {
            panic!("a backend bug");
        }
        fn node_key(&mut self, _: &[u8; 32]) -> Result<Vec<u8>, BackendError> {
            Ok(vec![])
        }
        fn sign(&mut self, _: &[u8; 32], _: Hash, _: &[u8]) -> Result<[u8; 64], BackendError> {
            Ok([0; 64])
        }
        fn certify(&mut self, _: &[u8; 32], _: &[u8]) -> Result<(Vec<u8>, Vec<u8>), BackendError> {
            Ok((vec![], vec![]))
        }
    }

    async fn ask_async(s: &mut UnixStream, op: &Operation) -> Option<Response> {
        s.write_all(&proto::frame(&op.to_request())).await.ok()?;
        let mut prefix = [0u8; 4];
        s.read_exact(&mut prefix).await.ok()?;
        let mut body = vec![0u8; u32::from_be_bytes(prefix) as usize];
        s.read_exact(&mut body).await.ok()?;
        Response::decode(body.as_slice()).ok()
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_after_the_idle_time_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("helper.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let limits = Limits::default();
        assert!(limits.idle <= Duration::from_secs(30), "{:?}", limits.idle);
        let idle = limits.idle;
        tokio::spawn(serve(
            listener,
            Fixed,
            Allowed::only(&[me()]),
            limits,
            std::future::pending(),
        ));
        let mut s = UnixStream::connect(&path).await.unwrap();
        assert!(ask_async(&mut s, &Operation::Ak).await.is_some());
        // Just under the idle time: still served.
        tokio::time::sleep(idle - Duration::from_secs(1)).await;
        assert!(ask_async(&mut s, &Operation::Ak).await.is_some());
        // Past it: closed by the helper, at the idle time.
        let start = tokio::time::Instant::now();
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(idle * 2, s.read(&mut b)).await;
        assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{n:?}");
        assert_eq!(start.elapsed().as_secs(), idle.as_secs());
    }

    #[test]
    fn root_keeps_its_reserve_when_others_hold_the_rest() {
        let limits = Limits {
            connections: 3,
            reserved_for_root: 1,
            ..Limits::default()
        };
        let slots = Slots::new(&limits);
        let held: Vec<_> = (0..2)
            .map(|_| slots.take(1).expect("a shared slot"))
            .collect();
        assert!(slots.take(1).is_none(), "the node's user is over its share");
        let root = slots.take(0).expect("root's reserved slot");
        assert!(slots.take(0).is_none(), "all taken");
        drop(held);
        assert!(slots.take(1).is_some());
        drop(root);
    }

    #[test]
    fn a_caller_over_the_limit_is_told_too_many_connections() {
        let limits = Limits {
            connections: 1,
            reserved_for_root: 0,
            ..Limits::default()
        };
        let r = start(Allowed::only(&[me()]), limits);
        let mut holder = connect(&r);
        assert!(ask(&mut holder, &Operation::Ak).is_some());
        let err = crate::Client::new(&r.path).ak().unwrap_err();
        assert!(
            matches!(&err, crate::ClientError::Helper(m) if m == TOO_MANY),
            "{err:?}"
        );
        // The holder is still served.
        assert!(ask(&mut holder, &Operation::Ak).is_some());
    }

    #[test]
    fn warnings_are_a_line_a_minute_per_uid_and_kind() {
        let mut r = Refusals::<(u32, &'static str)>::default();
        let t0 = std::time::Instant::now();
        assert_eq!(r.note((7, "closed"), t0), Some(1));
        assert_eq!(r.note((7, "failed"), t0), Some(1));
        for i in 1..50 {
            assert_eq!(r.note((7, "closed"), t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(
            r.note((7, "closed"), t0 + Duration::from_secs(61)),
            Some(50)
        );
    }

    #[tokio::test]
    async fn a_panicking_backend_ends_serve_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("helper.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let served = tokio::spawn(serve(
            listener,
            Panics,
            Allowed::only(&[me()]),
            Limits::default(),
            std::future::pending(),
        ));
        let mut s = UnixStream::connect(&path).await.unwrap();
        let got = ask_async(&mut s, &Operation::Ak).await.unwrap();
        assert!(
            matches!(got.result, Some(response::Result::Error(ref e)) if e.message.contains("restarts")),
            "{got:?}"
        );
        let end = tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("serve returned")
            .unwrap();
        assert_eq!(end, Err(ServeError::BackendPanicked));
    }
}
