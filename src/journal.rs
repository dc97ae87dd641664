//! `journal.db`: the node's own record of joins, renewals, re-joins and
//! their failures, so that `bcd status` and `bcd doctor` can say what last
//! happened without asking the control plane. SQLite, one table, appended
//! to and pruned: it keeps the newest [`KEEP_ENTRIES`] entries and every
//! entry younger than [`KEEP_FOR`], whichever is more, so a node that fails
//! for months cannot fill its disk. `--reset` moves it aside with the
//! identity. The command channel's tables are in [`commands`].

pub(crate) mod commands;

use std::path::Path;

use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use time::OffsetDateTime;

use crate::clock;
use crate::identity::{guard, JOURNAL_FILE};
use crate::pki::rfc3339;

/// Entries always kept, however old.
pub(crate) const KEEP_ENTRIES: u32 = 1000;
/// Entries younger than this are kept, however many.
pub(crate) const KEEP_FOR: time::Duration = time::Duration::days(90);

#[derive(Debug, thiserror::Error)]
#[error("the journal {path}: {source}")]
pub struct JournalError {
    path: String,
    #[source]
    source: JournalCause,
}

/// SQLite's error, or the file system's when creating the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JournalCause {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What happened. Stored as its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Join,
    Renewal,
    RenewalFailed,
    Rejoin,
    RejoinFailed,
}

impl Kind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Join => "join",
            Kind::Renewal => "renewal",
            Kind::RenewalFailed => "renewal-failed",
            Kind::Rejoin => "rejoin",
            Kind::RejoinFailed => "rejoin-failed",
        }
    }

    fn from_name(s: &str) -> Option<Kind> {
        [
            Kind::Join,
            Kind::Renewal,
            Kind::RenewalFailed,
            Kind::Rejoin,
            Kind::RejoinFailed,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub at: OffsetDateTime,
    pub kind: Kind,
    pub node_id: String,
    /// One line for an operator; never a secret.
    pub detail: String,
    /// The certificate's notAfter after a successful join, renewal or re-join.
    pub not_after: Option<OffsetDateTime>,
}

pub struct Journal {
    conn: Connection,
    path: String,
}

impl Journal {
    /// Opens (and creates, 0600) `journal.db` in the data directory.
    pub fn open(data_dir: &Path) -> Result<Journal, JournalError> {
        let file = data_dir.join(JOURNAL_FILE);
        let path = file.display().to_string();
        let err = |source: rusqlite::Error| JournalError {
            path: path.clone(),
            source: source.into(),
        };
        // bcd's own directory and file, created private (before SQLite
        // opens it with the umask's mode) and never through a link; SQLite
        // then opens it refusing links too.
        guard::check_dir(data_dir)
            .and_then(|()| guard::create_private(&file))
            .map_err(|e| JournalError {
                path: path.clone(),
                source: e.into(),
            })?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_NOFOLLOW;
        let conn = Connection::open_with_flags(&file, flags).map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS journal (
                id INTEGER PRIMARY KEY,
                at TEXT NOT NULL,
                kind TEXT NOT NULL,
                node_id TEXT NOT NULL,
                detail TEXT NOT NULL,
                not_after TEXT
            );",
        )
        .map_err(err)?;
        Ok(Journal { conn, path })
    }

    /// Appends `entry` and prunes what is past both limits (see the module
    /// doc), in one transaction.
    pub fn record(&mut self, entry: &Entry) -> Result<(), JournalError> {
        let err = |source: rusqlite::Error| JournalError {
            path: self.path.clone(),
            source: source.into(),
        };
        let tx = self.conn.transaction().map_err(err)?;
        tx.execute(
            "INSERT INTO journal (at, kind, node_id, detail, not_after) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                rfc3339(entry.at),
                entry.kind.as_str(),
                entry.node_id,
                entry.detail,
                entry.not_after.map(rfc3339)
            ],
        )
        .map_err(err)?;
        // `at` is RFC 3339 in UTC to the second: it sorts as text.
        tx.execute(
            "DELETE FROM journal WHERE at < ?1 AND id < \
             (SELECT id FROM journal ORDER BY id DESC LIMIT 1 OFFSET ?2)",
            params![rfc3339(entry.at - KEEP_FOR), KEEP_ENTRIES - 1],
        )
        .map_err(err)?;
        tx.commit().map_err(err)
    }

    /// How many entries the journal holds (the pruning tests').
    #[cfg(test)]
    fn len(&self) -> Result<u64, JournalError> {
        self.conn
            .query_row("SELECT COUNT(*) FROM journal", [], |r| r.get(0))
            .map_err(|source| JournalError {
                path: self.path.clone(),
                source: source.into(),
            })
    }

    /// The newest entry of one of `kinds`.
    pub(crate) fn last(&self, kinds: &[Kind]) -> Result<Option<Entry>, JournalError> {
        let names: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        let placeholders = vec!["?"; names.len()].join(",");
        let sql = format!(
            "SELECT at, kind, node_id, detail, not_after FROM journal WHERE kind IN ({placeholders}) ORDER BY id DESC LIMIT 1"
        );
        let err = |source: rusqlite::Error| JournalError {
            path: self.path.clone(),
            source: source.into(),
        };
        let mut stmt = self.conn.prepare(&sql).map_err(err)?;
        let row = stmt
            .query_row(rusqlite::params_from_iter(names.iter()), |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                ))
            })
            .optional()
            .map_err(err)?;
        Ok(row.and_then(|(at, kind, node_id, detail, not_after)| {
            let parse = |s: &str| {
                OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
            };
            Some(Entry {
                at: parse(&at)?,
                kind: Kind::from_name(&kind)?,
                node_id,
                detail,
                not_after: not_after.as_deref().and_then(parse),
            })
        }))
    }

    /// The last renewal attempt, successful or not.
    pub(crate) fn last_renewal(&self) -> Result<Option<Entry>, JournalError> {
        self.last(&[Kind::Renewal, Kind::RenewalFailed])
    }
}

