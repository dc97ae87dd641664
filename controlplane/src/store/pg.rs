//! The PostgreSQL backend (`[database] url`, docs/control-plane.md): the one
//! file that speaks the `postgres` driver.
//!
//! A bounded pool of sync clients (the call sites are `spawn_blocking`,
//! threads and the CLI, as with SQLite). Write transactions run at READ
//! COMMITTED side by side: each check-then-write that SQLite's
//! `BEGIN IMMEDIATE` serialises takes its own lock where it reads (a row
//! lock, an advisory lock on a name, or a unique index; every such place
//! says `PG:` in a comment, docs/control-plane.md "Locks"), and a transaction that
//! loses a serialization, deadlock or uniqueness race runs again from the
//! start, so it sees what the winner committed.
//!
//! A connection the server ended (a restart, `pg_terminate_backend`, a
//! network break) while it sat idle in the pool is seen only at its next
//! use: the sync driver reads a connection only inside a call, so
//! `is_closed()` at checkout knows only what an earlier call saw, and a
//! check that would know (a round trip, or waiting on the socket) costs
//! every checkout. So a transaction whose connection turns out lost is
//! dropped with every idle one (as old, and most likely gone the same way)
//! and runs again on a new one: a read always, a write when it was lost
//! before its COMMIT was sent (the server rolls back a transaction whose
//! connection ends). After a restart, that is one re-run per pool, not one
//! failed request per pooled connection. A connection lost during COMMIT
//! leaves the outcome unknown: that transaction is not run again (it may
//! have committed) and its caller answers "unavailable"
//! ([`DbError::CommitOutcomeUnknown`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::str::FromStr as _;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::types::{IsNull, ToSql, Type};
use postgres::{Client, Statement};
use sha2::{Digest as _, Sha256};

use super::{Commit, DbError, LockKey, Row, Value};
use crate::store::settings::{DatabaseConfig, DbPassword};

/// How long a checkout waits for a free connection before [`DbError::Busy`]
/// (SQLite's busy timeout).
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// What every new connection sets: a lock wait as long as SQLite's busy
/// timeout; a session stuck in a transaction is ended by the server.
const SESSION_SETUP: &str = "SET lock_timeout = '10s'; \
     SET idle_in_transaction_session_timeout = '60s'; \
     SET application_name = 'bc-controlplane'";
/// Attempts of a write transaction that hit a serialization failure, a
/// deadlock or a unique violation (SQLSTATE 40001/40P01/23505).
const WRITE_ATTEMPTS: usize = 5;
/// Runs of a transaction whose connection was lost before it could commit
/// (each on a new connection).
const LOST_ATTEMPTS: usize = 3;
/// Statements kept prepared per connection; past it the cache starts over.
const STATEMENT_CACHE_MAX: usize = 256;

/// A driver error, kept opaque so that no caller depends on the driver.
#[derive(Debug)]
pub struct PgError(postgres::Error);

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The driver's Display says only "db error" for a server error.
        match self.0.as_db_error() {
            Some(db) => write!(f, "{} (SQLSTATE {})", db, db.code().code()),
            None => match std::error::Error::source(&self.0) {
                Some(src) => write!(f, "{}: {src}", self.0),
                None => self.0.fmt(f),
            },
        }
    }
}

impl PgError {
    pub(crate) fn from_driver(e: postgres::Error) -> Self {
        PgError(e)
    }

    /// A race lost to another transaction (what [`Pool::write`] retries),
    /// or a server that cannot be reached now.
    pub(crate) fn is_transient(&self) -> bool {
        self.0.code().is_some_and(is_race) || is_lost(&self.0)
    }
}

/// The connection is gone: the driver saw it close, the stream failed
/// (an unexpected end, a reset: "peer closed connection without sending
/// TLS close_notify"), or the server said it is ending the session
/// (SQLSTATE class 08, 57P01 admin shutdown, 57P02 crash shutdown, 57P03
/// cannot connect now, 57P05 idle session timeout).
fn is_lost(e: &postgres::Error) -> bool {
    use std::io::ErrorKind as K;
    let io = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| {
            matches!(
                io.kind(),
                K::UnexpectedEof
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::ConnectionRefused
                    | K::BrokenPipe
                    | K::NotConnected
                    | K::TimedOut
            )
        });
    e.is_closed()
        || io
        || e.code().is_some_and(|c| {
            let c = c.code();
            c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "57P05")
        })
}

