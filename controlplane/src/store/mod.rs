//! The control plane's storage: the only way to the database.
//!
//! Either one SQLite file, `DIR/controlplane.db` ([`sqlite`]): WAL so that
//! the CLI can read while `serve` writes; a busy timeout so that concurrent
//! writers (parallel joins, the CLI moving the clock) wait for each other
//! instead of failing; every write in a `BEGIN IMMEDIATE` transaction so that
//! the write lock is taken before anything is read (a join's token row cannot
//! change between its check and its use). Or, when `[database]` names one,
//! a PostgreSQL server ([`pg`], docs/control-plane.md), where writers run side
//! by side and each check-then-write takes its own lock ([`Tx::lock`], a
//! `for_update`/`for_share` read or a unique index; `PG:` comments).
//!
//! Callers see only [`Store`], [`Tx`], [`Value`] and [`Row`], never the
//! driver, so that both backends sit behind the same calls. Rows are owned:
//! nothing borrows the statement.
//!
//! The database also owns the clock: [`Tx::now`] is the clock (SQLite: this
//! host's; PostgreSQL: the server's) plus `settings.clock_offset_ms`, read
//! inside the transaction. Every expiry check and certificate validity uses
//! it, so tests can move time with `bc-controlplane clock set` while a server
//! runs.

mod migrations;
pub(crate) mod pg;
mod pg_clock;
pub(crate) mod pg_schema;
#[cfg(test)]
mod pg_tests;
pub(crate) mod settings;
pub(crate) mod sqlite;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use time::OffsetDateTime;

pub(crate) use migrations::MIGRATIONS;
pub(crate) use pg::PgError;
pub(crate) use pg_clock::PgClock;
pub(crate) use sqlite::{ClockConn, SqliteError};

pub(crate) const DB_FILE: &str = "controlplane.db";

const CLOCK_OFFSET_KEY: &str = "clock_offset_ms";

/// Milliseconds since the Unix epoch.
pub type UnixMs = i64;

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("opening {path}: {source}")]
    Open { path: PathBuf, source: SqliteError },
    #[error("creating {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} has schema version {found}, newer than this bc-controlplane knows ({known}); use a newer bc-controlplane")]
    TooNew {
        path: PathBuf,
        found: i64,
        known: usize,
    },
    #[error("the database is busy (another writer holds it); try again")]
    Busy,
    #[error("database: {0}")]
    Sqlite(SqliteError),
    #[error("the database holds an invalid {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error("database column {index}: expected {expected}, found {found}")]
    Column {
        index: usize,
        expected: &'static str,
        found: &'static str,
    },
    #[error("database: a query expected to return a row returned none: {sql}")]
    NoRow { sql: String },
    #[error("the system's random generator failed: {0}")]
    Random(getrandom::Error),
    #[error("connecting to {server}: {source}")]
    PgConnect { server: String, source: PgError },
    #[error("database: {0}")]
    Pg(PgError),
    #[error("{0}")]
    PgConfig(String),
    #[error("database column {index} ({name}): {pg_type}: {detail}")]
    PgColumn {
        index: usize,
        name: String,
        pg_type: String,
        detail: String,
    },
    #[error("{server} has schema version {found}, newer than this bc-controlplane knows ({known}); use a newer bc-controlplane")]
    TooNewPg {
        server: String,
        found: i64,
        known: usize,
    },
    #[error("applying migration {number} on PostgreSQL: {source}")]
    Migration { number: usize, source: PgError },
    #[error("database: {what} changed under this transaction; try again")]
    Conflict { what: &'static str },
    #[error("database: a statement of the transaction failed, so nothing of it was written")]
    Aborted,
    /// A write inside [`Store::read`] (SQLite `query_only`, PostgreSQL READ
    /// ONLY): a bug in the caller, whose write belongs in [`Store::write`].
    #[error(
        "database: a write inside a read-only transaction (it belongs in Store::write): {sql}"
    )]
    WriteInRead { sql: String },
    /// PostgreSQL: the connection broke while its COMMIT was under way, so
    /// whether the transaction was written is unknown; it is not run again
    /// (it may have been), and the caller answers "unavailable".
    #[error("database: the connection to the server was lost during COMMIT ({detail}); whether the transaction was written is unknown")]
    CommitOutcomeUnknown { detail: String },
}

impl DbError {
    /// Worth trying again later: the database was busy, the transaction
    /// kept losing races to others, or the server could not be reached (the
    /// caller says "unavailable", not "internal error").
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            DbError::Busy | DbError::Conflict { .. } | DbError::CommitOutcomeUnknown { .. } => true,
            DbError::Pg(e) | DbError::PgConnect { source: e, .. } => e.is_transient(),
            _ => false,
        }
    }
}

