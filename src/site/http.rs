//! The plain-HTTP/1.x server iPXE talks to, on hyper: GET (and HEAD) only,
//! bounded in what a client may hold of it. It takes its listener and
//! shutdown from the caller and asks a [`Respond`] ([`Site`]) what to
//! answer.
//!
//! The bounds, all per connection (see [`Limits`]):
//! - connections: at most `[site] max_connections`, of them at most
//!   `max_connections_per_source` from one address
//!   ([`bc_connlimit`], shared with the control plane). A source at
//!   its cap has its new connections closed at once; when the server is
//!   full, the connection idle the longest (an unfinished request head, an
//!   idle keep-alive) is closed to make room. A request being answered is
//!   never closed for another.
//! - time: a request head within [`HEAD_TIMEOUT`] of the connection (or of
//!   the previous answer); a script within [`SCRIPT_TIMEOUT`]; a download
//!   within [`TRANSFER_GRACE`] plus its size at [`MIN_RATE`], so a reader
//!   that stalls is cut, and a ramdisk of 40 MiB has almost three minutes.
//! - size: a request head of at most 8 KiB (431 beyond).
//!
//! A connection is closed after its answer unless the client asked to keep
//! it (`Connection: keep-alive`).

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bc_connlimit::{
    serve_connections, AcceptPolicy, Deadline, Refusal, RefusedCount, Slot, Tracker,
};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::image::Served;
use super::service::{Response, Site};

/// The longest request head read (hyper's smallest buffer).
pub(crate) const MAX_HEAD: usize = 8 * 1024;
/// How long a client has to send its request head, from its connection or
/// the end of its previous answer.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a script may take to answer (its SecretRequest included).
pub(crate) const SCRIPT_TIMEOUT: Duration = Duration::from_secs(30);
/// A download's deadline: this, plus its size at [`MIN_RATE`].
pub(crate) const TRANSFER_GRACE: Duration = Duration::from_secs(30);
/// The slowest download served to its end, in bytes a second (a firmware
/// on a busy 100 Mbit/s link does thirty times better).
pub(crate) const MIN_RATE: u64 = 256 * 1024;
/// A file is sent this much at a time.
const CHUNK: usize = 64 * 1024;
/// Connections refused by the caps are logged at most this often.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);
/// How long a connection closed on an error reads what its client still
/// sends (see [`linger`]).
const LINGER: Duration = Duration::from_secs(1);
/// A failing `accept` (out of descriptors) is retried after 100 ms; at
/// shutdown, open connections are closed at once.
const ACCEPT: AcceptPolicy = AcceptPolicy {
    backoff_first: Duration::from_millis(100),
    backoff_max: Duration::from_millis(100),
    drain: None,
};

/// What the server holds clients to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_connections: usize,
    pub max_per_source: usize,
    pub head_timeout: Duration,
    pub script_timeout: Duration,
    pub transfer_grace: Duration,
    /// Bytes a second.
    pub min_rate: u64,
}

impl Limits {
    /// The caps `[site]` sets, the timeouts above.
    pub fn new(max_connections: usize, max_per_source: usize) -> Limits {
        Limits {
            max_connections,
            max_per_source,
            head_timeout: HEAD_TIMEOUT,
            script_timeout: SCRIPT_TIMEOUT,
            transfer_grace: TRANSFER_GRACE,
            min_rate: MIN_RATE,
        }
    }

    /// How long a download of `bytes` may take.
    pub(crate) fn transfer_timeout(&self, bytes: u64) -> Duration {
        self.transfer_grace + Duration::from_secs(bytes / self.min_rate.max(1))
    }
}

/// What answers a request (the [`Site`]; a stand-in in the tests).
pub trait Respond: Send + Sync + 'static {
    fn respond(
        self: Arc<Self>,
        path: String,
        query: String,
        peer: IpAddr,
    ) -> impl Future<Output = Response> + Send;
}

impl Respond for Site {
    async fn respond(self: Arc<Self>, path: String, query: String, peer: IpAddr) -> Response {
        Site::respond(&self, &path, &query, peer).await
    }
}