/// Serialization failure, deadlock, unique violation: another transaction
/// won; this one may run again and see what it committed.
fn is_race(c: &SqlState) -> bool {
    *c == SqlState::T_R_SERIALIZATION_FAILURE
        || *c == SqlState::T_R_DEADLOCK_DETECTED
        || *c == SqlState::UNIQUE_VIOLATION
}

impl DbError {
    pub(crate) fn from_pg(e: postgres::Error) -> Self {
        DbError::Pg(PgError(e))
    }
}

impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// The advisory lock key of `namespace` and `key`: the first 8 bytes of
/// SHA-256(namespace ‖ 0 ‖ key), so distinct names collide only by chance.
pub(crate) fn lock_id(namespace: &str, key: &str) -> i64 {
    let mut h = Sha256::new();
    h.update(namespace.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    i64::from_be_bytes(b)
}

#[cfg(test)]
thread_local! {
    /// What a write transaction on this thread runs just before its COMMIT
    /// (the race tests: one transaction waits there, its writes made and
    /// its locks held, while another runs into them).
    pub(crate) static BEFORE_COMMIT: RefCell<Option<Box<dyn FnMut()>>> =
        const { RefCell::new(None) };
}

#[cfg(test)]
fn before_commit() {
    BEFORE_COMMIT.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f();
        }
    });
}

/// How connections are made: the driver's config (password included) and
/// TLS.
#[derive(Clone)]
pub(crate) struct Connector {
    config: postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    /// `PostgreSQL host:port/dbname` (no user, no password), for errors.
    server: String,
}

impl Connector {
    /// A new connection with the session settings every one needs.
    fn connect(&self) -> Result<Session, DbError> {
        let connect_err = |e| DbError::PgConnect {
            server: self.server.clone(),
            source: PgError(e),
        };
        let mut client = match &self.tls {
            Some(tls) => self.config.connect(tls.clone()),
            None => self.config.connect(postgres::NoTls),
        }
        .map_err(connect_err)?;
        client.batch_execute(SESSION_SETUP).map_err(connect_err)?;
        Ok(Session {
            client,
            stmts: HashMap::new(),
            retry: false,
            failed: false,
            broken: false,
            lost: false,
        })
    }

    /// A connection of its own, outside the pool (the clock thread's).
    pub(crate) fn dedicated(&self) -> Dedicated {
        Dedicated {
            connector: self.clone(),
            session: None,
        }
    }
}

/// One connection owned by one thread, connected on first use and again
/// after it breaks.
pub(crate) struct Dedicated {
    connector: Connector,
    session: Option<RefCell<Session>>,
}

impl Dedicated {
    /// `f` on this connection; once more on a new one when it was lost.
    pub(crate) fn with<T>(
        &mut self,
        mut f: impl FnMut(Conn<'_>) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            if self.session.as_ref().is_some_and(|s| !s.borrow().alive()) {
                self.session = None;
            }
            let cell = match &mut self.session {
                Some(cell) => cell,
                empty => empty.insert(RefCell::new(self.connector.connect()?)),
            };
            cell.borrow_mut().lost = false;
            let out = f(Conn(cell));
            if out.is_err() && cell.borrow().lost && attempt < 2 {
                self.session = None;
                continue;
            }
            return out;
        }
    }
}

/// The connections to one PostgreSQL database.
pub(crate) struct Pool {
    connector: Connector,
    max: usize,
    /// [`CHECKOUT_TIMEOUT`] (shorter in tests).
    pub(crate) checkout_timeout: Duration,
    state: Mutex<PoolState>,
    freed: Condvar,
}

struct PoolState {
    idle: Vec<Session>,
    /// Connections open (idle or checked out).
    open: usize,
}