/// The start of a statement, whitespace folded, for an error that names it.
fn statement_head(sql: &str) -> String {
    const MAX: usize = 120;
    let folded = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    match folded.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &folded[..i]),
        None => folded,
    }
}

/// The SQL fragments that differ between backends; every one is empty on
/// SQLite, whose `BEGIN IMMEDIATE` already holds the only write lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// Appended to a SELECT whose rows the transaction goes on to change
    /// (PG: ` FOR UPDATE`).
    pub(crate) fn for_update(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE",
        }
    }

    /// Appended to a SELECT whose rows must not change before commit
    /// (PG: ` FOR SHARE`).
    pub(crate) fn for_share(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR SHARE",
        }
    }

    /// Appended to a prune's subquery, so that two pruners skip each
    /// other's rows instead of waiting (PG: ` FOR UPDATE SKIP LOCKED`).
    pub(crate) fn skip_locked(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE SKIP LOCKED",
        }
    }
}

/// A name the transaction serialises on until it ends (a check-then-write
/// no row lock covers, docs/control-plane.md "Locks"): `namespace` and `key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LockKey<'a> {
    pub namespace: &'static str,
    pub key: &'a str,
}

/// One value bound to or read from a statement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
}

impl Value {
    /// The name of this value's type, for errors.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Int(_) => "integer",
            Value::Text(_) => "text",
            Value::Blob(_) => "blob",
        }
    }
}

/// What [`params!`] binds: anything with a database value, by reference.
pub(crate) trait ToValue {
    fn to_value(&self) -> Value;
}

impl ToValue for Value {
    fn to_value(&self) -> Value {
        self.clone()
    }
}
impl ToValue for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_owned())
    }
}
impl ToValue for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}
impl ToValue for i64 {
    fn to_value(&self) -> Value {
        Value::Int(*self)
    }
}
impl ToValue for i32 {
    fn to_value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}
impl ToValue for u32 {
    fn to_value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}
impl ToValue for bool {
    fn to_value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}
impl ToValue for [u8] {
    fn to_value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}
impl ToValue for Vec<u8> {
    fn to_value(&self) -> Value {
        Value::Blob(self.clone())
    }
}
impl<const N: usize> ToValue for [u8; N] {
    fn to_value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}
impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}
impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        match self {
            None => Value::Null,
            Some(v) => v.to_value(),
        }
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        v.to_value()
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Text(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        v.to_value()
    }
}
impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Self {
        v.to_value()
    }
}
impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Self {
        Value::Blob(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::Null, Into::into)
    }
}

/// The parameters of one statement, bound `?1`, `?2`, … in order:
/// `tx.execute(sql, params![id, now])`.
#[macro_export]
macro_rules! params {
    ($($v:expr),* $(,)?) => {
        &[$($crate::store::ToValue::to_value(&$v)),*] as &[$crate::store::Value]
    };
}
pub use crate::params;

/// A type a column reads as; `Err` names the type expected.
pub(crate) trait FromValue: Sized {
    fn from_value(v: &Value) -> Result<Self, &'static str>;
}

impl FromValue for Value {
    fn from_value(v: &Value) -> Result<Self, &'static str> {
        Ok(v.clone())
    }
}
impl FromValue for i64 {
    fn from_value(v: &Value) -> Result<Self, &'static str> {
        match v {
            Value::Int(i) => Ok(*i),
            _ => Err("integer"),
        }
    }
}
/// Narrower integers: a value out of range is a mismatch, as with rusqlite.
macro_rules! from_int {
    ($($t:ty => $name:literal),*) => {$(
        impl FromValue for $t {
            fn from_value(v: &Value) -> Result<Self, &'static str> {
                match v {
                    Value::Int(i) => <$t>::try_from(*i).map_err(|_| $name),
                    _ => Err($name),
                }
            }
        }
    )*};
}
from_int!(i32 => "32-bit integer", u32 => "unsigned 32-bit integer",
          u64 => "unsigned integer", usize => "unsigned integer", u8 => "8-bit unsigned integer");
