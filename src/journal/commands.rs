//! The command channel's part of `journal.db`: every command the agent
//! accepted (`commands`) and every result it owes the control plane
//! (`results`), beside the identity entries of [`super::Journal`].
//!
//! `commands` is what makes a command run at most once: [`first_sight`]
//! records an id in one statement (`INSERT … ON CONFLICT DO NOTHING`), so
//! of two deliveries of one id exactly one is first, also across restarts.
//! An id is kept at least until its `not_after` (after that the command is
//! refused as expired before the journal is asked). `results` holds a
//! result, unsigned (it is signed when sent, by the key the node holds
//! then), until the control plane acks it.
//!
//! [`first_sight`]: bc_wire::command::Journal::first_sight

use bc_wire::command::Journal as CommandLog;
use bc_wire::command_v1::{CommandResult, SignedCommand, Status};
use prost::Message;
use rusqlite::{params, OptionalExtension};

use super::{Journal, JournalError};

/// How long a command row outlives its `not_after`, and an acked result its
/// acknowledgement: a day of history for `bcd status` and an operator.
const KEEP_AFTER_MS: i64 = 24 * 3_600_000;
/// The most results kept unacked: a control plane that never acks (or a
/// flood of refusals under claimed ids) cannot fill the disk; the oldest go.
pub(crate) const MAX_UNACKED: i64 = 1000;

/// A command's state in the journal.
pub(crate) const ACCEPTED: &str = "accepted";
pub(crate) const DONE: &str = "done";