/// Serves until `shutdown` changes, then closes every connection. The
/// accept loop is [`bc_connlimit::serve_connections`], the control plane's
/// too.
pub(crate) async fn serve<R: Respond>(
    listener: TcpListener,
    site: Arc<R>,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let tracker = Tracker::new(limits.max_connections, limits.max_per_source);
    let mut refused = RefusedCount::new(REFUSED_LOG_EVERY);
    let shutdown = async move {
        let _ = shutdown.changed().await;
    };
    serve_connections(
        listener,
        &tracker,
        ACCEPT,
        shutdown,
        |why, peer| log_refused(&mut refused, why, peer, &limits),
        |stream, peer, slot, _stop| connection(stream, peer, site.clone(), slot, limits),
    )
    .await;
}

/// One connection: its requests under the deadline of the phase it is in,
/// closed early when the server needs its slot.
pub async fn connection<R: Respond, IO>(
    mut io: IO,
    peer: SocketAddr,
    site: Arc<R>,
    slot: Slot,
    limits: Limits,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let slot = Arc::new(slot);
    let deadline = Deadline::after(limits.head_timeout);
    let (s, d) = (slot.clone(), deadline.clone());
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let done = Done {
            slot: s.clone(),
            deadline: d.clone(),
            idle: limits.head_timeout,
        };
        let site = site.clone();
        async move { Ok::<_, Infallible>(answer(site, req, peer, &limits, done).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_buf_size(MAX_HEAD);
    let failed = {
        let conn = builder.serve_connection(TokioIo::new(&mut io), svc);
        tokio::select! {
            r = conn => r.err(),
            () = deadline.passed() => {
                tracing::debug!(peer = %peer, "connection timed out; closed");
                None
            }
            () = slot.evicted() => {
                tracing::debug!(peer = %peer, "idle connection closed to make room");
                None
            }
        }
    };
    if let Some(e) = failed {
        tracing::debug!(peer = %peer, error = %e, "connection ended");
        // hyper may have answered (a 431 for a head too large) with the
        // request still unread: closing now would reset the connection
        // before the client read the answer.
        linger(&mut io).await;
    }
}

/// Ends our side, then reads (and drops) what the client still sends,
/// briefly and boundedly, until it closes too.
async fn linger<IO: AsyncRead + AsyncWrite + Unpin>(io: &mut IO) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let _ = io.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async {
        let mut total = 0usize;
        while total < 64 * 1024 {
            match io.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Marks the connection idle again when its answer has been sent (or
/// dropped): evictable, and with [`Limits::head_timeout`] for the next head.
struct Done {
    slot: Arc<Slot>,
    deadline: Deadline,
    idle: Duration,
}

impl Drop for Done {
    fn drop(&mut self) {
        self.deadline.reset(self.idle);
        self.slot.idle();
    }
}

async fn answer<R: Respond>(
    site: Arc<R>,
    req: Request<Incoming>,
    peer: SocketAddr,
    limits: &Limits,
    done: Done,
) -> hyper::Response<Reply> {
    done.slot.busy();
    done.deadline.reset(limits.script_timeout);
    let keep_alive = asks_keep_alive(&req);
    let head_only = req.method() == Method::HEAD;
    let reply =
        |code, text: &'static str| text_reply(code, Bytes::from_static(text.as_bytes()), head_only);
    let resp = if req.method() != Method::GET && !head_only {
        reply(StatusCode::METHOD_NOT_ALLOWED, "GET only\n")
    } else if req.uri().scheme().is_some() || req.uri().authority().is_some() {
        // Origin form only (`GET /boot.ipxe?… HTTP/1.1`), as iPXE sends.
        reply(StatusCode::BAD_REQUEST, "bad request\n")
    } else {
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or_default().to_owned();
        match site.respond(path, query, peer.ip()).await {
            Response::Script(text) => text_reply(StatusCode::OK, Bytes::from(text), head_only),
            Response::NotFound => reply(StatusCode::NOT_FOUND, "not found\n"),
            Response::File(served) => {
                done.deadline.reset(limits.transfer_timeout(served.total()));
                file_reply(served, head_only)
            }
        }
    };
    let (mut parts, mut body) = resp.into_parts();
    body.done = Some(done);
    if !keep_alive {
        parts
            .headers
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    hyper::Response::from_parts(parts, body)
}

/// Whether the client asked to keep the connection (iPXE may); others get
/// `Connection: close`, as from bcd site before.
fn asks_keep_alive(req: &Request<Incoming>) -> bool {
    req.headers().get_all(CONNECTION).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("keep-alive"))
        })
    })
}

fn text_reply(code: StatusCode, text: Bytes, head_only: bool) -> hyper::Response<Reply> {
    let len = text.len();
    let body = Reply {
        kind: Kind::Text((!head_only).then_some(text)),
        done: None,
    };
    with_head(code, "text/plain", len as u64, body)
}

fn file_reply(served: Served, head_only: bool) -> hyper::Response<Reply> {
    let total = served.total();
    let kind = if head_only {
        Kind::Text(None)
    } else {
        Kind::File {
            file: tokio::fs::File::from_std(served.file),
            left: served.len,
            suffix: Some(served.suffix).filter(|s| !s.is_empty()),
            buf: vec![0u8; CHUNK],
        }
    };
    with_head(
        StatusCode::OK,
        "application/octet-stream",
        total,
        Reply { kind, done: None },
    )
}

fn with_head(
    code: StatusCode,
    kind: &'static str,
    len: u64,
    body: Reply,
) -> hyper::Response<Reply> {
    let mut resp = hyper::Response::new(body);
    *resp.status_mut() = code;
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(CONTENT_LENGTH, HeaderValue::from(len));
    resp
}

/// An answer's body: a text, or a ramdisk file's first `left` bytes then
/// its suffix, read as it is sent.
pub(crate) struct Reply {
    kind: Kind,
    done: Option<Done>,
}

enum Kind {
    Text(Option<Bytes>),
    File {
        file: tokio::fs::File,
        left: u64,
        suffix: Option<Bytes>,
        buf: Vec<u8>,
    },
}

impl Body for Reply {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        let next = match &mut this.kind {
            Kind::Text(text) => text.take().map(|t| Ok(Frame::data(t))),
            Kind::File {
                file,
                left,
                suffix,
                buf,
            } => {
                if *left > 0 {
                    let want = usize::try_from(*left).map_or(CHUNK, |l| l.min(CHUNK));
                    let mut rb = ReadBuf::new(&mut buf[..want]);
                    match Pin::new(file).poll_read(cx, &mut rb) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(e)) => Some(Err(e)),
                        // Shorter than when opened (truncated in place):
                        // the client sees a short body.
                        Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                            Some(Err(std::io::ErrorKind::UnexpectedEof.into()))
                        }
                        Poll::Ready(Ok(())) => {
                            *left -= rb.filled().len() as u64;
                            Some(Ok(Frame::data(Bytes::copy_from_slice(rb.filled()))))
                        }
                    }
                } else {
                    suffix.take().map(|s| Ok(Frame::data(s)))
                }
            }
        };
        if next.is_none() {
            // Sent: idle from now on.
            this.done = None;
        }
        Poll::Ready(next)
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Text(t) => t.is_none(),
            Kind::File { left, suffix, .. } => *left == 0 && suffix.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Text(t) => SizeHint::with_exact(t.as_ref().map_or(0, |t| t.len() as u64)),
            Kind::File { left, suffix, .. } => {
                SizeHint::with_exact(left + suffix.as_ref().map_or(0, |s| s.len() as u64))
            }
        }
    }
}