impl FromValue for bool {
    fn from_value(v: &Value) -> Result<Self, &'static str> {
        match v {
            Value::Int(i) => Ok(*i != 0),
            _ => Err("boolean (integer)"),
        }
    }
}
impl FromValue for String {
    fn from_value(v: &Value) -> Result<Self, &'static str> {
        match v {
            Value::Text(s) => Ok(s.clone()),
            _ => Err("text"),
        }
    }
}
impl FromValue for Vec<u8> {
    fn from_value(v: &Value) -> Result<Self, &'static str> {
        match v {
            Value::Blob(b) => Ok(b.clone()),
            _ => Err("blob"),
        }
    }
}
impl<const N: usize> FromValue for [u8; N] {
    fn from_value(v: &Value) -> Result<Self, &'static str> {
        match v {
            Value::Blob(b) => b.as_slice().try_into().map_err(|_| "blob of fixed length"),
            _ => Err("blob"),
        }
    }
}
impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: &Value) -> Result<Self, &'static str> {
        match v {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// One result row, owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Row(Vec<Value>);

impl Row {
    pub(crate) fn new(values: Vec<Value>) -> Self {
        Row(values)
    }

    /// Column `index` (from 0) as `T`; a missing column or another type is a
    /// [`DbError::Column`] naming the index.
    pub(crate) fn get<T: FromValue>(&self, index: usize) -> Result<T, DbError> {
        let Some(v) = self.0.get(index) else {
            return Err(DbError::Column {
                index,
                expected: std::any::type_name::<T>(),
                found: "no such column",
            });
        };
        T::from_value(v).map_err(|expected| DbError::Column {
            index,
            expected,
            found: v.kind(),
        })
    }
}

/// Whether [`Store::write_if`] commits what its closure wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Commit {
    Yes,
    No,
}

/// The database of one control plane DIR: opens connections (migrated on
/// first open) and keeps a few idle ones for reuse.
pub struct Store {
    backend: Backend,
    dialect: Dialect,
    migrated: SchemaChange,
}

/// What opening a database did to its schema: versions `from` → `to`
/// (equal: it was up to date). A version counts the [`MIGRATIONS`] applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchemaChange {
    pub from: usize,
    pub to: usize,
}

/// The schema version this build migrates to.
pub fn schema_version() -> usize {
    MIGRATIONS.len()
}

/// The schema version of DIR's database as configured, read without
/// migrating or creating anything (`migrate --check`), and the database
/// as [`Store::describe`] names it. A version newer than this build's is
/// [`DbError::TooNew`] / [`DbError::TooNewPg`].
pub fn pending_version(
    dir: &Path,
    database: Option<&crate::store::settings::DatabaseConfig>,
) -> Result<(usize, String), DbError> {
    match database {
        Some(cfg) => {
            let pool = pg::Pool::open_unmigrated(dir, cfg)?;
            Ok((pg_schema::pending(&pool)?, pool.server().to_owned()))
        }
        None => {
            let path = dir.join(DB_FILE);
            Ok((sqlite::pending(&path)?, path.display().to_string()))
        }
    }
}

enum Backend {
    Sqlite(sqlite::Pool),
    // Boxed: the driver's config and TLS make it large.
    Pg(Box<pg::Pool>),
}

impl Store {
    /// DIR's database as configured: the PostgreSQL server of `[database]`
    /// when it names one, else `DIR/controlplane.db`.
    pub fn open_configured(
        dir: &Path,
        database: Option<&crate::store::settings::DatabaseConfig>,
    ) -> Result<Self, DbError> {
        match database {
            Some(cfg) => {
                let (pool, migrated) = pg_schema::open(dir, cfg)?;
                Ok(Store {
                    backend: Backend::Pg(Box::new(pool)),
                    dialect: Dialect::Postgres,
                    migrated,
                })
            }
            None => Self::open_dir(dir),
        }
    }

    /// Opens `DIR/controlplane.db`, creating and migrating it as needed.
    pub(crate) fn open_dir(dir: &Path) -> Result<Self, DbError> {
        Self::open(&dir.join(DB_FILE))
    }

    pub(crate) fn open(path: &Path) -> Result<Self, DbError> {
        let (pool, migrated) = sqlite::Pool::open(path)?;
        Ok(Store {
            backend: Backend::Sqlite(pool),
            dialect: Dialect::Sqlite,
            migrated,
        })
    }

    /// What opening this store did to the schema (`bc-controlplane
    /// migrate` reports it).
    pub fn migrated(&self) -> SchemaChange {
        self.migrated
    }