impl Pool {
    /// Connects to `cfg.url` (the password from `password_file`, TLS with
    /// `ca_file`'s roots), migrating nothing (`pg_schema::open` migrates). The password is
    /// wiped when this returns; the driver's config keeps a copy of its own
    /// (a plain `Vec<u8>`, no wipe on drop: `postgres::Config` offers no
    /// way to reach it) for every new connection's authentication.
    pub(crate) fn open_unmigrated(
        dir: &std::path::Path,
        cfg: &DatabaseConfig,
    ) -> Result<Self, DbError> {
        let password = cfg
            .password(dir)
            .map_err(|e| DbError::PgConfig(e.to_string()))?;
        Pool::connect_only(cfg, password.as_ref())
    }

    pub(crate) fn connect_only(
        cfg: &DatabaseConfig,
        password: Option<&DbPassword>,
    ) -> Result<Self, DbError> {
        let (mut config, server) = driver_config(&cfg.url)?;
        if let Some(p) = password {
            // The driver keeps its own copy (not wiped on drop) for every
            // new connection's authentication.
            config.password(p.expose());
        }
        config.connect_timeout(CONNECT_TIMEOUT);
        config.keepalives(true);
        let tls = if cfg.plaintext {
            config.ssl_mode(postgres::config::SslMode::Disable);
            None
        } else {
            // Require: never `prefer`'s silent fallback to plain text.
            config.ssl_mode(postgres::config::SslMode::Require);
            let ca = cfg.ca_file.as_deref().ok_or_else(|| {
                DbError::PgConfig("database.ca_file is required for TLS".to_owned())
            })?;
            Some(tls_connector(ca)?)
        };
        let pool = Pool {
            connector: Connector {
                config,
                tls,
                server,
            },
            max: cfg.max_connections.max(1),
            checkout_timeout: CHECKOUT_TIMEOUT,
            state: Mutex::new(PoolState {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
        };
        // Connect once now: a wrong URL, password or CA is an error at open.
        let first = pool.checkout()?;
        drop(first);
        Ok(pool)
    }

    pub(crate) fn server(&self) -> &str {
        &self.connector.server
    }

    pub(crate) fn connector(&self) -> &Connector {
        &self.connector
    }

    fn lock_state(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection: an idle one not known to be closed, a new one while
    /// fewer than `max` are open, else the next one freed within
    /// [`CHECKOUT_TIMEOUT`].
    fn checkout(&self) -> Result<Lease<'_>, DbError> {
        let deadline = Instant::now() + self.checkout_timeout;
        let mut st = self.lock_state();
        loop {
            if let Some(s) = st.idle.pop() {
                if !s.alive() {
                    st.open -= 1;
                    continue;
                }
                return Ok(Lease::new(self, s));
            }
            if st.open < self.max {
                st.open += 1;
                drop(st);
                return match self.connect() {
                    Ok(s) => Ok(Lease::new(self, s)),
                    Err(e) => {
                        self.lock_state().open -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(DbError::Busy);
            }
            st = self
                .freed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn connect(&self) -> Result<Session, DbError> {
        self.connector.connect()
    }

    /// After a lost connection: drops every idle one (as old as it, and
    /// most likely gone the same way), so that the re-run gets a new one.
    fn drop_idle(&self) {
        let idle = {
            let mut st = self.lock_state();
            let idle = std::mem::take(&mut st.idle);
            st.open -= idle.len();
            idle
        };
        self.freed.notify_all();
        discard(idle);
    }

    /// What a transaction whose connection was lost before it could commit
    /// does before its re-run `attempt` (from 1): drop the idle connections,
    /// log, pause.
    fn before_rerun_after_lost(&self, attempt: usize, what: &str) {
        self.drop_idle();
        let pause = backoff(attempt);
        tracing::warn!(
            attempt,
            pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
            "database: the connection to the server was lost during a {what}; running it again on a new one"
        );
        std::thread::sleep(pause);
    }

    fn checkin(&self, s: Session) {
        let mut st = self.lock_state();
        let dropped = if s.broken || s.client.is_closed() {
            st.open -= 1;
            Some(s)
        } else {
            st.idle.push(s);
            None
        };
        drop(st);
        self.freed.notify_one();
        discard(dropped.into_iter().collect());
    }

    /// `f` inside one READ ONLY transaction; run again (≤
    /// [`LOST_ATTEMPTS`] times in all) on a new connection when the one it
    /// ran on was lost, which a read can always be.
    pub(crate) fn read<T, E>(&self, mut f: impl FnMut(Conn<'_>) -> Result<T, E>) -> Result<T, E>
    where
        E: From<DbError>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let lease = self.checkout()?;
            let conn = lease.conn();
            conn.session().reset();
            let out = match conn.batch("BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY") {
                Ok(()) => f(conn),
                Err(e) => Err(E::from(e)),
            };
            if conn.session().lost {
                drop(lease);
                if attempt < LOST_ATTEMPTS {
                    self.before_rerun_after_lost(attempt, "read");
                    continue;
                }
                // `f` may have made an answer of the error: what it read
                // is not to be trusted.
                return out.and(Err(E::from(DbError::Aborted)));
            }
            // A read commits nothing; ROLLBACK also ends an aborted
            // transaction. The closure's own error is the one to report; a
            // ROLLBACK that fails leaves a good read good (the connection
            // is dropped).
            let _ = conn.end("ROLLBACK");
            return out;
        }
    }

    /// `f` inside one write transaction, committed when `f` says so. A
    /// serialization failure, deadlock, unique violation or
    /// [`Conn::conflict`] re-runs `f` (≤ [`WRITE_ATTEMPTS`] times, after a
    /// short random pause): the re-run reads what the other transaction
    /// committed and decides again (a second site of one name finds the
    /// first and says so). A connection lost before COMMIT re-runs it on a
    /// new one (≤ [`LOST_ATTEMPTS`] times); one lost during COMMIT is
    /// [`DbError::CommitOutcomeUnknown`], never re-run.
    pub(crate) fn write<T, E>(
        &self,
        mut f: impl FnMut(Conn<'_>) -> Result<(T, Commit), E>,
    ) -> Result<T, E>
    where
        E: From<DbError>,
    {
        let mut attempt = 0;
        let mut lost_runs = 0;
        loop {
            let lease = self.checkout()?;
            let conn = lease.conn();
            conn.session().reset();
            let outcome = match conn.batch("BEGIN ISOLATION LEVEL READ COMMITTED") {
                Ok(()) => f(conn),
                Err(e) => Err(E::from(e)),
            };
            // A lost race counts even where `f` turned the error into an
            // answer (an attestor's DbError is a refusal): that answer was
            // decided on a transaction PostgreSQL aborted. So does a lost
            // connection, whose transaction the server rolled back.
            let (retry, failed, lost) = {
                let s = conn.session();
                (s.retry, s.failed, s.lost)
            };
            if lost {
                drop(lease);
                lost_runs += 1;
                if lost_runs < LOST_ATTEMPTS {
                    self.before_rerun_after_lost(lost_runs, "write");
                    continue;
                }
                return match outcome {
                    Err(e) => Err(e),
                    Ok(_) => Err(DbError::Aborted.into()),
                };
            }
            attempt += 1;
            let ended = match outcome {
                _ if retry && attempt < WRITE_ATTEMPTS => None,
                Ok((out, Commit::Yes)) if !failed => {
                    #[cfg(test)]
                    before_commit();
                    Some(conn.end("COMMIT").map(|()| out))
                }
                // COMMIT of an aborted transaction rolls back without an
                // error: never report writes that did not happen.
                Ok((_, Commit::Yes)) => Some(Err(DbError::Aborted)),
                // Nothing is written whether or not the ROLLBACK gets
                // through (a connection that fails it is dropped).
                Ok((out, Commit::No)) => {
                    let _ = conn.end("ROLLBACK");
                    Some(Ok(out))
                }
                Err(e) => {
                    let _ = conn.end("ROLLBACK");
                    return Err(e);
                }
            };
            match ended {
                Some(Ok(out)) => return Ok(out),
                // COMMIT sent, and no answer: it may have committed or not.
                Some(Err(e)) if conn.session().lost => {
                    drop(lease);
                    self.drop_idle();
                    tracing::warn!(error = %e, "database: the connection to the server was lost during COMMIT; the outcome is unknown, so the transaction is not run again");
                    return Err(DbError::CommitOutcomeUnknown {
                        detail: e.to_string(),
                    }
                    .into());
                }
                // A COMMIT that lost a race runs the whole transaction again.
                Some(Err(e)) if !(conn.session().retry && attempt < WRITE_ATTEMPTS) => {
                    let _ = conn.end("ROLLBACK");
                    return Err(e.into());
                }
                // Ends the failed or abandoned transaction; a connection
                // that cannot is dropped.
                _ => {
                    let _ = conn.end("ROLLBACK");
                }
            }
            drop(lease);
            let pause = backoff(attempt);
            tracing::debug!(
                attempt,
                pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
                "database: the write transaction lost a race to another; running it again"
            );
            std::thread::sleep(pause);
        }
    }

    /// `f` on the raw client of one connection (the schema runner, which
    /// runs its own transaction).
    pub(crate) fn with_client<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, DbError>,
    ) -> Result<T, DbError> {
        let lease = self.checkout()?;
        let conn = lease.conn();
        let mut s = conn.session();
        let r = f(&mut s.client);
        if r.is_err() && !s.client.is_closed() {
            // The driver's Transaction rolls back on drop; a connection
            // that failed mid-migration is not reused all the same.
            s.broken = true;
        }
        r
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let idle = std::mem::take(&mut self.lock_state().idle);
        discard(idle);
    }
}

/// Closes connections. Closing runs the driver's own runtime, which cannot
/// start on a tokio worker (it panics): dropped there (a pool going with
/// the last `Arc<JoinService>` in a task; a broken connection while a
/// worker unwinds), they close on a thread of their own.
fn discard(sessions: Vec<Session>) {
    if sessions.is_empty() || tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let (give, take) = std::sync::mpsc::channel();
    let closing = std::thread::Builder::new()
        .name("db-close".into())
        .spawn(move || take.recv().map(drop));
    // Sent only when the thread runs; otherwise they are dropped here,
    // which is all there is left to try.
    if let Ok(t) = closing {
        let _ = give.send(sessions);
        let _ = t.join();
    }
}

/// A random pause of 5–50 ms × attempt, so that retried writers spread out.
fn backoff(attempt: usize) -> Duration {
    let r: [u8; 1] = crate::ids::random_bytes().unwrap_or([128]);
    let base = u64::from(r[0]) * 45 / 255 + 5;
    Duration::from_millis(base.saturating_mul(attempt as u64))
}

/// A checked-out connection; back to the pool on drop (unless broken or a
/// panic left it mid-transaction).
struct Lease<'p> {
    pool: &'p Pool,
    session: Option<RefCell<Session>>,
}

impl<'p> Lease<'p> {
    fn new(pool: &'p Pool, s: Session) -> Self {
        Lease {
            pool,
            session: Some(RefCell::new(s)),
        }
    }

    fn conn(&self) -> Conn<'_> {
        match &self.session {
            Some(s) => Conn(s),
            // Only Drop takes it.
            None => unreachable!("a lease's session is taken only on drop"),
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let mut s = s.into_inner();
            if std::thread::panicking() {
                s.broken = true;
            }
            self.pool.checkin(s);
        }
    }
}

/// One connection and its prepared statements.
struct Session {
    client: Client,
    /// By the `?N` text.
    stmts: HashMap<String, Statement>,
    /// The last error was a serialization failure, deadlock, unique
    /// violation or a [`Conn::conflict`]: the transaction may run again.
    retry: bool,
    /// A statement of the current transaction failed, so PostgreSQL has
    /// aborted it.
    failed: bool,
    /// Not to be reused (a lost connection, a failed ROLLBACK).
    broken: bool,
    /// The connection to the server is gone ([`is_lost`]): the current
    /// transaction did not commit, unless it was lost during COMMIT.
    lost: bool,
}

impl Session {
    /// Before a transaction: nothing has failed yet.
    fn reset(&mut self) {
        self.retry = false;
        self.failed = false;
        self.lost = false;
    }

    /// Whether the connection may still be open: neither this store nor
    /// the driver has seen it end (see the module's comment for what this
    /// cannot see).
    fn alive(&self) -> bool {
        !self.broken && !self.client.is_closed()
    }

    fn prepare(&mut self, sql: &str) -> Result<Statement, DbError> {
        if let Some(st) = self.stmts.get(sql) {
            return Ok(st.clone());
        }
        let st = self
            .client
            .prepare(&rewrite_placeholders(sql))
            .map_err(|e| self.error(sql, e))?;
        if self.stmts.len() >= STATEMENT_CACHE_MAX {
            self.stmts.clear();
        }
        self.stmts.insert(sql.to_owned(), st.clone());
        Ok(st)
    }

    /// Maps a driver error of statement `sql`, noting what it means for
    /// this connection.
    fn error(&mut self, sql: &str, e: postgres::Error) -> DbError {
        self.failed = true;
        if self.client.is_closed() || is_lost(&e) {
            self.broken = true;
            self.lost = true;
        }
        match e.code() {
            Some(c) if *c == SqlState::READ_ONLY_SQL_TRANSACTION => DbError::WriteInRead {
                sql: super::statement_head(sql),
            },
            Some(c) if is_race(c) => {
                self.retry = true;
                DbError::Pg(PgError(e))
            }
            // lock_timeout / statement timeout: SQLite's busy timeout.
            Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::QUERY_CANCELED => {
                DbError::Busy
            }
            _ => DbError::Pg(PgError(e)),
        }
    }
}

/// A connection inside a transaction, as [`super::Tx`] holds it.
#[derive(Clone, Copy)]
pub(crate) struct Conn<'c>(&'c RefCell<Session>);

impl Conn<'_> {
    fn session(&self) -> std::cell::RefMut<'_, Session> {
        self.0.borrow_mut()
    }

    fn batch(&self, sql: &str) -> Result<(), DbError> {
        let mut s = self.session();
        let r = s.client.batch_execute(sql);
        r.map_err(|e| s.error(sql, e))
    }

    /// COMMIT or ROLLBACK; a connection that fails it is not reused.
    fn end(&self, sql: &str) -> Result<(), DbError> {
        let r = self.batch(sql);
        if r.is_err() && sql == "ROLLBACK" {
            self.session().broken = true;
        }
        r
    }

    /// Marks the transaction as one to run again ([`super::Tx::conflict`]).
    pub(crate) fn conflict(&self) {
        self.session().retry = true;
    }

    pub(crate) fn execute(&self, sql: &str, params: &[Value]) -> Result<usize, DbError> {
        let mut s = self.session();
        let st = s.prepare(sql)?;
        let refs = param_refs(params);
        let r = s.client.execute(&st, &refs);
        let n = r.map_err(|e| s.error(sql, e))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub(crate) fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        let mut s = self.session();
        let st = s.prepare(sql)?;
        let refs = param_refs(params);
        let r = s.client.query(&st, &refs);
        let rows = r.map_err(|e| s.error(sql, e))?;
        rows.iter().map(read_row).collect()
    }

    pub(crate) fn query_opt(&self, sql: &str, params: &[Value]) -> Result<Option<Row>, DbError> {
        // The first row of however many (the driver's query_opt refuses
        // more than one; SQLite's caller reads the first).
        Ok(self.query(sql, params)?.into_iter().next())
    }

    /// The database's time in one statement: the server's clock plus the
    /// stored offset (docs/control-plane.md, "Storage").
    pub(crate) fn now(&self) -> Result<i64, DbError> {
        let row = self
            .query_opt(
                "SELECT CAST(floor(extract(epoch FROM clock_timestamp()) * 1000) AS BIGINT)
                      + COALESCE((SELECT CAST(value AS BIGINT) FROM settings
                                   WHERE key = 'clock_offset_ms'), 0)",
                &[],
            )?
            .ok_or_else(|| DbError::NoRow {
                sql: "the database clock".to_owned(),
            })?;
        row.get(0)
    }

    /// `pg_advisory_xact_lock` on each key, sorted and deduplicated so that
    /// two transactions locking the same keys cannot deadlock.
    pub(crate) fn lock(&self, keys: &[LockKey<'_>]) -> Result<(), DbError> {
        let mut ids: Vec<i64> = keys.iter().map(|k| lock_id(k.namespace, k.key)).collect();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            self.execute("SELECT pg_advisory_xact_lock(?1)", &[Value::Int(id)])?;
        }
        Ok(())
    }
}

fn param_refs(params: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// `?N` → `$N`, outside quoted literals, quoted identifiers and comments
/// (the one SQL text serves both backends).
pub(crate) fn rewrite_placeholders(sql: &str) -> String {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    let mut start = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => {
                i += 1;
                while i < b.len() {
                    if b[i] == q {
                        // A doubled quote is an escaped one.
                        if b.get(i + 1) == Some(&q) {
                            i += 2;
                            continue;
                        }
                        break;
                    }
                    i += 1;
                }
                i += 1;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'?' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                out.push_str(&sql[start..i]);
                out.push('$');
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    out.push_str(&sql[start.min(sql.len())..]);
    out
}

/// Splits the `sslmode` parameter off `url` (the driver knows only
/// disable/prefer/require; the config has already checked it and TLS is
/// set explicitly) and parses the rest; also names the server for errors.
fn driver_config(url: &str) -> Result<(postgres::Config, String), DbError> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("sslmode="))
        .collect();
    let cleaned = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    // The error never quotes the URL (the config already refuses a password
    // in it, but an error message is not the place to find out).
    let config = postgres::Config::from_str(&cleaned)
        .map_err(|e| DbError::PgConfig(format!("database.url: {e}")))?;
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(h, port)| match h {
            postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
            postgres::config::Host::Unix(p) => format!("{}:{port}", p.display()),
        })
        .collect();
    let server = format!(
        "PostgreSQL {}/{}",
        hosts.join(","),
        config.get_dbname().unwrap_or("")
    );
    Ok((config, server))
}

