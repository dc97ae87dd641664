//! `--reset`: move the identity aside, never delete it.
//!
//! An operator who resets by mistake can move the files back; a reset that
//! deleted the node key would make that machine's history unrecoverable.
use std::io;
use std::path::{Path, PathBuf};

use time::macros::format_description;
use time::{OffsetDateTime, UtcOffset};

use super::{
    atomic, IdentityError, IDENTITY_FILE, IDENTITY_NEXT_FILE, JOURNAL_FILE, NODE_KEY_FILE,
    NODE_KEY_NEXT_FILE,
};

/// The files a reset moves, in the order it moves them: a staged
/// `identity.json.next`, then `identity.json`, so that an interrupted reset
/// leaves no half identity that loads (nor one a rotation could complete).
const FILES: [&str; 5] = [
    IDENTITY_NEXT_FILE,
    IDENTITY_FILE,
    NODE_KEY_FILE,
    NODE_KEY_NEXT_FILE,
    JOURNAL_FILE,
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Move {
    pub from: PathBuf,
    pub to: PathBuf,
}

/// What a reset at `now` would move: the files present, each to
/// `<name>.reset-<UTC time>` (with `.2`, `.3`, … if that name is taken).
pub(crate) fn plan(data_dir: &Path, now: OffsetDateTime) -> Result<Vec<Move>, IdentityError> {
    let stamp = reset_stamp(now);
    let mut moves = Vec::new();
    for name in FILES {
        let from = data_dir.join(name);
        if !exists(&from)? {
            continue;
        }
        let base = format!("{name}.reset-{stamp}");
        let mut to = data_dir.join(&base);
        let mut n = 2;
        while exists(&to)? {
            to = data_dir.join(format!("{base}.{n}"));
            n += 1;
        }
        moves.push(Move { from, to });
    }
    Ok(moves)
}

/// Performs the moves, then makes them durable.
pub(crate) fn apply(data_dir: &Path, moves: &[Move]) -> Result<(), IdentityError> {
    for m in moves {
        std::fs::rename(&m.from, &m.to).map_err(|source| IdentityError::Write {
            path: m.from.clone(),
            source,
        })?;
    }
    if !moves.is_empty() {
        atomic::sync_dir(data_dir).map_err(|source| IdentityError::Write {
            path: data_dir.to_owned(),
            source,
        })?;
    }
    Ok(())
}

/// `20261130T171502Z`: sorts by time and holds no character a shell or a
/// file system minds.
pub(crate) fn reset_stamp(now: OffsetDateTime) -> String {
    let fmt = format_description!("[year][month][day]T[hour][minute][second]Z");
    now.to_offset(UtcOffset::UTC)
        .format(&fmt)
        .unwrap_or_else(|_| now.unix_timestamp().to_string())
}

fn exists(p: &Path) -> Result<bool, IdentityError> {
    match std::fs::symlink_metadata(p) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(IdentityError::Read {
            path: p.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn stamp_is_utc_and_compact() {
        assert_eq!(
            reset_stamp(datetime!(2026-11-30 18:15:02 +1)),
            "20261130T171502Z"
        );
    }

    #[test]
    fn moves_present_files_aside_and_deletes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::write(d.join(IDENTITY_FILE), "i").unwrap();
        std::fs::write(d.join(JOURNAL_FILE), "j").unwrap();
        std::fs::write(d.join("identity.json.reset-20261130T171502Z"), "older").unwrap();
        let moves = plan(d, datetime!(2026-11-30 17:15:02 UTC)).unwrap();
        assert_eq!(
            moves,
            vec![
                Move {
                    from: d.join("identity.json"),
                    to: d.join("identity.json.reset-20261130T171502Z.2"),
                },
                Move {
                    from: d.join("journal.db"),
                    to: d.join("journal.db.reset-20261130T171502Z"),
                },
            ]
        );
        apply(d, &moves).unwrap();
        assert!(!d.join(IDENTITY_FILE).exists());
        assert_eq!(
            std::fs::read_to_string(d.join("identity.json.reset-20261130T171502Z")).unwrap(),
            "older"
        );
        assert_eq!(
            std::fs::read_to_string(d.join("identity.json.reset-20261130T171502Z.2")).unwrap(),
            "i"
        );
        assert_eq!(
            std::fs::read_to_string(d.join("journal.db.reset-20261130T171502Z")).unwrap(),
            "j"
        );
    }

    #[test]
    fn a_missing_data_dir_has_nothing_to_move() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(plan(&tmp.path().join("absent"), OffsetDateTime::now_utc())
            .unwrap()
            .is_empty());
    }
}