/// Logs a connection the caps refused: one warning at most every
/// [`REFUSED_LOG_EVERY`], with how many since the last.
fn log_refused(count: &mut RefusedCount, why: Refusal, peer: SocketAddr, limits: &Limits) {
    let Some(refused) = count.note() else {
        return;
    };
    let reason = match why {
        Refusal::PerSource => "its source holds max_connections_per_source",
        Refusal::Full => "every connection is answering a request",
    };
    tracing::warn!(
        refused,
        last_peer = %peer.ip(),
        last_reason = reason,
        max_connections = limits.max_connections,
        max_connections_per_source = limits.max_per_source,
        "connections refused ([site] max_connections, max_connections_per_source)"
    );
}

#[cfg(test)]
mod tests {
    //! The server on tokio's paused clock: every deadline is seen to fire
    //! at its time, without waiting for it. The connections are in-memory
    //! pipes; the answers a stand-in's (a script, a file).

    use super::*;
    use std::io::Write as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};
    use tokio::time::Instant;

    struct Stub {
        file: tempfile::NamedTempFile,
    }

    impl Respond for Stub {
        async fn respond(self: Arc<Self>, path: String, _: String, _: IpAddr) -> Response {
            match path.as_str() {
                "/script" => Response::Script("#!ipxe\nexit 1\n".to_owned()),
                "/file" => {
                    let file = std::fs::File::open(self.file.path()).unwrap();
                    let len = file.metadata().unwrap().len();
                    Response::File(Served {
                        file,
                        len,
                        suffix: Bytes::from_static(b"-suffix"),
                    })
                }
                _ => Response::NotFound,
            }
        }
    }

    const FILE_BYTES: usize = 4 << 20;

    fn stub() -> Arc<Stub> {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(&vec![7u8; FILE_BYTES]).unwrap();
        Arc::new(Stub { file })
    }

    fn limits() -> Limits {
        Limits {
            min_rate: 1 << 20,
            ..Limits::new(4, 2)
        }
    }

    fn peer(last: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], 40000))
    }

    /// A connection from `peer(last)` served on a pipe of 64 KiB.
    fn open(
        tracker: &Arc<Tracker>,
        last: u8,
        site: &Arc<Stub>,
    ) -> (DuplexStream, tokio::task::JoinHandle<()>) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let slot = tracker.admit(peer(last).ip()).unwrap();
        let task = tokio::spawn(connection(server, peer(last), site.clone(), slot, limits()));
        (client, task)
    }

    /// Reads until the server closes: (what came, when it closed).
    async fn until_closed(client: &mut DuplexStream) -> (Vec<u8>, Instant) {
        let mut got = Vec::new();
        let _ = client.read_to_end(&mut got).await;
        (got, Instant::now())
    }

    fn head_of(answer: &[u8]) -> String {
        let end = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase()
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_head_not_finished_in_time_is_closed_at_the_head_deadline() {
        let tracker = Tracker::new(4, 2);
        let site = stub();
        let started = Instant::now();
        let (mut client, task) = open(&tracker, 1, &site);
        client
            .write_all(b"GET /script HTTP/1.1\r\nHost: s")
            .await
            .unwrap();
        let (_, closed) = until_closed(&mut client).await;
        task.await.unwrap();
        let took = closed - started;
        assert!(
            took >= HEAD_TIMEOUT && took < HEAD_TIMEOUT + Duration::from_secs(1),
            "{took:?}"
        );
        assert_eq!(tracker.held(), 0, "its slot is free");
    }

    #[tokio::test(start_paused = true)]
    async fn answers_close_unless_kept_alive_and_an_idle_keep_alive_is_closed_in_time() {
        let tracker = Tracker::new(4, 2);
        let site = stub();
        let (mut client, task) = open(&tracker, 1, &site);
        client
            .write_all(b"GET /script HTTP/1.1\r\nHost: s\r\n\r\n")
            .await
            .unwrap();
        let (answer, _) = until_closed(&mut client).await;
        task.await.unwrap();
        let head = head_of(&answer);
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        assert!(answer.ends_with(b"#!ipxe\nexit 1\n"));

        // Kept alive: a second request on it, then closed once idle for
        // the head deadline.
        let (mut client, task) = open(&tracker, 1, &site);
        let ask = b"GET /script HTTP/1.1\r\nHost: s\r\nConnection: keep-alive\r\n\r\n";
        client.write_all(ask).await.unwrap();
        let mut first = vec![0u8; 256];
        let n = client.read(&mut first).await.unwrap();
        assert!(!head_of(&first[..n]).contains("connection: close"));
        client.write_all(ask).await.unwrap();
        let answered = Instant::now();
        let (rest, closed) = until_closed(&mut client).await;
        task.await.unwrap();
        assert!(head_of(&rest).starts_with("http/1.1 200"));
        let idle = closed - answered;
        assert!(
            idle >= HEAD_TIMEOUT && idle < HEAD_TIMEOUT + Duration::from_secs(1),
            "{idle:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_download_is_cut_at_its_transfer_deadline() {
        let tracker = Tracker::new(4, 2);
        let site = stub();
        let (mut client, task) = open(&tracker, 1, &site);
        client
            .write_all(b"GET /file HTTP/1.1\r\nHost: s\r\n\r\n")
            .await
            .unwrap();
        let asked = Instant::now();
        let mut some = vec![0u8; 1024];
        client.read_exact(&mut some).await.unwrap();
        assert!(head_of(&some).contains(&format!("content-length: {}", FILE_BYTES + 7)));
        // The reader stalls; the server is cut off at 30 s + 4 MiB at 1 MiB/s.
        task.await.unwrap();
        let took = asked.elapsed();
        let want = limits().transfer_timeout(FILE_BYTES as u64 + 7);
        assert_eq!(want, Duration::from_secs(34));
        assert!(
            took >= want && took < want + Duration::from_secs(1),
            "{took:?}"
        );
        let (rest, _) = until_closed(&mut client).await;
        assert!(some.len() + rest.len() < FILE_BYTES, "the body was cut");
        assert_eq!(tracker.held(), 0);

        // A reader that keeps up gets all of it, the suffix last.
        let (mut client, task) = open(&tracker, 1, &site);
        client
            .write_all(b"GET /file HTTP/1.1\r\nHost: s\r\n\r\n")
            .await
            .unwrap();
        let (answer, _) = until_closed(&mut client).await;
        task.await.unwrap();
        let head = head_of(&answer);
        assert_eq!(answer.len() - head.len() - 4, FILE_BYTES + 7);
        assert!(answer.ends_with(b"\x07-suffix"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_server_closes_the_longest_idle_never_a_download() {
        let tracker = Tracker::new(2, 2);
        let site = stub();
        // Two connections: one idle since its accept, one downloading.
        let (mut idle, idle_task) = open(&tracker, 1, &site);
        let (mut busy, busy_task) = open(&tracker, 1, &site);
        busy.write_all(b"GET /file HTTP/1.1\r\nHost: s\r\n\r\n")
            .await
            .unwrap();
        let mut some = vec![0u8; 1024];
        busy.read_exact(&mut some).await.unwrap();
        let started = Instant::now();
        // A third source: the idle one makes room, at once.
        let slot = tracker.admit(peer(2).ip()).unwrap();
        let (_, closed) = until_closed(&mut idle).await;
        idle_task.await.unwrap();
        assert_eq!(closed, started, "closed at once, not at its deadline");
        // Full with a download and the newcomer busy: refused, the
        // download goes on.
        slot.busy();
        assert_eq!(tracker.admit(peer(3).ip()).err(), Some(Refusal::Full));
        let (rest, _) = until_closed(&mut busy).await;
        busy_task.await.unwrap();
        assert_eq!(
            some.len() + rest.len() - head_of(&some).len() - 4,
            FILE_BYTES + 7
        );
    }

    #[tokio::test(start_paused = true)]
    async fn heads_past_8_kib_methods_other_than_get_and_head_requests() {
        let tracker = Tracker::new(4, 2);
        let site = stub();
        let ask = |req: Vec<u8>| {
            let (mut client, task) = open(&tracker, 1, &site);
            async move {
                client.write_all(&req).await.unwrap();
                let (answer, _) = until_closed(&mut client).await;
                task.await.unwrap();
                answer
            }
        };
        let long = format!(
            "GET /script?pad={} HTTP/1.1\r\nHost: s\r\n\r\n",
            "x".repeat(9000)
        );
        assert!(head_of(&ask(long.into_bytes()).await).starts_with("http/1.1 431"));
        let post = b"POST /script HTTP/1.1\r\nHost: s\r\nContent-Length: 0\r\n\r\n".to_vec();
        assert!(head_of(&ask(post).await).starts_with("http/1.1 405"));
        let absolute = b"GET http://s/script HTTP/1.1\r\nHost: s\r\n\r\n".to_vec();
        assert!(head_of(&ask(absolute).await).starts_with("http/1.1 400"));
        let answer = ask(b"HEAD /file HTTP/1.1\r\nHost: s\r\n\r\n".to_vec()).await;
        let head = head_of(&answer);
        assert!(
            head.contains(&format!("content-length: {}", FILE_BYTES + 7)),
            "{head}"
        );
        assert_eq!(answer.len(), head.len() + 4, "no body");
        let missing = ask(b"GET /etc/passwd HTTP/1.0\r\n\r\n".to_vec()).await;
        assert!(
            head_of(&missing).starts_with("http/1.0 404")
                || head_of(&missing).starts_with("http/1.1 404")
        );
    }
}
