//! The database clock on PostgreSQL for the TLS client-certificate
//! verifier (docs/control-plane.md, "Storage").
//!
//! The verifier runs on a tokio worker, where the sync driver cannot run
//! (it starts a runtime of its own). So one thread owns one connection and
//! answers clock requests; a caller waits at most [`READ_TIMEOUT`] and
//! otherwise goes on from the last reading plus the monotonic time since,
//! as the SQLite clock falls back to the last offset it read.

use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::pg::{Connector, Dedicated};
use super::{DbError, UnixMs};

/// How long a handshake waits for the clock thread.
const READ_TIMEOUT: Duration = Duration::from_millis(100);
/// How long the first reading may take (it connects).
const FIRST_READ_TIMEOUT: Duration = Duration::from_secs(15);

type Reply = mpsc::SyncSender<Result<UnixMs, DbError>>;

/// A handle on the clock thread; the thread ends when this is dropped.
pub(crate) struct PgClock {
    /// Room for one request: a caller finding it taken falls back at once
    /// instead of queueing behind a stalled server.
    requests: mpsc::SyncSender<Reply>,
    /// The last reading and when it was taken.
    last: Mutex<(UnixMs, Instant)>,
}

impl std::fmt::Debug for PgClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgClock").finish_non_exhaustive()
    }
}

impl PgClock {
    /// Starts the thread (which connects on its own) and takes a first
    /// reading, so that a server that cannot be read is an error at start.
    pub(crate) fn start(connector: &Connector) -> Result<Self, DbError> {
        let (requests, incoming) = mpsc::sync_channel::<Reply>(1);
        let conn = connector.dedicated();
        std::thread::Builder::new()
            .name("db-clock".into())
            .spawn(move || serve(conn, incoming))
            .map_err(|e| {
                DbError::PgConfig(format!("cannot start the database clock thread: {e}"))
            })?;
        let (reply, answer) = mpsc::sync_channel(1);
        requests
            .send(reply)
            .map_err(|_| DbError::PgConfig("the database clock thread ended".to_owned()))?;
        let first = match answer.recv_timeout(FIRST_READ_TIMEOUT) {
            Ok(r) => r?,
            Err(_) => return Err(DbError::Busy),
        };
        Ok(PgClock {
            requests,
            last: Mutex::new((first, Instant::now())),
        })
    }

    /// The database's time now (the server's clock plus the offset), or the
    /// last reading moved on by the time elapsed since, when the server does
    /// not answer within [`READ_TIMEOUT`].
    pub(crate) fn now(&self) -> UnixMs {
        match self.read() {
            Ok(now) => {
                *self.last.lock().unwrap_or_else(|p| p.into_inner()) = (now, Instant::now());
                now
            }
            Err(e) => {
                let (at, when) = *self.last.lock().unwrap_or_else(|p| p.into_inner());
                let elapsed = i64::try_from(when.elapsed().as_millis()).unwrap_or(i64::MAX);
                tracing::warn!(error = %e, "cannot read the database clock; using the last reading");
                at.saturating_add(elapsed)
            }
        }
    }

    fn read(&self) -> Result<UnixMs, DbError> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.requests.try_send(reply).map_err(|_| DbError::Busy)?;
        answer
            .recv_timeout(READ_TIMEOUT)
            .map_err(|_| DbError::Busy)?
    }
}

/// The thread: one reading per request, until the handle is dropped.
fn serve(mut conn: Dedicated, incoming: mpsc::Receiver<Reply>) {
    while let Ok(reply) = incoming.recv() {
        let now = conn.with(|c| c.now());
        // The caller may have stopped waiting.
        let _ = reply.send(now);
    }
}