/// TLS through rustls (the workspace's ring provider), trusting only the
/// roots in `ca_file`. rustls always checks the server's name too, so
/// `sslmode=require` and `verify-ca` get `verify-full`'s checks.
fn tls_connector(
    ca: &std::path::Path,
) -> Result<tokio_postgres_rustls::MakeRustlsConnect, DbError> {
    let fail =
        |detail: String| DbError::PgConfig(format!("database.ca_file {}: {detail}", ca.display()));
    let pem = crate::fsutil::read_ca_bundle(ca).map_err(|e| fail(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| fail(format!("not PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| fail(format!("a certificate rustls refuses: {e}")))?;
    }
    if roots.is_empty() {
        return Err(fail("holds no certificate".to_owned()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// Value binding: NULL to any parameter type; Int to INT2/4/8 (range
/// checked) and BOOL (0/1); Text to the text types; Blob to BYTEA.
impl ToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let mismatch = || -> Box<dyn std::error::Error + Sync + Send> {
            format!("a {} value bound to a {ty} parameter", self.kind()).into()
        };
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)
                    .map_err(|_| format!("{i} is out of range for an INT4 parameter"))?
                    .to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)
                    .map_err(|_| format!("{i} is out of range for an INT2 parameter"))?
                    .to_sql(ty, out),
                Type::BOOL if matches!(i, 0 | 1) => (*i == 1).to_sql(ty, out),
                _ => Err(mismatch()),
            },
            Value::Text(s) => match *ty {
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    s.as_str().to_sql(&Type::TEXT, out)
                }
                _ => Err(mismatch()),
            },
            Value::Blob(b) => match *ty {
                Type::BYTEA => b.as_slice().to_sql(ty, out),
                _ => Err(mismatch()),
            },
        }
    }

    fn accepts(_: &Type) -> bool {
        // Checked per value in to_sql (NULL binds to anything).
        true
    }

    postgres::types::to_sql_checked!();
}

