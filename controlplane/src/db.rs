//! The control plane's storage: one SQLite file, `DIR/controlplane.db`.
//!
//! WAL so that the CLI can read while `serve` writes; a busy timeout so that
//! concurrent writers (parallel joins, the CLI moving the clock) wait for each
//! other instead of failing; every write in a `BEGIN IMMEDIATE` transaction so
//! that the write lock is taken before anything is read (a join's token row
//! cannot change between its check and its use).
//!
//! The database also owns the clock: [`compute_now`] is the system time plus
//! `settings.clock_offset_ms`, read inside the transaction. Every expiry check
//! and certificate validity uses it, so tests can move time with
//! `bc-controlplane clock set` while a server runs.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};
use time::OffsetDateTime;

pub const DB_FILE: &str = "controlplane.db";

const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
const CLOCK_OFFSET_KEY: &str = "clock_offset_ms";
/// Idle connections kept for reuse by the server.
const POOL_MAX_IDLE: usize = 8;

/// Schema migrations; `PRAGMA user_version` is the number applied. Append
/// only: a shipped migration never changes.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: tokens, nodes, certificates, events, settings.
    r#"
    CREATE TABLE settings (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT;

    CREATE TABLE join_tokens (
        id            TEXT PRIMARY KEY,
        secret_sha256 BLOB NOT NULL CHECK (length(secret_sha256) = 32),
        role          TEXT NOT NULL,
        uses_left     INTEGER NOT NULL CHECK (uses_left >= 0),
        expires_at    INTEGER NOT NULL,
        revoked_at    INTEGER,
        created_at    INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE nodes (
        id                  TEXT PRIMARY KEY,
        role                TEXT NOT NULL,
        identity_generation INTEGER NOT NULL CHECK (identity_generation >= 1),
        attestor            TEXT NOT NULL,
        joined_at           INTEGER NOT NULL,
        retired_at          INTEGER
    ) STRICT;

    CREATE TABLE node_certs (
        serial              TEXT PRIMARY KEY,
        node_id             TEXT NOT NULL REFERENCES nodes(id),
        identity_generation INTEGER NOT NULL,
        der                 BLOB NOT NULL,
        not_before          INTEGER NOT NULL,
        not_after           INTEGER NOT NULL,
        revoked_at          INTEGER
    ) STRICT;
    CREATE INDEX node_certs_by_node ON node_certs(node_id, identity_generation);

    CREATE TABLE events (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        type      TEXT NOT NULL,
        at        INTEGER NOT NULL,
        attestor  TEXT,
        reason    TEXT,
        token_id  TEXT,
        node_id   TEXT,
        data      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data))
    ) STRICT;
    CREATE INDEX events_by_type ON events(type, id);
    "#,
    // 2: pools, hardware bindings, the joins audit, and the tpm attestor's
    // EK roots, resolve allow-list and enrollment requests.
    r#"
    CREATE TABLE pools (
        id         TEXT PRIMARY KEY,
        owner      TEXT NOT NULL,
        policy     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(policy)),
        created_at INTEGER NOT NULL
    ) STRICT;
    INSERT INTO pools (id, owner, policy, created_at)
        VALUES ('default', 'root', '{}', CAST(strftime('%s', 'now') AS INTEGER) * 1000);

    -- No REFERENCES: SQLite cannot add a foreign key column with a non-NULL
    -- default. Pools are never deleted, and every writer checks the pool.
    ALTER TABLE nodes ADD COLUMN pool_id TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE join_tokens ADD COLUMN pool_id TEXT;

    -- A hardware key (kind 'tpm-ek': SHA-256 of the EK's SPKI) bound to the
    -- one node it may ever admit; one binding per node and kind.
    CREATE TABLE node_bindings (
        kind       TEXT NOT NULL,
        key        TEXT NOT NULL,
        node_id    TEXT NOT NULL REFERENCES nodes(id),
        created_at INTEGER NOT NULL,
        PRIMARY KEY (kind, key),
        UNIQUE (node_id, kind)
    ) STRICT;

    -- One row per admitted join (new node or reclaim).
    CREATE TABLE joins (
        id                  INTEGER PRIMARY KEY AUTOINCREMENT,
        node_id             TEXT NOT NULL REFERENCES nodes(id),
        attestor            TEXT NOT NULL,
        node_key            TEXT NOT NULL CHECK (node_key IN ('tpm', 'unattested')),
        identity_generation INTEGER NOT NULL,
        at                  INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX joins_by_node ON joins(node_id, id);

    CREATE TABLE ek_roots (
        sha256    TEXT PRIMARY KEY,
        der       BLOB NOT NULL,
        subject   TEXT NOT NULL,
        not_after INTEGER NOT NULL,
        added_at  INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE tpm_resolve (
        ek_sha256  TEXT PRIMARY KEY,
        pool_id    TEXT,
        node_id    TEXT,
        created_at INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE join_requests (
        id         TEXT PRIMARY KEY,
        attestor   TEXT NOT NULL,
        ek_sha256  TEXT NOT NULL,
        ek_issuer  TEXT NOT NULL,
        ek_serial  TEXT NOT NULL,
        status     TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied')),
        pool_id    TEXT,
        created_at INTEGER NOT NULL,
        decided_at INTEGER,
        used_at    INTEGER
    ) STRICT;
    -- At most one open (not yet used) request per EK: a pending one is
    -- answered again, a denied one stays denied.
    CREATE UNIQUE INDEX join_requests_open ON join_requests(ek_sha256) WHERE used_at IS NULL;
    "#,
    // 3: the node lifecycle (cordon, delete). A deleted node keeps its row,
    // so its certificates, joins and events keep naming a node, but no
    // lookup of a live node finds it again.
    r#"
    ALTER TABLE nodes ADD COLUMN cordoned_at INTEGER;
    ALTER TABLE nodes ADD COLUMN deleted_at INTEGER;
    "#,
    // 4: a token's expect binding: the machine it was minted for, by product
    // UUID and/or MAC (normalized lowercase; NULL: not bound). JoinService
    // compares them with the join's hardware claims.
    r#"
    ALTER TABLE join_tokens ADD COLUMN expect_product_uuid TEXT;
    ALTER TABLE join_tokens ADD COLUMN expect_mac TEXT;
    "#,
    // 5: event retention prunes by time (oldest first, in bounded batches).
    r#"
    CREATE INDEX events_by_at ON events(at);
    "#,
    // 6: single-use evidence (spec "Single-use evidence"): what an attestor
    // accepted, recorded in the join transaction so that the same evidence
    // admits once, across restarts and replicas. `subject` is a digest the
    // attestor chooses (a TPM challenge, an x509pop proof); rows past
    // `expires_at` are pruned (see `uses`).
    r#"
    CREATE TABLE attestation_uses (
        attestor   TEXT NOT NULL,
        subject    TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        PRIMARY KEY (attestor, subject)
    ) STRICT;
    CREATE INDEX attestation_uses_expiry ON attestation_uses (expires_at);
    "#,
    // 7: discovery. Sites; the site a token admits to and a node belongs to;
    // what a node may be sent (`allowed_kinds`, a JSON array; NULL: no
    // restriction) and how long its certificates may last (ramdisks); boot
    // entries (machines to commission, each with its single-use discovery
    // token, whose secret is kept sealed for the lease holder); leases.
    r#"
    CREATE TABLE sites (
        id         TEXT PRIMARY KEY,
        name       TEXT NOT NULL UNIQUE,
        created_at INTEGER NOT NULL
    ) STRICT;
    ALTER TABLE join_tokens ADD COLUMN site_id TEXT;
    ALTER TABLE nodes ADD COLUMN site_id TEXT;
    ALTER TABLE nodes ADD COLUMN allowed_kinds TEXT CHECK (allowed_kinds IS NULL OR json_valid(allowed_kinds));
    ALTER TABLE nodes ADD COLUMN max_cert_ttl_ms INTEGER;

    CREATE TABLE boot_entries (
        workflow_id   TEXT PRIMARY KEY,
        site_id       TEXT NOT NULL REFERENCES sites(id),
        mac           TEXT NOT NULL,
        product_uuid  TEXT,
        token_id      TEXT NOT NULL REFERENCES join_tokens(id),
        sealed_secret BLOB NOT NULL,
        not_after     INTEGER NOT NULL,
        created_at    INTEGER NOT NULL,
        vouched_at    INTEGER,
        joined_at     INTEGER,
        node_id       TEXT
    ) STRICT;
    CREATE INDEX boot_entries_by_site ON boot_entries(site_id, created_at);

    CREATE TABLE leases (
        name       TEXT PRIMARY KEY,
        holder     TEXT,
        epoch      INTEGER NOT NULL,
        expires_at INTEGER NOT NULL
    ) STRICT;
    "#,
    // 8: provisioned tokens and hardware keys (spec "provisioned", "join-token":
    // the reclaim flag). A token may name the node it re-keys and may allow a
    // reclaim; a node records its trusted hardware key (`tpm-ek:<sha256>` or
    // `product-uuid:<uuid>`) and the product UUID an attestor proved, so that
    // one machine never becomes two live nodes; each join keeps the product
    // UUID it claimed (a provisioned token's target is read from it).
    r#"
    ALTER TABLE join_tokens ADD COLUMN target_node_id TEXT;
    ALTER TABLE join_tokens ADD COLUMN allow_reclaim INTEGER NOT NULL DEFAULT 0 CHECK (allow_reclaim IN (0, 1));
    ALTER TABLE nodes ADD COLUMN hardware_key TEXT;
    ALTER TABLE nodes ADD COLUMN product_uuid TEXT;
    CREATE INDEX nodes_by_hardware_key ON nodes(hardware_key) WHERE hardware_key IS NOT NULL;
    CREATE INDEX nodes_by_product_uuid ON nodes(product_uuid) WHERE product_uuid IS NOT NULL;
    ALTER TABLE joins ADD COLUMN product_uuid TEXT;
    -- Nodes that joined before: a TPM-bound node's key is its EK.
    UPDATE nodes SET hardware_key = 'tpm-ek:' || (
        SELECT key FROM node_bindings b WHERE b.node_id = nodes.id AND b.kind = 'tpm-ek')
    WHERE deleted_at IS NULL
      AND EXISTS (SELECT 1 FROM node_bindings b WHERE b.node_id = nodes.id AND b.kind = 'tpm-ek');
    "#,
    // 9: cloud-iid's resolve table: where a VM of a provider account (and
    // zone; '' is any zone) joins. A VM of an account not listed is refused.
    r#"
    CREATE TABLE cloud_resolve (
        provider   TEXT NOT NULL,
        account    TEXT NOT NULL,
        zone       TEXT NOT NULL,
        pool_id    TEXT,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (provider, account, zone)
    ) STRICT;
    "#,
    // 10: the site a TPM joins as a site node of: a resolve entry's or an
    // approved join request's (NULL: a plain node).
    r#"
    ALTER TABLE tpm_resolve ADD COLUMN site_id TEXT;
    ALTER TABLE join_requests ADD COLUMN site_id TEXT;
    "#,
    // 11: a boot entry's discovery tokens: one per boot script (each single
    // use), so that the entry is spent by a join, not by a request. The
    // entry's own token (boot_entries.token_id) is the first.
    r#"
    CREATE TABLE boot_tokens (
        token_id    TEXT PRIMARY KEY REFERENCES join_tokens(id),
        workflow_id TEXT NOT NULL REFERENCES boot_entries(workflow_id),
        created_at  INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX boot_tokens_by_workflow ON boot_tokens(workflow_id);
    INSERT INTO boot_tokens (token_id, workflow_id, created_at)
        SELECT token_id, workflow_id, created_at FROM boot_entries;
    CREATE INDEX boot_entries_by_node ON boot_entries(node_id) WHERE node_id IS NOT NULL;
    -- Claimed UUIDs were kept as trusted ones before: a TPM join's SMBIOS
    -- UUID, a ramdisk's asserted (iPXE's) UUID, and placeholders. Only the EK
    -- of a TPM node stays its key.
    UPDATE nodes SET product_uuid = NULL WHERE hardware_key LIKE 'tpm-ek:%';
    UPDATE nodes SET hardware_key = NULL, product_uuid = NULL WHERE role = 'ramdisk';
    UPDATE nodes SET hardware_key = NULL, product_uuid = NULL
     WHERE product_uuid IN ('00000000-0000-0000-0000-000000000000',
                            'ffffffff-ffff-ffff-ffff-ffffffffffff',
                            '03000200-0400-0500-0006-000700080009',
                            '00020003-0004-0005-0006-000700080009',
                            '12345678-1234-5678-90ab-cddeefaabbcc');
    "#,
    // 12: the roles a cloud resolve row admits beyond `[cloud_iid] roles`
    // (`cloud resolve add --role`): role names separated by ',' (NULL: none).
    r#"
    ALTER TABLE cloud_resolve ADD COLUMN roles TEXT;
    "#,
    // 13: what a configured EK CA is for: `anchor` (every certificate
    // `ek-roots add` adds, self-signed or not) or `intermediate` (`ek-roots
    // add --intermediate`). Rows added before (NULL) keep their meaning: an
    // anchor when self-signed, else an intermediate.
    r#"
    ALTER TABLE ek_roots ADD COLUMN kind TEXT CHECK (kind IS NULL OR kind IN ('anchor', 'intermediate'));
    "#,
    // 14: a resolve entry may pin an EK that has no EK certificate
    // (`resolve add --uncertified`, the spec's allowUncertifiedEk).
    r#"
    ALTER TABLE tpm_resolve ADD COLUMN uncertified INTEGER NOT NULL DEFAULT 0 CHECK (uncertified IN (0, 1));
    "#,
    // 15: where a tpm join's EK certificate came from (the EK assurance:
    // nv, nv-chain, operator-file, maker-service, pinned); NULL for joins
    // that proved no EK.
    r#"
    ALTER TABLE joins ADD COLUMN ek_assurance TEXT;
    "#,
    // 16: discovery joins waiting for an operator (`[discovery] approval =
    // "unknown-machines"`) are join requests too, so `requests list|approve|
    // deny` decide both. Such a request names the boot entry (workflow), the
    // MAC and UUID the join was for, its source address, and what it proved:
    // the EK when the ramdisk proved its TPM, else only its node key (the
    // CSR's key), so `ek_sha256` becomes nullable (the table is rebuilt:
    // SQLite cannot drop a NOT NULL). The tpm attestor's one open request
    // per EK stays; a discovery request is open once per entry and evidence.
    r#"
    CREATE TABLE join_requests_16 (
        id              TEXT PRIMARY KEY,
        attestor        TEXT NOT NULL,
        ek_sha256       TEXT,
        ek_issuer       TEXT NOT NULL DEFAULT '',
        ek_serial       TEXT NOT NULL DEFAULT '',
        status          TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied')),
        pool_id         TEXT,
        created_at      INTEGER NOT NULL,
        decided_at      INTEGER,
        used_at         INTEGER,
        site_id         TEXT,
        workflow_id     TEXT,
        mac             TEXT,
        product_uuid    TEXT,
        source          TEXT,
        node_key_sha256 TEXT,
        CHECK (ek_sha256 IS NOT NULL OR (attestor = 'discovery' AND node_key_sha256 IS NOT NULL))
    ) STRICT;
    INSERT INTO join_requests_16 (id, attestor, ek_sha256, ek_issuer, ek_serial, status, pool_id,
                                  created_at, decided_at, used_at, site_id)
        SELECT id, attestor, ek_sha256, ek_issuer, ek_serial, status, pool_id,
               created_at, decided_at, used_at, site_id FROM join_requests;
    DROP TABLE join_requests;
    ALTER TABLE join_requests_16 RENAME TO join_requests;
    CREATE UNIQUE INDEX join_requests_open ON join_requests(ek_sha256)
        WHERE used_at IS NULL AND attestor <> 'discovery';
    CREATE UNIQUE INDEX join_requests_open_boot
        ON join_requests(coalesce(workflow_id, ''), coalesce('ek:' || ek_sha256, 'key:' || node_key_sha256))
        WHERE used_at IS NULL AND attestor = 'discovery';
    "#,
];

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("opening {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
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
    Sqlite(rusqlite::Error),
    #[error("the database holds an invalid {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error("the system's random generator failed: {0}")]
    Random(getrandom::Error),
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        if is_busy(&e) {
            DbError::Busy
        } else {
            DbError::Sqlite(e)
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

/// The database of one control plane DIR: opens connections (migrated on
/// first open) and keeps a few idle ones for reuse.
pub struct Database {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl Database {
    /// Opens `DIR/controlplane.db`, creating and migrating it as needed.
    pub fn open_dir(dir: &Path) -> Result<Self, DbError> {
        Self::open(&dir.join(DB_FILE))
    }

    pub fn open(path: &Path) -> Result<Self, DbError> {
        create_private(path)?;
        let conn = connect(path)?;
        migrate(path, &conn)?;
        Ok(Database {
            path: path.to_owned(),
            idle: Mutex::new(vec![conn]),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` with a connection of this database. Connections are not
    /// shared between threads; each call gets one of its own.
    pub fn with_conn<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> Result<T, DbError> {
        let pooled = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => connect(&self.path)?,
        };
        let out = f(&mut conn);
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL_MAX_IDLE {
            idle.push(conn);
        }
        Ok(out)
    }

    /// Runs `f` inside one `BEGIN IMMEDIATE` transaction and commits if it
    /// returns `Ok`; an `Err` rolls everything back.
    pub fn write<T, E>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T, E>) -> Result<T, E>
    where
        E: From<DbError>,
    {
        self.with_conn(|conn| {
            let tx = immediate(conn)?;
            let out = f(&tx)?;
            tx.commit().map_err(DbError::from)?;
            Ok(out)
        })?
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
        source,
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

/// Starts a write transaction: the write lock is taken at BEGIN.
pub fn immediate(conn: &mut Connection) -> Result<Transaction<'_>, DbError> {
    Ok(conn.transaction_with_behavior(TransactionBehavior::Immediate)?)
}

/// Applies the migrations not yet applied, in one IMMEDIATE transaction, so
/// that a CLI command and `serve` starting together migrate once.
fn migrate(path: &Path, conn: &Connection) -> Result<(), DbError> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| {
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        let applied = usize::try_from(version).map_err(|_| DbError::Corrupt {
            what: "schema version",
            detail: version.to_string(),
        })?;
        if applied > MIGRATIONS.len() {
            return Err(DbError::TooNew {
                path: path.to_owned(),
                found: version,
                known: MIGRATIONS.len(),
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(applied) {
            conn.execute_batch(sql)?;
            conn.pragma_update(None, "user_version", i + 1)?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => conn.execute_batch("COMMIT").map_err(DbError::from),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

/// Milliseconds since the Unix epoch.
pub type UnixMs = i64;

/// The database's time: system time plus the clock offset, read in `conn`'s
/// transaction so the whole transaction sees one consistent "now".
pub fn compute_now(conn: &Connection) -> Result<UnixMs, DbError> {
    Ok(system_now_ms().saturating_add(clock_offset_ms(conn)?))
}

pub fn clock_offset_ms(conn: &Connection) -> Result<i64, DbError> {
    let v: Option<String> = conn
        .query_row(
            "SELECT value FROM settings WHERE key = ?1",
            [CLOCK_OFFSET_KEY],
            |r| r.get(0),
        )
        .optional()?;
    match v {
        None => Ok(0),
        Some(s) => s.parse().map_err(|_| DbError::Corrupt {
            what: "clock offset",
            detail: s,
        }),
    }
}

/// Moves the database clock to system time + `offset_ms`.
pub fn set_clock_offset_ms(tx: &Transaction<'_>, offset_ms: i64) -> Result<(), DbError> {
    tx.execute(
        "INSERT INTO settings (key, value) VALUES (?1, ?2)
         ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        rusqlite::params![CLOCK_OFFSET_KEY, offset_ms.to_string()],
    )?;
    Ok(())
}

/// The system clock in milliseconds (no offset): for in-memory bookkeeping
/// only; records use [`compute_now`].
pub fn system_now_ms() -> UnixMs {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrates_once_and_moves_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::open_dir(dir.path()).unwrap();
        // Opening again is a no-op migration.
        let db2 = Database::open_dir(dir.path()).unwrap();
        let v: i64 = db2
            .with_conn(|c| c.query_row("PRAGMA user_version", [], |r| r.get(0)))
            .unwrap()
            .unwrap();
        assert_eq!(v, MIGRATIONS.len() as i64);

        let before = db.with_conn(|c| compute_now(c)).unwrap().unwrap();
        db.write(|tx| set_clock_offset_ms(tx, 3_600_000)).unwrap();
        let after = db2.with_conn(|c| compute_now(c)).unwrap().unwrap();
        assert!(after - before >= 3_600_000);
        assert!(after - before < 3_660_000);
    }

    /// Migration 8 gives a node bound to an EK before it that EK as its
    /// hardware key, so an upgrade does not let its machine join twice.
    #[test]
    fn migration_8_backfills_tpm_hardware_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let conn = Connection::open(&path).unwrap();
            for sql in &MIGRATIONS[..7] {
                conn.execute_batch(sql).unwrap();
            }
            conn.pragma_update(None, "user_version", 7).unwrap();
            conn.execute_batch(
                "INSERT INTO nodes (id, role, identity_generation, attestor, joined_at)
                     VALUES ('node_a', 'node', 1, 'tpm', 1), ('node_b', 'node', 1, 'join-token', 1);
                 INSERT INTO node_bindings (kind, key, node_id, created_at)
                     VALUES ('tpm-ek', 'ab12', 'node_a', 1);",
            )
            .unwrap();
        }
        let db = Database::open(&path).unwrap();
        let keys = crate::hardware::keys(&db).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys["node_a"], "tpm-ek:ab12");
    }

    /// Migration 11 keeps only attested or operator-bound hardware keys:
    /// a TPM node's claimed UUID, a ramdisk's asserted one and placeholders
    /// go; an EK and a bound UUID stay. Boot entries' tokens are linked.
    #[test]
    fn migration_11_drops_claimed_hardware_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let conn = Connection::open(&path).unwrap();
            for sql in &MIGRATIONS[..10] {
                conn.execute_batch(sql).unwrap();
            }
            conn.pragma_update(None, "user_version", 10).unwrap();
            conn.execute_batch(
                "INSERT INTO nodes (id, role, identity_generation, attestor, joined_at,
                                    hardware_key, product_uuid) VALUES
                   ('node_tpm', 'node', 1, 'tpm', 1, 'tpm-ek:ab12',
                    '03000200-0400-0500-0006-000700080009'),
                   ('node_ram', 'ramdisk', 1, 'discovery', 1,
                    'product-uuid:4c4c4544-0042-3510-8052-b4c04f4e4d32',
                    '4c4c4544-0042-3510-8052-b4c04f4e4d32'),
                   ('node_zero', 'node', 1, 'join-token', 1,
                    'product-uuid:00000000-0000-0000-0000-000000000000',
                    '00000000-0000-0000-0000-000000000000'),
                   ('node_bound', 'node', 1, 'join-token', 1,
                    'product-uuid:4c4c4544-0042-3510-8052-b4c04f4e4d32',
                    '4c4c4544-0042-3510-8052-b4c04f4e4d32');
                 INSERT INTO sites (id, name, created_at) VALUES ('site_1', 'dc1', 1);
                 INSERT INTO join_tokens (id, secret_sha256, role, uses_left, expires_at, created_at)
                     VALUES ('tok_1', zeroblob(32), 'discovery', 1, 9, 1);
                 INSERT INTO boot_entries (workflow_id, site_id, mac, token_id, sealed_secret,
                                           not_after, created_at)
                     VALUES ('wf_1', 'site_1', '52:54:00:12:34:56', 'tok_1', x'00', 9, 1);",
            )
            .unwrap();
        }
        let db = Database::open(&path).unwrap();
        let keys = crate::hardware::keys(&db).unwrap();
        assert_eq!(keys.len(), 2, "{keys:?}");
        assert_eq!(keys["node_tpm"], "tpm-ek:ab12");
        assert!(keys["node_bound"].starts_with("product-uuid:4c4c4544"));
        let linked: String = db
            .with_conn(|c| {
                c.query_row(
                    "SELECT workflow_id FROM boot_tokens WHERE token_id = 'tok_1'",
                    [],
                    |r| r.get(0),
                )
            })
            .unwrap()
            .unwrap();
        assert_eq!(linked, "wf_1");
    }

    /// Migration 16 keeps every enrollment request as it was, and lets a
    /// discovery request carry no EK; one open request per EK (tpm) and
    /// per entry and evidence (discovery).
    #[test]
    fn migration_16_keeps_enrollment_requests_and_admits_discovery_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            let conn = Connection::open(&path).unwrap();
            for sql in &MIGRATIONS[..15] {
                conn.execute_batch(sql).unwrap();
            }
            conn.pragma_update(None, "user_version", 15).unwrap();
            conn.execute_batch(
                "INSERT INTO join_requests (id, attestor, ek_sha256, ek_issuer, ek_serial, status,
                                            created_at, site_id)
                     VALUES ('req_1', 'tpm', 'ab12', 'CN=x', '01', 'pending', 5, 'site_1');",
            )
            .unwrap();
        }
        let db = Database::open(&path).unwrap();
        let rows = crate::attestors::tpm::enroll::list_requests(&db).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].ek_sha256.as_deref(), Some("ab12"));
        assert_eq!(rows[0].site_id.as_deref(), Some("site_1"));
        assert_eq!(rows[0].created_at, 5);
        let insert = |id: &str, attestor: &str, ek: Option<&str>, key: Option<&str>| {
            db.with_conn(|c| {
                c.execute(
                    "INSERT INTO join_requests (id, attestor, ek_sha256, status, created_at,
                                                workflow_id, node_key_sha256)
                     VALUES (?1, ?2, ?3, 'pending', 6, 'wf_1', ?4)",
                    rusqlite::params![id, attestor, ek, key],
                )
            })
            .unwrap()
        };
        assert!(
            insert("req_2", "tpm", Some("ab12"), None).is_err(),
            "one open per EK"
        );
        assert!(
            insert("req_3", "tpm", None, None).is_err(),
            "a tpm request has an EK"
        );
        assert!(
            insert("req_4", "discovery", None, None).is_err(),
            "or a node key"
        );
        insert("req_5", "discovery", None, Some("k1")).unwrap();
        insert("req_6", "discovery", None, Some("k2")).unwrap();
        assert!(insert("req_7", "discovery", None, Some("k1")).is_err());
        // A discovery request proving the EK of a pending enrollment.
        insert("req_8", "discovery", Some("ab12"), Some("k3")).unwrap();
    }

    #[test]
    fn rfc3339_format() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