impl Journal {
    /// Creates the command tables (once; cheap when they exist).
    pub(crate) fn open_commands(data_dir: &std::path::Path) -> Result<Journal, JournalError> {
        let journal = Journal::open(data_dir)?;
        journal
            .conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS commands (
                    id TEXT PRIMARY KEY,
                    kind TEXT NOT NULL,
                    not_after INTEGER NOT NULL,
                    signed BLOB NOT NULL,
                    received_at INTEGER NOT NULL,
                    state TEXT NOT NULL
                );
                CREATE TABLE IF NOT EXISTS results (
                    id TEXT PRIMARY KEY,
                    result BLOB NOT NULL,
                    stored_at INTEGER NOT NULL,
                    acked INTEGER NOT NULL DEFAULT 0
                );",
            )
            .map_err(|e| journal.error(e))?;
        Ok(journal)
    }

    fn error(&self, source: rusqlite::Error) -> JournalError {
        JournalError {
            path: self.path.clone(),
            source: source.into(),
        }
    }

    /// Stores `result` (replacing one under its id), unacked, marks its
    /// command done, and prunes: commands and acked results a day past
    /// their time, and unacked results beyond [`MAX_UNACKED`].
    pub(crate) fn store_result(
        &mut self,
        result: &CommandResult,
        now_ms: i64,
    ) -> Result<(), JournalError> {
        let path = self.path.clone();
        let err = |e: rusqlite::Error| JournalError {
            path: path.clone(),
            source: e.into(),
        };
        let tx = self.conn.transaction().map_err(err)?;
        let run = |tx: &rusqlite::Transaction<'_>| -> rusqlite::Result<()> {
            tx.execute(
                "INSERT INTO results (id, result, stored_at, acked) VALUES (?1, ?2, ?3, 0)
                 ON CONFLICT(id) DO UPDATE SET result = ?2, stored_at = ?3, acked = 0",
                params![result.id, result.encode_to_vec(), now_ms],
            )?;
            tx.execute(
                "UPDATE commands SET state = ?2 WHERE id = ?1",
                params![result.id, DONE],
            )?;
            let old = now_ms.saturating_sub(KEEP_AFTER_MS);
            tx.execute(
                "DELETE FROM results WHERE acked = 1 AND stored_at < ?1",
                params![old],
            )?;
            tx.execute(
                "DELETE FROM results WHERE acked = 0 AND id NOT IN
                 (SELECT id FROM results WHERE acked = 0 ORDER BY stored_at DESC, rowid DESC LIMIT ?1)",
                params![MAX_UNACKED],
            )?;
            tx.execute(
                "DELETE FROM commands WHERE not_after < ?1 AND state = ?2",
                params![old, DONE],
            )?;
            Ok(())
        };
        run(&tx).map_err(err)?;
        tx.commit().map_err(err)
    }

    /// The control plane stored the result `id`: it need not be sent again.
    pub(crate) fn ack(&mut self, id: &str) -> Result<bool, JournalError> {
        let n = self
            .conn
            .execute("UPDATE results SET acked = 1 WHERE id = ?1", params![id])
            .map_err(|e| self.error(e))?;
        Ok(n > 0)
    }

    /// The stored result of `id`, acked or not (a redelivered command's
    /// result is sent again), marked unacked again.
    pub(crate) fn resend(&mut self, id: &str) -> Result<Option<CommandResult>, JournalError> {
        let result = self.stored(id)?;
        self.conn
            .execute("UPDATE results SET acked = 0 WHERE id = ?1", params![id])
            .map_err(|e| self.error(e))?;
        Ok(result)
    }

    /// The result stored under `id` (one this bcd did not write decodes to
    /// nothing).
    pub(crate) fn stored(&self, id: &str) -> Result<Option<CommandResult>, JournalError> {
        let bytes: Option<Vec<u8>> = self
            .conn
            .query_row(
                "SELECT result FROM results WHERE id = ?1",
                params![id],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.error(e))?;
        Ok(bytes.and_then(|b| CommandResult::decode(b.as_slice()).ok()))
    }

    /// The ids of the unacked results, oldest first: what a (re)connection
    /// sends, one result in memory at a time (each may carry 1 MiB).
    pub(crate) fn unacked_ids(&self) -> Result<Vec<String>, JournalError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id FROM results WHERE acked = 0 ORDER BY stored_at, rowid")
            .map_err(|e| self.error(e))?;
        let rows = stmt
            .query_map([], |r| r.get(0))
            .map_err(|e| self.error(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.error(e))
    }

    /// Every unacked result, oldest first.
    #[cfg(test)]
    pub(crate) fn unacked(&self) -> Result<Vec<CommandResult>, JournalError> {
        let mut out = Vec::new();
        for id in self.unacked_ids()? {
            out.extend(self.stored(&id)?);
        }
        Ok(out)
    }

    /// Whether `id` names a command this node accepted or a result it
    /// holds: a refusal claiming it (a forged copy, say) is not stored over
    /// what the real one did.
    pub(crate) fn knows(&self, id: &str) -> Result<bool, JournalError> {
        self.conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM commands WHERE id = ?1)
                     OR EXISTS (SELECT 1 FROM results WHERE id = ?1)",
                params![id],
                |r| r.get(0),
            )
            .map_err(|e| self.error(e))
    }

    /// Commands accepted and never finished (bcd stopped while they ran):
    /// their id and kind. They do not run again; the agent reports them.
    pub(crate) fn interrupted(&self) -> Result<Vec<(String, String)>, JournalError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, kind FROM commands WHERE state = ?1 ORDER BY received_at")
            .map_err(|e| self.error(e))?;
        let rows = stmt
            .query_map(params![ACCEPTED], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(|e| self.error(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.error(e))
    }

    /// `logs.collect`'s part of the journal: the newest `limit` lines since
    /// `since` (identity entries and commands received), oldest first, each
    /// `<RFC 3339> <what>`.
    pub(crate) fn lines_since(
        &self,
        since: time::OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<String>, JournalError> {
        let since_ms = i64::try_from(crate::clock::unix_ms(since)).unwrap_or(i64::MAX);
        let mut stmt = self
            .conn
            .prepare(
                "SELECT at, line FROM (
                    SELECT at, kind || ' ' || node_id || ': ' || detail AS line, id AS n, 0 AS src
                        FROM journal WHERE at >= ?1
                    UNION ALL
                    SELECT strftime('%Y-%m-%dT%H:%M:%SZ', received_at / 1000, 'unixepoch'),
                        'command ' || id || ' ' || kind || ' ' || state, rowid, 1
                        FROM commands WHERE received_at >= ?2
                ) ORDER BY at DESC, src DESC, n DESC LIMIT ?3",
            )
            .map_err(|e| self.error(e))?;
        let rows = stmt
            .query_map(params![crate::pki::rfc3339(since), since_ms, limit], |r| {
                Ok(format!(
                    "{} {}",
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?
                ))
            })
            .map_err(|e| self.error(e))?;
        let mut lines = rows
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.error(e))?;
        lines.reverse();
        Ok(lines)
    }

    /// Whether a result is stored under `id` (tests, status).
    #[cfg(test)]
    pub(crate) fn result_of(&self, id: &str) -> Option<(CommandResult, bool)> {
        self.conn
            .query_row(
                "SELECT result, acked FROM results WHERE id = ?1",
                params![id],
                |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, bool>(1)?)),
            )
            .ok()
            .and_then(|(b, acked)| Some((CommandResult::decode(b.as_slice()).ok()?, acked)))
    }
}

/// The journal as [`bc_wire::command::VerifiedCommand::accept`] asks it:
/// the id recorded (with the signed bytes) in one statement, `true` only
/// the first time.
impl CommandLog for Journal {
    type Error = JournalError;