/// Reading: INT2/4/8 → Int, the text types → Text, BYTEA → Blob, BOOL →
/// Int(0|1), NULL → Null; any other type is an error naming the column.
fn read_row(r: &postgres::Row) -> Result<Row, DbError> {
    let mut values = Vec::with_capacity(r.len());
    for (i, col) in r.columns().iter().enumerate() {
        let bad = |e: postgres::Error| DbError::PgColumn {
            index: i,
            name: col.name().to_owned(),
            pg_type: col.type_().to_string(),
            detail: e.to_string(),
        };
        let v = match *col.type_() {
            Type::INT8 => r.try_get::<_, Option<i64>>(i).map_err(bad)?.map(Value::Int),
            Type::INT4 => r
                .try_get::<_, Option<i32>>(i)
                .map_err(bad)?
                .map(|v| Value::Int(v.into())),
            Type::INT2 => r
                .try_get::<_, Option<i16>>(i)
                .map_err(bad)?
                .map(|v| Value::Int(v.into())),
            Type::BOOL => r
                .try_get::<_, Option<bool>>(i)
                .map_err(bad)?
                .map(|v| Value::Int(v.into())),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => r
                .try_get::<_, Option<String>>(i)
                .map_err(bad)?
                .map(Value::Text),
            Type::BYTEA => r
                .try_get::<_, Option<Vec<u8>>>(i)
                .map_err(bad)?
                .map(Value::Blob),
            _ => {
                return Err(DbError::PgColumn {
                    index: i,
                    name: col.name().to_owned(),
                    pg_type: col.type_().to_string(),
                    detail: "a type the store does not read (cast it to BIGINT, TEXT or BYTEA)"
                        .to_owned(),
                })
            }
        };
        values.push(v.unwrap_or(Value::Null));
    }
    Ok(Row::new(values))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    use super::super::{params, DbError};
    use crate::test_support::{temp_db_on, Backend};

    /// A write transaction the server aborts as a deadlock victim (40P01)
    /// is run again, and the second run commits. The other party is a raw
    /// session, so that only the store's writer is retried; it waits first, so the server's
    /// detector, which fires in the session that has waited longest, picks
    /// it.
    #[test]
    fn a_deadlocked_write_is_run_again() {
        let t = temp_db_on(Backend::Postgres);
        let pg = t.pg.as_ref().unwrap();
        pg.psql("INSERT INTO settings (key, value) VALUES ('a', '0'), ('b', '0')");
        let mut other = t.db.pg_pool().unwrap().connector().connect().unwrap();
        let attempts = AtomicUsize::new(0);
        let (has_a, store_has_a) = mpsc::channel();
        let (go, other_has_b) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let (db, attempts) = (&t.db, &attempts);
            let writer = s.spawn(move || {
                db.write(|tx| {
                    let n = attempts.fetch_add(1, Ordering::SeqCst) + 1;
                    tx.execute("UPDATE settings SET value = 'w' WHERE key = 'a'", params![])?;
                    if n == 1 {
                        has_a.send(()).unwrap();
                        other_has_b.recv().unwrap();
                    }
                    tx.execute("UPDATE settings SET value = 'w' WHERE key = 'b'", params![])?;
                    Ok::<_, DbError>(())
                })
            });
            store_has_a.recv().unwrap();
            other
                .client
                .batch_execute("BEGIN; UPDATE settings SET value = 'o' WHERE key = 'b'")
                .unwrap();
            go.send(()).unwrap();
            // Until the store's writer waits for row b.
            while pg.psql(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'",
            ) != "1"
            {
                std::thread::yield_now();
            }
            // Row a: a deadlock; the store's writer, waiting longest, is
            // aborted, and this goes on.
            other
                .client
                .batch_execute("UPDATE settings SET value = 'o' WHERE key = 'a'; COMMIT")
                .unwrap();
            writer.join().unwrap().unwrap();
        });
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
        assert_eq!(
            pg.psql(
                "SELECT string_agg(value, ',' ORDER BY key) FROM settings WHERE key IN ('a', 'b')"
            ),
            "w,w"
        );
    }
}
