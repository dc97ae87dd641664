//! The SQLite backend: the one file that speaks rusqlite.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::{Commit, DbError, Row, SchemaChange, Value, MIGRATIONS};

const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle connections kept for reuse by the server.
const POOL_MAX_IDLE: usize = 8;
/// How long a clock read may wait on a lock before its caller falls back.
const CLOCK_READ_TIMEOUT: Duration = Duration::from_millis(100);

/// A driver error, kept opaque so that no caller depends on the driver.
#[derive(Debug)]
pub struct SqliteError(rusqlite::Error);

impl std::fmt::Display for SqliteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SqliteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        if is_busy(&e) {
            DbError::Busy
        } else {
            DbError::Sqlite(SqliteError(e))
        }
    }
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(f.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Int(i) => ValueRef::Integer(*i),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

/// The connections of one database file: those for write transactions,
/// and those for reads, which are `query_only` so that a write in a read
/// fails here as it does on PostgreSQL ([`DbError::WriteInRead`]).
pub(crate) struct Pool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    idle_readers: Mutex<Vec<Connection>>,
}

impl Pool {
    /// Opens `path`, creating (0600) and migrating it as needed; also
    /// what the migration did.
    pub(crate) fn open(path: &Path) -> Result<(Self, SchemaChange), DbError> {
        create_private(path)?;
        let conn = connect(path)?;
        let change = migrate(path, &conn)?;
        let pool = Pool {
            path: path.to_owned(),
            idle: Mutex::new(vec![conn]),
            idle_readers: Mutex::new(Vec::new()),
        };
        Ok((pool, change))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` with a connection of this database: a `query_only` one
    /// for a `reader`. Connections are not shared between threads; each
    /// call gets one of its own.
    fn with_conn<T>(
        &self,
        reader: bool,
        f: impl FnOnce(&mut Connection) -> T,
    ) -> Result<T, DbError> {
        let idle = match reader {
            true => &self.idle_readers,
            false => &self.idle,
        };
        let pooled = idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None if reader => connect_reader(&self.path)?,
            None => connect(&self.path)?,
        };
        let out = f(&mut conn);
        let mut idle = idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL_MAX_IDLE {
            idle.push(conn);
        }
        Ok(out)
    }

    /// `f` on a `query_only` connection in autocommit mode (no
    /// transaction), as reads always ran.
    pub(crate) fn read<T>(&self, f: impl FnOnce(Conn<'_>) -> T) -> Result<T, DbError> {
        self.with_conn(true, |conn| f(Conn::reader(conn)))
    }

    /// `f` inside one `BEGIN IMMEDIATE` transaction, committed when it says
    /// so; rolled back otherwise (and on `Err`).
    pub(crate) fn write<T, E>(
        &self,
        f: impl FnOnce(Conn<'_>) -> Result<(T, Commit), E>,
    ) -> Result<T, E>
    where
        E: From<DbError>,
    {
        self.with_conn(false, |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(DbError::from)?;
            let (out, commit) = f(Conn::new(&tx))?;
            if commit == Commit::Yes {
                tx.commit().map_err(DbError::from)?;
            }
            // Dropping an uncommitted transaction rolls it back.
            Ok(out)
        })?
    }
}

/// A connection (inside a transaction or not), as [`super::Tx`] holds it;
/// `reader`: a `query_only` one of [`Pool::read`].
#[derive(Clone, Copy)]
pub(crate) struct Conn<'c> {
    conn: &'c Connection,
    reader: bool,
}

impl<'c> Conn<'c> {
    fn new(conn: &'c Connection) -> Self {
        Conn {
            conn,
            reader: false,
        }
    }

    fn reader(conn: &'c Connection) -> Self {
        Conn { conn, reader: true }
    }

    /// The driver's error as a [`DbError`]; on a reader, SQLite's refusal
    /// to write is [`DbError::WriteInRead`] naming the statement.
    fn error(&self, sql: &str, e: rusqlite::Error) -> DbError {
        match &e {
            rusqlite::Error::SqliteFailure(f, _)
                if self.reader && f.code == rusqlite::ErrorCode::ReadOnly =>
            {
                DbError::WriteInRead {
                    sql: super::statement_head(sql),
                }
            }
            _ => e.into(),
        }
    }

    pub(crate) fn execute(&self, sql: &str, params: &[Value]) -> Result<usize, DbError> {
        let run = || {
            let mut st = self.conn.prepare_cached(sql)?;
            st.execute(rusqlite::params_from_iter(params))
        };
        run().map_err(|e| self.error(sql, e))
    }

    /// The first `limit` rows of a query (all of them: `usize::MAX`).
    fn rows(&self, sql: &str, params: &[Value], limit: usize) -> Result<Vec<Row>, DbError> {
        let mut st = self
            .conn
            .prepare_cached(sql)
            .map_err(|e| self.error(sql, e))?;
        let n = st.column_count();
        let mut rows = st
            .query(rusqlite::params_from_iter(params))
            .map_err(|e| self.error(sql, e))?;
        let mut out = Vec::new();
        while out.len() < limit {
            match rows.next().map_err(|e| self.error(sql, e))? {
                Some(r) => out.push(read_row(r, n)?),
                None => break,
            }
        }
        Ok(out)
    }

    pub(crate) fn query(&self, sql: &str, params: &[Value]) -> Result<Vec<Row>, DbError> {
        self.rows(sql, params, usize::MAX)
    }

    pub(crate) fn query_opt(&self, sql: &str, params: &[Value]) -> Result<Option<Row>, DbError> {
        Ok(self.rows(sql, params, 1)?.into_iter().next())
    }
}

fn read_row(r: &rusqlite::Row<'_>, n: usize) -> Result<Row, DbError> {
    let mut values = Vec::with_capacity(n);
    for i in 0..n {
        values.push(match r.get_ref(i)? {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(v) => Value::Int(v),
            ValueRef::Text(t) => match std::str::from_utf8(t) {
                Ok(s) => Value::Text(s.to_owned()),
                Err(e) => {
                    return Err(DbError::Corrupt {
                        what: "text column",
                        detail: format!("column {i}: {e}"),
                    })
                }
            },
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
            // No column is REAL (every table is STRICT, none declares one).
            ValueRef::Real(_) => {
                return Err(DbError::Column {
                    index: i,
                    expected: "integer, text, blob or null",
                    found: "real",
                })
            }
        });
    }
    Ok(Row::new(values))
}

/// A read-only connection of its own, for the TLS verifier's clock: it
/// never waits on the pool nor long on a writer.
pub(crate) struct ClockConn(Mutex<Connection>);

impl ClockConn {
    /// Opens `path` (an existing, migrated database) read-only.
    pub(crate) fn open(path: &Path) -> Result<Self, DbError> {
        let open_err = |source| DbError::Open {
            path: path.to_owned(),
            source: SqliteError(source),
        };
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(open_err)?;
        conn.busy_timeout(CLOCK_READ_TIMEOUT).map_err(open_err)?;
        Ok(ClockConn(Mutex::new(conn)))
    }

    /// The stored clock offset.
    pub(crate) fn offset_ms(&self) -> Result<i64, DbError> {
        let conn = self.0.lock().unwrap_or_else(|p| p.into_inner());
        super::clock_offset_ms(&super::Tx::new(Conn::reader(&conn), super::Dialect::Sqlite))
    }
}

/// Creates the database file 0600 if it does not exist yet, so SQLite
/// (which copies the mode to its -wal and -shm files) never makes it
/// world-readable.
fn create_private(path: &Path) -> Result<(), DbError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(DbError::Create {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Opens a connection with the pragmas every connection needs.
fn connect(path: &Path) -> Result<Connection, DbError> {
    let open_err = |source| DbError::Open {
        path: path.to_owned(),
        source: SqliteError(source),
    };
    let conn = Connection::open(path).map_err(open_err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(open_err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(DbError::Corrupt {
            what: "journal mode",
            detail: format!("WAL was refused (got {mode})"),
        });
    }
    conn.pragma_update(None, "foreign_keys", true)
        .map_err(open_err)?;
    Ok(conn)
}

/// A connection for reads: [`connect`]'s, `query_only`.
fn connect_reader(path: &Path) -> Result<Connection, DbError> {
    let conn = connect(path)?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|source| DbError::Open {
            path: path.to_owned(),
            source: SqliteError(source),
        })?;
    Ok(conn)
}

/// Applies the migrations not yet applied, in one IMMEDIATE transaction, so
/// that a CLI command and `serve` starting together migrate once.
fn migrate(path: &Path, conn: &Connection) -> Result<SchemaChange, DbError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        let applied = schema_version(path, conn)?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(applied) {
            conn.execute_batch(sql)?;
            conn.pragma_update(None, "user_version", i + 1)?;
        }
        Ok(SchemaChange {
            from: applied,
            to: MIGRATIONS.len(),
        })
    })();
    match result {
        Ok(change) => conn
            .execute_batch("COMMIT")
            .map(|()| change)
            .map_err(DbError::from),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// How many migrations the file has applied; [`DbError::TooNew`] for a
/// version this build does not know.
fn schema_version(path: &Path, conn: &Connection) -> Result<usize, DbError> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    super::migrations::applied(version, |known| DbError::TooNew {
        path: path.to_owned(),
        found: version,
        known,
    })
}

/// The schema version of the file at `path`, read only (nothing created
/// or migrated): 0 when there is no file yet, as the first open will find.
pub(crate) fn pending(path: &Path) -> Result<usize, DbError> {
    if !path.try_exists().map_err(|source| DbError::Create {
        path: path.to_owned(),
        source,
    })? {
        return Ok(0);
    }
    let open_err = |e| DbError::Open {
        path: path.to_owned(),
        source: SqliteError(e),
    };
    let conn =
        Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(open_err)?;
    schema_version(path, &conn)
}

/// Test-only raw access: a database at `path` migrated to version
/// `applied` only, then `seed` run on it (for the migration tests, which
/// need the schema as an older bc-controlplane left it).
#[cfg(test)]
pub(crate) fn old_database(path: &Path, applied: usize, seed: &str) {
    let conn = Connection::open(path).unwrap();
    for sql in &MIGRATIONS[..applied] {
        conn.execute_batch(sql).unwrap();
    }
    conn.pragma_update(None, "user_version", applied).unwrap();
    conn.execute_batch(seed).unwrap();
}
