//! The accept loop both servers run: accept with TCP_NODELAY, back off a
//! failing `accept` (out of descriptors, ...), admit each connection into
//! the [`Tracker`] or close it at once, serve it on its own task, and at
//! shutdown stop accepting, then let open connections finish or close them.
//! What a connection is served with, and how a refusal is logged (it names
//! the server's own settings), stay with each server.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::{Refusal, Slot, Tracker};

/// How a server accepts, and how it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptPolicy {
    /// The pause after a failed `accept`, doubling while it keeps failing...
    pub backoff_first: Duration,
    /// ... up to this.
    pub backoff_max: Duration,
    /// How long open connections get to finish after shutdown starts (told
    /// through their [`Stop`]); `None`: they are closed at once.
    pub drain: Option<Duration>,
}

/// Becomes `true` when the server stops: the connection should finish its
/// request and close.
pub type Stop = watch::Receiver<bool>;

/// Serves connections from `listener` until `shutdown` completes: each one
/// admitted into `tracker` is served by `connection` on a task of its own;
/// one over the limits is closed at once and told to `refused`. Then stops
/// accepting and ends the open connections as `policy.drain` says.
///
/// A failing `accept` never stops the server: it is logged once with the
/// pause that follows (`retry_in_ms`), and exactly that pause is taken
/// before `accept` is called again (see [`AcceptPolicy`]).
pub async fn serve_connections<C, F>(
    listener: TcpListener,
    tracker: &Arc<Tracker>,
    policy: AcceptPolicy,
    shutdown: impl Future<Output = ()>,
    mut refused: impl FnMut(Refusal, SocketAddr),
    mut connection: C,
) where
    C: FnMut(TcpStream, SocketAddr, Slot, Stop) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = AcceptBackoff::new(policy.backoff_first, policy.backoff_max);
    loop {
        // Reap finished connections so the set does not grow without bound.
        while conns.try_join_next().is_some() {}
        let accepted = accept_next(
            || accept(&listener),
            &mut backoff,
            shutdown.as_mut(),
            || tracker.held(),
        );
        let Some((tcp, peer)) = accepted.await else {
            break;
        };
        let slot = match tracker.admit(peer.ip()) {
            Ok(s) => s,
            Err(why) => {
                // Closed at once: the source (or every slot) is busy.
                refused(why, peer);
                continue;
            }
        };
        conns.spawn(connection(tcp, peer, slot, stop_rx.clone()));
    }
    drop(listener);
    let Some(within) = policy.drain else {
        conns.shutdown().await;
        return;
    };
    let _ = stop_tx.send(true);
    let drained =
        tokio::time::timeout(within, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!("connections still open after shutdown; closing them");
        conns.shutdown().await;
    }
}

/// The next connection, with TCP_NODELAY: a TLS handshake and an answer go
/// out in several writes (head, body chunks), and Nagle's algorithm would
/// hold the last back until the client's delayed ACK, 40 ms later.
async fn accept(listener: &TcpListener) -> io::Result<(TcpStream, SocketAddr)> {
    let (tcp, peer) = listener.accept().await?;
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(peer = %peer, error = %e, "cannot set TCP_NODELAY");
    }
    Ok((tcp, peer))
}

/// The pause after a failed `accept`: the first, doubling to the last while
/// `accept` keeps failing, the first again after a connection is accepted.
#[derive(Debug)]
struct AcceptBackoff {
    next: Duration,
    first: Duration,
    max: Duration,
}

impl AcceptBackoff {
    fn new(first: Duration, max: Duration) -> Self {
        AcceptBackoff {
            next: first,
            first,
            max,
        }
    }

    /// The pause to take now (logged, then slept); the next one doubles.
    fn failed(&mut self) -> Duration {
        let pause = self.next;
        self.next = (pause * 2).min(self.max);
        pause
    }

    fn accepted(&mut self) {
        self.next = self.first;
    }
}

/// The next connection from `accept`. Each failure is logged once with the
/// pause that follows (`retry_in_ms`), and exactly that pause is taken
/// before `accept` is called again, so a failing `accept` costs a log line
/// per pause rather than a busy loop. None once `shutdown` completes, which
/// also ends a pause.
async fn accept_next<T, F>(
    mut accept: impl FnMut() -> F,
    backoff: &mut AcceptBackoff,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
    held: impl Fn() -> usize,
) -> Option<T>
where
    F: Future<Output = io::Result<T>>,
{
    loop {
        tokio::select! {
            biased;
            () = shutdown.as_mut() => return None,
            accepted = accept() => match accepted {
                Ok(a) => {
                    backoff.accepted();
                    return Some(a);
                }
                Err(e) => {
                    let pause = backoff.failed();
                    tracing::warn!(error = %e, retry_in_ms = pause.as_millis() as u64,
                        held = held(), "accept failed");
                    tokio::select! {
                        biased;
                        () = shutdown.as_mut() => return None,
                        () = tokio::time::sleep(pause) => {}
                    }
                }
            },
        }
    }
}