/// Appends to the journal. The journal is the node's own history; losing an
/// entry loses no identity, so a failure is a warning.
pub(crate) fn record(
    data_dir: &Path,
    kind: Kind,
    node_id: &str,
    detail: String,
    not_after: Option<OffsetDateTime>,
) {
    let entry = Entry {
        at: clock::now_seconds(),
        kind,
        node_id: node_id.to_owned(),
        detail,
        not_after,
    };
    if let Err(e) = Journal::open(data_dir).and_then(|mut j| j.record(&entry)) {
        tracing::warn!(error = %e, kind = kind.as_str(), "cannot record in the journal");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn records_and_reads_back_the_newest_of_a_kind() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path()).unwrap();
        assert_eq!(j.last_renewal().unwrap(), None);
        let at = OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap();
        let ok = Entry {
            at,
            kind: Kind::Renewal,
            node_id: "node_a".into(),
            detail: "renewed".into(),
            not_after: Some(at),
        };
        j.record(&ok).unwrap();
        let failed = Entry {
            kind: Kind::RenewalFailed,
            detail: "unreachable".into(),
            not_after: None,
            ..ok.clone()
        };
        j.record(&failed).unwrap();
        j.record(&Entry {
            kind: Kind::Join,
            ..ok.clone()
        })
        .unwrap();
        assert_eq!(j.last_renewal().unwrap(), Some(failed));
        assert_eq!(j.last(&[Kind::Renewal]).unwrap(), Some(ok));
        let mode = std::fs::metadata(dir.path().join(JOURNAL_FILE))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn keeps_the_newest_thousand_or_ninety_days_whichever_is_more() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path()).unwrap();
        // Thousands of entries: without a sync each, or the test takes a minute.
        j.conn.pragma_update(None, "synchronous", "OFF").unwrap();
        let now = OffsetDateTime::from_unix_timestamp(1_790_000_000).unwrap();
        let entry = |at, n: u32| Entry {
            at,
            kind: Kind::RejoinFailed,
            node_id: "node_a".into(),
            detail: format!("attempt {n}"),
            not_after: None,
        };
        // A year-old flood, then today's entry: the newest 1,000 stay.
        let old = now - time::Duration::days(365);
        for n in 0..1_200 {
            j.record(&entry(old, n)).unwrap();
        }
        j.record(&entry(now, 0)).unwrap();
        assert_eq!(j.len().unwrap(), 1_000);
        assert_eq!(j.last(&[Kind::RejoinFailed]).unwrap().unwrap().at, now);
        // Within 90 days everything stays, and the year-old entries go once
        // 1,000 newer ones are there.
        let recent = now + time::Duration::days(89);
        for n in 0..1_500 {
            j.record(&entry(recent, n)).unwrap();
        }
        assert_eq!(j.len().unwrap(), 1_501);
    }
}