    /// The SQLite file; `None` on PostgreSQL.
    pub fn path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Sqlite(p) => Some(p.path()),
            Backend::Pg(_) => None,
        }
    }

    /// PostgreSQL: the TLS verifier's clock, a thread with a connection of
    /// its own (the verifier runs where the driver cannot); `None` on
    /// SQLite, whose clock reads the file ([`ClockConn`]).
    pub(crate) fn pg_clock(&self) -> Option<Result<PgClock, DbError>> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Pg(p) => Some(PgClock::start(p.connector())),
        }
    }

    /// What the database is, for messages: the file or the server (never a
    /// password).
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Sqlite(p) => p.path().display().to_string(),
            Backend::Pg(p) => p.server().to_owned(),
        }
    }

    /// Runs `f` inside one write transaction (`BEGIN IMMEDIATE`; on
    /// PostgreSQL READ COMMITTED, with the locks `f` takes) and commits if it
    /// returns `Ok`; an `Err` rolls everything back. PostgreSQL re-runs `f`
    /// after a serialization failure, deadlock, unique violation,
    /// [`Tx::conflict`] or a connection lost before COMMIT (one lost during
    /// COMMIT is [`DbError::CommitOutcomeUnknown`]), so `f` must do
    /// everything inside the transaction.
    pub fn write<T, E>(&self, mut f: impl FnMut(&Tx<'_>) -> Result<T, E>) -> Result<T, E>
    where
        E: From<DbError>,
    {
        self.write_if(|tx| f(tx).map(|t| (t, Commit::Yes)))
    }

    /// As [`Store::write`], for the calls that keep only some outcomes (a
    /// join's refusal rolls back what its attestor wrote, a deferral keeps
    /// it): `f` says whether to commit.
    pub(crate) fn write_if<T, E>(
        &self,
        mut f: impl FnMut(&Tx<'_>) -> Result<(T, Commit), E>,
    ) -> Result<T, E>
    where
        E: From<DbError>,
    {
        match &self.backend {
            Backend::Sqlite(p) => p.write(|c| f(&Tx::new(c, self.dialect))),
            Backend::Pg(p) => p.write(|c| f(&Tx::pg(c))),
        }
    }

    /// Runs `f` on a connection of its own outside any write transaction:
    /// each statement reads the latest committed state (WAL; PostgreSQL: a
    /// READ ONLY transaction), and never waits for a writer. A write in `f`
    /// fails on both backends ([`DbError::WriteInRead`]: SQLite's read
    /// connections are `query_only`), so that a misplaced write shows in
    /// every test, not only on PostgreSQL. PostgreSQL re-runs `f` on a new
    /// connection when the one it ran on was lost (a server restart).
    pub fn read<T, E>(&self, mut f: impl FnMut(&Tx<'_>) -> Result<T, E>) -> Result<T, E>
    where
        E: From<DbError>,
    {
        match &self.backend {
            Backend::Sqlite(p) => p.read(|c| f(&Tx::new(c, self.dialect)))?,
            Backend::Pg(p) => p.read(|c| f(&Tx::pg(c))),
        }
    }
}

#[cfg(test)]
impl Store {
    /// How long a PostgreSQL checkout waits for a free connection.
    pub(crate) fn set_pg_checkout_timeout(&mut self, d: std::time::Duration) {
        if let Backend::Pg(p) = &mut self.backend {
            p.checkout_timeout = d;
        }
    }

    pub(crate) fn pg_pool(&self) -> Option<&pg::Pool> {
        match &self.backend {
            Backend::Pg(p) => Some(p),
            Backend::Sqlite(_) => None,
        }
    }
}

/// The backend's connection a [`Tx`] runs on.
#[derive(Clone, Copy)]
enum Conn<'c> {
    Sqlite(sqlite::Conn<'c>),
    Pg(pg::Conn<'c>),
}

/// A transaction (or, from [`Store::read`], a read-only connection): what
/// every module fn takes.
pub struct Tx<'c> {
    conn: Conn<'c>,
    dialect: Dialect,
}

impl<'c> Tx<'c> {
    pub(crate) fn new(conn: sqlite::Conn<'c>, dialect: Dialect) -> Self {
        Tx {
            conn: Conn::Sqlite(conn),
            dialect,
        }
    }

    fn pg(conn: pg::Conn<'c>) -> Self {
        Tx {
            conn: Conn::Pg(conn),
            dialect: Dialect::Postgres,
        }
    }

    /// Runs one statement; returns how many rows it changed.
    pub(crate) fn execute(&self, sql: &str, params: &[Value]) -> Result<usize, DbError> {
        match self.conn {
            Conn::Sqlite(c) => c.execute(sql, params),
            Conn::Pg(c) => c.execute(sql, params),
        }
    }

    /// Every row of a query.
    pub(crate) fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        match self.conn {
            Conn::Sqlite(c) => c.query(sql, params),
            Conn::Pg(c) => c.query(sql, params),
        }
    }

    /// The first row of a query, if any.
    pub(crate) fn query_opt(&self, sql: &str, params: &[Value]) -> Result<Option<Row>, DbError> {
        match self.conn {
            Conn::Sqlite(c) => c.query_opt(sql, params),
            Conn::Pg(c) => c.query_opt(sql, params),
        }
    }

    /// Every row of a query, each mapped by `f` (a `read_row` fn or closure).
    pub(crate) fn query_map<T, F>(
        &self,
        sql: &str,
        params: &[Value],
        mut f: F,
    ) -> Result<impl Iterator<Item = Result<T, DbError>> + use<T, F>, DbError>
    where
        F: FnMut(&Row) -> Result<T, DbError>,
    {
        Ok(self.query(sql, params)?.into_iter().map(move |r| f(&r)))
    }

    /// The first row of a query, if any, mapped by `f`.
    pub(crate) fn query_opt_map<T>(
        &self,
        sql: &str,
        params: &[Value],
        f: impl FnOnce(&Row) -> Result<T, DbError>,
    ) -> Result<Option<T>, DbError> {
        self.query_opt(sql, params)?.as_ref().map(f).transpose()
    }

    /// The first row of a query that always returns one (`SELECT count(*)`);
    /// none is [`DbError::NoRow`].
    pub(crate) fn query_one(&self, sql: &str, params: &[Value]) -> Result<Row, DbError> {
        self.query_opt(sql, params)?.ok_or_else(|| DbError::NoRow {
            sql: sql.to_owned(),
        })
    }

    /// The database's time: the clock (SQLite: this host's; PostgreSQL:
    /// the server's, so every replica agrees) plus the clock offset, read in
    /// this transaction so the whole transaction sees one consistent "now".
    pub fn now(&self) -> Result<UnixMs, DbError> {
        match self.conn {
            Conn::Sqlite(_) => Ok(system_now_ms().saturating_add(clock_offset_ms(self)?)),
            Conn::Pg(c) => c.now(),
        }
    }

    /// Serialises this transaction with every other holding one of `keys`
    /// until it ends. SQLite: nothing to do, `BEGIN IMMEDIATE` already holds
    /// the one write lock. PostgreSQL: an advisory lock per key.
    pub(crate) fn lock(&self, keys: &[LockKey<'_>]) -> Result<(), DbError> {
        match self.conn {
            Conn::Sqlite(_) => Ok(()),
            Conn::Pg(c) => c.lock(keys),
        }
    }

    /// The error for a row that changed between this transaction's read and
    /// its write (an UPDATE that found its `WHERE` no longer true). On
    /// PostgreSQL the transaction runs again and decides on what the other
    /// committed; SQLite's one writer cannot see it, so there it is a fault.
    pub(crate) fn conflict(&self, what: &'static str) -> DbError {
        if let Conn::Pg(c) = self.conn {
            c.conflict();
        }
        DbError::Conflict { what }
    }

    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }
}

/// The clock offset stored by `clock set` (0 when never set).
pub fn clock_offset_ms(tx: &Tx<'_>) -> Result<i64, DbError> {
    let v: Option<String> = tx
        .query_opt(
            "SELECT value FROM settings WHERE key = ?1",
            params![CLOCK_OFFSET_KEY],
        )?
        .map(|r| r.get(0))
        .transpose()?;
    match v {
        None => Ok(0),
        Some(s) => s.parse().map_err(|_| DbError::Corrupt {
            what: "clock offset",
            detail: s,
        }),
    }
}

/// Moves the database clock to system time + `offset_ms`.
pub fn set_clock_offset_ms(tx: &Tx<'_>, offset_ms: i64) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO settings (key, value) VALUES (?1, ?2)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        params![CLOCK_OFFSET_KEY, offset_ms.to_string()],
    )?;
    Ok(())
}

/// The system clock in milliseconds (no offset): for in-memory bookkeeping
/// only; records use [`Tx::now`].
pub(crate) fn system_now_ms() -> UnixMs {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        // A clock before 1970 is broken; count backwards rather than panic.
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

/// A database time as a UTC date-time (out-of-range values saturate).
pub fn to_datetime(ms: UnixMs) -> OffsetDateTime {
    let nanos = i128::from(ms) * 1_000_000;
    OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(if ms < 0 {
        OffsetDateTime::UNIX_EPOCH
    } else {
        time::macros::datetime!(9999-12-31 23:59:59 UTC)
    })
}

/// A date-time as database time (milliseconds).
pub fn from_datetime(t: OffsetDateTime) -> UnixMs {
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

/// RFC 3339 in UTC with millisecond precision, e.g. `2025-01-02T03:04:05.678Z`.
pub fn rfc3339(ms: UnixMs) -> String {
    let t = to_datetime(ms);
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    t.format(&fmt).unwrap_or_else(|_| ms.to_string())
}