/// Counts connections refused by the limits, so that a flood of them is
/// logged at most once every so often, with how many since the last line.
#[derive(Debug)]
pub struct RefusedCount {
    every: Duration,
    since_log: u64,
    last_log: Option<Instant>,
}

impl RefusedCount {
    /// A line at most every `every`.
    pub fn new(every: Duration) -> Self {
        RefusedCount {
            every,
            since_log: 0,
            last_log: None,
        }
    }

    /// Counts one refusal; when a line is due, how many to log (this one
    /// included), and the count starts over.
    pub fn note(&mut self) -> Option<u64> {
        self.since_log += 1;
        if self.last_log.is_some_and(|t| t.elapsed() < self.every) {
            return None;
        }
        let refused = std::mem::take(&mut self.since_log);
        self.last_log = Some(Instant::now());
        Some(refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The control plane's pauses: 10 ms doubling to a second.
    fn doubling() -> AcceptBackoff {
        AcceptBackoff::new(Duration::from_millis(10), Duration::from_secs(1))
    }

    /// What the loop accepts is set TCP_NODELAY (a real socket: an
    /// in-memory pipe has no Nagle); without the call a socket has it off.
    #[tokio::test]
    async fn an_accepted_connection_has_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        let (accepted, peer) = accept(&listener).await.unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        assert!(accepted.nodelay().unwrap());
        // Not the socket's default: without the call it is off.
        let plain = TcpStream::connect(addr).await.unwrap();
        let (unset, _) = listener.accept().await.unwrap();
        assert!(!unset.nodelay().unwrap());
        drop(plain);
    }

    /// When `accept` fails in a loop (out of descriptors), what decides
    /// how often it is called again, on tokio's paused clock: the pauses
    /// double from 10 ms to 1 s, so 9 failures (9 log lines) in 3 s, where
    /// the old fixed 100 ms pause made 30. The e2e test
    /// (`load::failing_accepts_back_off`) sees the logged pauses.
    #[tokio::test(start_paused = true)]
    async fn a_failing_accept_pauses_doubling_to_a_second() {
        let start = Instant::now();
        let calls = std::cell::RefCell::new(Vec::new());
        let accept = || {
            calls.borrow_mut().push(start.elapsed().as_millis());
            async { Err::<(), _>(io::Error::from_raw_os_error(24)) }
        };
        let mut backoff = doubling();
        let shutdown = std::pin::pin!(tokio::time::sleep(Duration::from_secs(3)));
        let got = accept_next(accept, &mut backoff, shutdown, || 0).await;
        assert_eq!(got, None, "shutdown ends the pause");
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        let calls = calls.into_inner();
        assert_eq!(
            calls,
            [0, 10, 30, 70, 150, 310, 630, 1270, 2270],
            "{calls:?}"
        );
    }

    /// A connection accepted starts the pauses over.
    #[tokio::test(start_paused = true)]
    async fn an_accepted_connection_resets_the_pause() {
        let start = Instant::now();
        let results = std::cell::RefCell::new(vec![Err(()), Err(()), Ok(7), Err(()), Ok(8)]);
        let calls = std::cell::RefCell::new(Vec::new());
        let mut accept = || {
            calls.borrow_mut().push(start.elapsed().as_millis());
            let next = results.borrow_mut().remove(0);
            async move { next.map_err(|()| io::Error::from_raw_os_error(24)) }
        };
        let mut backoff = doubling();
        let mut shutdown = std::pin::pin!(std::future::pending::<()>());
        let first = accept_next(&mut accept, &mut backoff, shutdown.as_mut(), || 0).await;
        assert_eq!(first, Some(7));
        let second = accept_next(&mut accept, &mut backoff, shutdown.as_mut(), || 0).await;
        assert_eq!(second, Some(8));
        // 0 and 10 ms failed, 30 ms accepted; the next failure pauses 10 ms again.
        assert_eq!(calls.into_inner(), [0, 10, 30, 30, 40]);
    }

    /// Refusals are counted between lines: the first is logged, the next
    /// ones only once the interval has passed, with how many there were.
    #[tokio::test(start_paused = true)]
    async fn refusals_are_logged_at_most_once_an_interval() {
        let mut count = RefusedCount::new(Duration::from_secs(10));
        assert_eq!(count.note(), Some(1));
        assert_eq!(count.note(), None);
        assert_eq!(count.note(), None);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(count.note(), Some(3));
        assert_eq!(count.note(), None);
    }
}