    fn first_sight(
        &mut self,
        id: &str,
        not_after_ms: i64,
        signed: &SignedCommand,
    ) -> Result<bool, JournalError> {
        let kind = bc_wire::command_v1::Command::decode(signed.command.as_slice())
            .map(|c| c.kind)
            .unwrap_or_default();
        let now = crate::clock::unix_ms(crate::clock::now());
        let inserted = self
            .conn
            .execute(
                "INSERT INTO commands (id, kind, not_after, signed, received_at, state)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(id) DO NOTHING",
                params![
                    id,
                    kind,
                    not_after_ms,
                    signed.encode_to_vec(),
                    i64::try_from(now).unwrap_or(i64::MAX),
                    ACCEPTED
                ],
            )
            .map_err(|e| self.error(e))?;
        Ok(inserted == 1)
    }
}

/// The status a stored result says, for logs.
pub(crate) fn status_name(result: &CommandResult) -> &'static str {
    Status::try_from(result.status)
        .unwrap_or(Status::Unspecified)
        .name()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_wire::command::{new_result, Output, Times};

    fn signed(id: &str) -> SignedCommand {
        let c = bc_wire::command::new_command(id, "node_a", "diag.ping", [], 2_000);
        SignedCommand {
            command: c.encode_to_vec(),
            signature: vec![0; 64],
            key_id: String::new(),
        }
    }

    fn result(id: &str) -> CommandResult {
        new_result(
            id,
            "node_a",
            "diag.ping",
            Status::Ok,
            "pong",
            Output::new(),
            Times {
                started_ms: 1,
                finished_ms: 2,
            },
        )
    }

    #[test]
    fn an_id_is_new_once_also_after_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open_commands(dir.path()).unwrap();
        assert!(j.first_sight("cmd_a", 2_000, &signed("cmd_a")).unwrap());
        assert!(!j.first_sight("cmd_a", 2_000, &signed("cmd_a")).unwrap());
        drop(j);
        let mut j = Journal::open_commands(dir.path()).unwrap();
        assert!(!j.first_sight("cmd_a", 2_000, &signed("cmd_a")).unwrap());
        assert!(j.first_sight("cmd_b", 2_000, &signed("cmd_b")).unwrap());
        assert_eq!(
            j.interrupted().unwrap(),
            vec![
                ("cmd_a".to_owned(), "diag.ping".to_owned()),
                ("cmd_b".to_owned(), "diag.ping".to_owned())
            ]
        );
    }

    #[test]
    fn a_result_stays_until_acked_and_is_resent_on_redelivery() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open_commands(dir.path()).unwrap();
        j.first_sight("cmd_a", 2_000, &signed("cmd_a")).unwrap();
        j.store_result(&result("cmd_a"), 10).unwrap();
        assert!(j.interrupted().unwrap().is_empty(), "done");
        assert_eq!(j.unacked().unwrap(), vec![result("cmd_a")]);
        // Still there after a restart, until acked.
        drop(j);
        let mut j = Journal::open_commands(dir.path()).unwrap();
        assert_eq!(j.unacked().unwrap().len(), 1);
        assert!(j.ack("cmd_a").unwrap());
        assert!(!j.ack("cmd_unknown").unwrap());
        assert!(j.unacked().unwrap().is_empty());
        assert!(j.result_of("cmd_a").unwrap().1);
        // A redelivery of an acked id sends the stored result again.
        assert_eq!(j.resend("cmd_a").unwrap(), Some(result("cmd_a")));
        assert_eq!(j.unacked().unwrap().len(), 1);
        assert_eq!(j.resend("cmd_none").unwrap(), None);
    }

    #[test]
    fn pruning_is_bounded_and_keeps_live_ids() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open_commands(dir.path()).unwrap();
        j.conn.pragma_update(None, "synchronous", "OFF").unwrap();
        let day = KEEP_AFTER_MS;
        // A live command (not_after far ahead) stays whatever happens.
        j.first_sight("cmd_live", 10 * day, &signed("cmd_live"))
            .unwrap();
        j.first_sight("cmd_old", 1_000, &signed("cmd_old")).unwrap();
        j.store_result(&result("cmd_old"), 2_000).unwrap();
        j.ack("cmd_old").unwrap();
        for n in 0..(MAX_UNACKED + 5) {
            j.store_result(&result(&format!("cmd_r{n}")), 3 * day + n)
                .unwrap();
        }
        assert_eq!(j.unacked().unwrap().len(), MAX_UNACKED as usize);
        assert!(j.result_of("cmd_r0").is_none(), "the oldest unacked went");
        assert!(j.result_of("cmd_old").is_none(), "acked a day ago");
        assert!(!j
            .first_sight("cmd_live", 10 * day, &signed("cmd_live"))
            .unwrap());
        // The old command's id went with its time: nothing can replay it
        // (it is refused as expired first).
        assert!(j.first_sight("cmd_old", 1_000, &signed("cmd_old")).unwrap());
    }
}
