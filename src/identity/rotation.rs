//! Replacing the identity in place (a renewal, an x509pop re-join) so that a
//! crash at any step leaves an identity that loads: the old one or the new
//! one, never the new certificate with the old key or the reverse.
//!
//! The steps, each durable (write to a temporary file, fsync, rename, fsync
//! the directory) before the next:
//!
//! 1. [`stage_key`]: the next key to `node.key.next`, before the request, so
//!    that the key the control plane certifies is on disk before its answer;
//! 2. [`stage_identity`]: once the answer is verified, the new
//!    `identity.json` to `identity.json.next`;
//! 3. [`commit`]: rename `node.key.next` → `node.key`, then
//!    `identity.json.next` → `identity.json`.
//!
//! What a crash leaves, and what [`Identity::load`] makes of it:
//!
//! | files on disk | loads |
//! |---|---|
//! | `identity.json`, `node.key` (+ `node.key.next`) | the old identity; the stale next key is overwritten by the next renewal |
//! | … + `identity.json.next` | the new one: `node.key.next` certified by `identity.json.next`, both renamed into place |
//! | `identity.json` (old), `node.key` (new), `identity.json.next` | the new one: `identity.json.next` renamed into place |
//! | `identity.json` (new), `node.key` (old), `node.key.next` (new) | the new one: `node.key.next` renamed into place (not a state bcd leaves, accepted all the same) |
//!
//! [`rotate`] is the one attempt both rotations make (`bcd node`'s renewal
//! and the x509pop re-join): the next key staged, sent, kept for a retry or
//! dropped when the attempt fails, the verified answer staged and committed.
//!
//! A staged file is only ever used when its key is the one its certificate
//! certifies, so a leftover that belongs to nothing is ignored.
//!
//! [`Identity::load`]: super::Identity::load
use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::Arc;

use super::{
    atomic, write, Identity, IdentityError, Parsed, IDENTITY_FILE, IDENTITY_NEXT_FILE,
    NODE_KEY_FILE, NODE_KEY_NEXT_FILE,
};
use crate::keys::{NodeKey, TpmAccess};

/// The next key of a rotation, staged, with what is sent for it: kept by
/// `bcd node` across failed attempts, so that a retry for the same identity
/// sends the same key again instead of making (in the TPM), staging and
/// syncing a new one at every try.
#[derive(Clone)]
pub(crate) struct NextKey {
    pub key: Arc<dyn NodeKey>,
    /// The key's CSR (its SHA-256 is what the answer is bound to).
    pub csr: Vec<u8>,
    /// The AK's TPM2_Certify of `key` over sha256(csr), for a certificate
    /// that names an AK.
    pub certified: Option<bc_wire::agent::TpmKeyAttestation>,
}

/// How an attempt's exchange failed, and so what becomes of its next key.
pub(crate) enum Unanswered<E> {
    /// Nothing of ours was certified (unreachable, refused, a bad answer):
    /// the key stays staged, and the next try sends it again.
    Retry(E),
    /// The answer cannot be used: the staged key goes.
    Abandon(E),
}

/// Where an attempt of [`rotate`] stopped.
pub(crate) enum RotateError<E> {
    /// Nothing changed on disk (a staged next key aside).
    Failed(E),
    /// The answer's identity could not be staged ([`stage_identity`]):
    /// nothing changed on disk, the next key is still in `node.key.next`.
    Stage(IdentityError),
    /// The new identity is staged but not moved into place ([`commit`]):
    /// what is on disk loads as the old or the new identity.
    Commit(IdentityError),
}

/// The two crash points of an attempt (for the tests): once the answer's
/// identity is staged, and between the two renames.
pub(crate) struct CrashPoints {
    pub after_answer: &'static str,
    pub between_renames: &'static str,
}

/// One attempt of a rotation: the next key of an earlier failed attempt
/// (`staged`), or a new one from `make` (which stages it, [`stage_key`]),
/// `exchange`d with the control plane for the new identity, which is then
/// staged and committed. The key is put back in `staged` when the exchange
/// asks for a [`Unanswered::Retry`].
pub(crate) async fn rotate<E, F>(
    data_dir: &Path,
    staged: &mut Option<NextKey>,
    make: impl FnOnce() -> Result<NextKey, E>,
    exchange: impl FnOnce(NextKey) -> F,
    points: CrashPoints,
) -> Result<Identity, RotateError<E>>
where
    F: Future<Output = Result<Identity, Unanswered<E>>>,
{
    let next = match staged.take() {
        Some(next) => next,
        None => make().map_err(RotateError::Failed)?,
    };
    let renewed = match exchange(next.clone()).await {
        Ok(identity) => identity,
        Err(Unanswered::Retry(e)) => {
            *staged = Some(next);
            return Err(RotateError::Failed(e));
        }
        Err(Unanswered::Abandon(e)) => {
            abandon(data_dir);
            return Err(RotateError::Failed(e));
        }
    };
    stage_identity(data_dir, &renewed).map_err(RotateError::Stage)?;
    crate::failpoint::hit(points.after_answer);
    commit(data_dir, || crate::failpoint::hit(points.between_renames))
        .map_err(RotateError::Commit)?;
    Ok(renewed)
}

/// Step 1: writes `key` to `node.key.next` (0600, atomically). A leftover
/// `identity.json.next` of an earlier attempt goes first: it certifies
/// another key and must not be paired with this one.
pub(crate) fn stage_key(data_dir: &Path, key: &dyn NodeKey) -> Result<(), IdentityError> {
    atomic::ensure_private_dir(data_dir).map_err(|source| IdentityError::DataDir {
        path: data_dir.to_owned(),
        source,
    })?;
    discard(data_dir, IDENTITY_NEXT_FILE)?;
    let contents = key.to_file_contents()?;
    write(data_dir, NODE_KEY_NEXT_FILE, contents.as_bytes())
}

/// Step 2: writes `next` (whose key [`stage_key`] wrote) to
/// `identity.json.next`. From here on a crash ends with the new identity.
pub(crate) fn stage_identity(data_dir: &Path, next: &Identity) -> Result<(), IdentityError> {
    write(data_dir, IDENTITY_NEXT_FILE, &next.to_json(data_dir)?)
}

/// Step 3: the two renames, `between` called between them (a crash point
/// for the tests). A staged file that is already gone was moved into place
/// by a concurrent [`Identity::load`], which completes the same rotation.
///
/// [`Identity::load`]: super::Identity::load
pub(crate) fn commit(data_dir: &Path, between: impl FnOnce()) -> Result<(), IdentityError> {
    rename(data_dir, NODE_KEY_NEXT_FILE, NODE_KEY_FILE)?;
    between();
    rename(data_dir, IDENTITY_NEXT_FILE, IDENTITY_FILE)?;
    Ok(())
}

/// Drops a staged next key after a failed attempt (best effort: a leftover
/// is harmless, see the module's table).
pub(crate) fn abandon(data_dir: &Path) {
    for name in [IDENTITY_NEXT_FILE, NODE_KEY_NEXT_FILE] {
        if let Err(e) = discard(data_dir, name) {
            tracing::debug!(error = %e, "cannot remove a staged file");
        }
    }
}

/// Removes `data_dir/name` if it is there.
pub(crate) fn discard(data_dir: &Path, name: &str) -> Result<(), IdentityError> {
    let path = data_dir.join(name);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(IdentityError::Write { path, source }),
    }
}

/// Renames `from` over `to` and makes it durable; `Ok(false)` when `from`
/// is not there.
fn rename(data_dir: &Path, from: &str, to: &str) -> Result<bool, IdentityError> {
    match std::fs::rename(data_dir.join(from), data_dir.join(to)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(IdentityError::Write {
                path: data_dir.join(to),
                source,
            })
        }
    }
    atomic::sync_dir(data_dir).map_err(|source| IdentityError::Write {
        path: data_dir.to_owned(),
        source,
    })?;
    Ok(true)
}

/// A staged `identity.json.next` whose key is in `node.key.next` (crash
/// before the first rename) or already in `node.key` (crash between the
/// renames): the rotation is completed and the new identity returned.
/// `None` when there is nothing staged or nothing usable.
/// With `repair` false (a read-only caller such as `bcd status`), nothing is
/// renamed: the identity that the next repairing load will settle on is
/// returned as it is.
pub(crate) fn recover(data_dir: &Path, tpm: &TpmAccess, repair: bool) -> Option<Identity> {
    let staged = data_dir.join(IDENTITY_NEXT_FILE);
    let parsed = match Parsed::read(&staged) {
        Ok(Some(p)) => p,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(error = %e, "ignoring an unusable staged identity; the current one stays");
            return None;
        }
    };
    let next_key = data_dir.join(NODE_KEY_NEXT_FILE);
    if next_key.exists() {
        match parsed.load_key(&next_key, tpm) {
            Ok(key) => {
                if repair {
                    complete(data_dir, true, &parsed);
                }
                return Some(parsed.into_identity(key));
            }
            Err(e) => {
                tracing::debug!(error = %e, "the staged identity does not certify node.key.next")
            }
        }
    }
    match parsed.load_key(&data_dir.join(NODE_KEY_FILE), tpm) {
        Ok(key) => {
            if repair {
                complete(data_dir, false, &parsed);
            }
            Some(parsed.into_identity(key))
        }
        Err(e) => {
            tracing::warn!(path = %staged.display(), error = %e, "ignoring a staged identity that certifies neither node.key.next nor node.key; the current one stays");
            None
        }
    }
}

/// `identity.json` whose `node.key` does not load or match: the key may be
/// in `node.key.next`, renamed into place when it is.
pub(crate) fn recover_key(
    data_dir: &Path,
    parsed: &Parsed,
    tpm: &TpmAccess,
    repair: bool,
) -> Option<Arc<dyn NodeKey>> {
    let next_key = data_dir.join(NODE_KEY_NEXT_FILE);
    if !next_key.exists() {
        return None;
    }
    let key = parsed.load_key(&next_key, tpm).ok()?;
    if !repair {
        return Some(key);
    }
    match rename(data_dir, NODE_KEY_NEXT_FILE, NODE_KEY_FILE) {
        Ok(_) => tracing::info!(
            dir = %data_dir.display(),
            "completed an interrupted key rotation: node.key.next is the certified key"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "cannot complete an interrupted key rotation; using node.key.next as it is")
        }
    }
    Some(key)
}

/// The renames an interrupted [`commit`] did not do. A failure leaves a
/// state that recovers the same way next time.
fn complete(data_dir: &Path, key_from_next: bool, parsed: &Parsed) {
    let result = (|| {
        if key_from_next {
            rename(data_dir, NODE_KEY_NEXT_FILE, NODE_KEY_FILE)?;
        }
        rename(data_dir, IDENTITY_NEXT_FILE, IDENTITY_FILE)
    })();
    match result {
        Ok(_) => tracing::info!(
            dir = %data_dir.display(),
            not_after = %crate::pki::rfc3339(parsed.cert.not_after),
            "completed an interrupted identity rotation"
        ),
        Err(e) => tracing::warn!(
            path = %parsed.path().display(),
            error = %e,
            "cannot complete an interrupted identity rotation; using the new identity as it is"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::tests::sample;
    use crate::keys::FileKey;

    /// An old identity saved in a directory and a new one (new key, new
    /// certificate) ready to rotate in.
    fn setup() -> (tempfile::TempDir, Identity, Identity) {
        let tmp = tempfile::tempdir().unwrap();
        let old = sample(FileKey::generate().unwrap());
        old.save(tmp.path()).unwrap();
        let new = sample(FileKey::generate().unwrap());
        (tmp, old, new)
    }

    fn loaded_spki(dir: &Path) -> Vec<u8> {
        Identity::load(dir, &TpmAccess::none())
            .unwrap()
            .unwrap()
            .key
            .spki_der()
            .to_vec()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn a_full_rotation_replaces_key_and_certificate() {
        let (tmp, _, new) = setup();
        stage_key(tmp.path(), new.key.as_ref()).unwrap();
        stage_identity(tmp.path(), &new).unwrap();
        commit(tmp.path(), || {}).unwrap();
        assert_eq!(loaded_spki(tmp.path()), new.key.spki_der());
        assert_eq!(names(tmp.path()), vec!["identity.json", "node.key"]);
    }

    #[test]
    fn a_crash_before_the_answer_keeps_the_old_identity() {
        let (tmp, old, new) = setup();
        stage_key(tmp.path(), new.key.as_ref()).unwrap();
        assert_eq!(loaded_spki(tmp.path()), old.key.spki_der());
        // The stale next key is left for the next renewal to overwrite.
        assert!(tmp.path().join(NODE_KEY_NEXT_FILE).exists());
    }

    #[test]
    fn a_crash_after_the_answer_completes_the_rotation() {
        let (tmp, _, new) = setup();
        stage_key(tmp.path(), new.key.as_ref()).unwrap();
        stage_identity(tmp.path(), &new).unwrap();
        assert_eq!(loaded_spki(tmp.path()), new.key.spki_der());
        assert_eq!(names(tmp.path()), vec!["identity.json", "node.key"]);
        // And it stays the new one.
        assert_eq!(loaded_spki(tmp.path()), new.key.spki_der());
    }

    #[test]
    fn inspecting_an_interrupted_rotation_sees_the_new_identity_and_renames_nothing() {
        let (tmp, _, new) = setup();
        stage_key(tmp.path(), new.key.as_ref()).unwrap();
        stage_identity(tmp.path(), &new).unwrap();
        let before = names(tmp.path());
        let seen = Identity::inspect(tmp.path(), &TpmAccess::none())
            .unwrap()
            .unwrap();
        assert_eq!(seen.key.spki_der(), new.key.spki_der());
        assert_eq!(names(tmp.path()), before, "inspect changes nothing");
        // Between the renames, too.
        std::fs::rename(
            tmp.path().join(NODE_KEY_NEXT_FILE),
            tmp.path().join(NODE_KEY_FILE),
        )
        .unwrap();
        let before = names(tmp.path());
        let seen = Identity::inspect(tmp.path(), &TpmAccess::none())
            .unwrap()
            .unwrap();
        assert_eq!(seen.key.spki_der(), new.key.spki_der());
        assert_eq!(names(tmp.path()), before);
        // A repairing load then completes it.
        assert_eq!(loaded_spki(tmp.path()), new.key.spki_der());
        assert_eq!(names(tmp.path()), vec!["identity.json", "node.key"]);
    }

    #[test]
    fn a_crash_between_the_renames_completes_the_rotation() {
        let (tmp, _, new) = setup();
        stage_key(tmp.path(), new.key.as_ref()).unwrap();
        stage_identity(tmp.path(), &new).unwrap();
        // Only the first rename happened.
        std::fs::rename(
            tmp.path().join(NODE_KEY_NEXT_FILE),
            tmp.path().join(NODE_KEY_FILE),
        )
        .unwrap();
        assert_eq!(loaded_spki(tmp.path()), new.key.spki_der());
        assert_eq!(names(tmp.path()), vec!["identity.json", "node.key"]);
    }

    #[test]
    fn a_new_certificate_with_its_key_still_in_next_loads() {
        let (tmp, _, new) = setup();
        stage_key(tmp.path(), new.key.as_ref()).unwrap();
        std::fs::write(
            tmp.path().join(IDENTITY_FILE),
            new.to_json(tmp.path()).unwrap(),
        )
        .unwrap();
        assert_eq!(loaded_spki(tmp.path()), new.key.spki_der());
        assert_eq!(names(tmp.path()), vec!["identity.json", "node.key"]);
    }

    #[test]
    fn a_staged_identity_for_another_key_is_ignored() {
        let (tmp, old, new) = setup();
        let stray = sample(FileKey::generate().unwrap());
        stage_key(tmp.path(), new.key.as_ref()).unwrap();
        // identity.json.next certifying neither node.key.next nor node.key.
        write(
            tmp.path(),
            IDENTITY_NEXT_FILE,
            &stray.to_json(tmp.path()).unwrap(),
        )
        .unwrap();
        assert_eq!(loaded_spki(tmp.path()), old.key.spki_der());
        // A garbled one too.
        write(tmp.path(), IDENTITY_NEXT_FILE, b"{").unwrap();
        assert_eq!(loaded_spki(tmp.path()), old.key.spki_der());
    }

    #[test]
    fn commit_tolerates_a_rotation_another_loader_completed() {
        let (tmp, _, new) = setup();
        stage_key(tmp.path(), new.key.as_ref()).unwrap();
        stage_identity(tmp.path(), &new).unwrap();
        assert_eq!(loaded_spki(tmp.path()), new.key.spki_der());
        commit(tmp.path(), || {}).unwrap();
        assert_eq!(loaded_spki(tmp.path()), new.key.spki_der());
    }

    #[test]
    fn abandon_and_save_clear_leftovers() {
        let (tmp, old, new) = setup();
        stage_key(tmp.path(), new.key.as_ref()).unwrap();
        abandon(tmp.path());
        assert_eq!(names(tmp.path()), vec!["identity.json", "node.key"]);
        stage_key(tmp.path(), new.key.as_ref()).unwrap();
        stage_identity(tmp.path(), &new).unwrap();
        old.save(tmp.path()).unwrap();
        assert_eq!(names(tmp.path()), vec!["identity.json", "node.key"]);
        assert_eq!(loaded_spki(tmp.path()), old.key.spki_der());
    }

    /// One attempt of [`rotate`] on a current-thread runtime.
    fn attempt(
        dir: &Path,
        staged: &mut Option<NextKey>,
        make: impl FnOnce() -> Result<NextKey, &'static str>,
        answer: Result<Identity, Unanswered<&'static str>>,
    ) -> Result<Identity, RotateError<&'static str>> {
        let points = CrashPoints {
            after_answer: "test-after-answer",
            between_renames: "test-between-renames",
        };
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(rotate(dir, staged, make, |_| async { answer }, points))
    }

    #[test]
    fn rotate_keeps_the_key_for_a_retry_drops_it_when_abandoned_and_commits_an_answer() {
        let (tmp, old, new) = setup();
        let dir = tmp.path();
        let key = new.key.clone();
        let next = NextKey {
            key: key.clone(),
            csr: b"csr".to_vec(),
            certified: None,
        };
        let make = || {
            stage_key(dir, next.key.as_ref()).unwrap();
            Ok(next.clone())
        };
        let mut staged = None;
        // Unanswered: the key stays staged, the old identity loads.
        let e = attempt(dir, &mut staged, make, Err(Unanswered::Retry("down")));
        assert!(matches!(e, Err(RotateError::Failed("down"))));
        assert!(staged
            .as_ref()
            .is_some_and(|s| s.key.spki_der() == key.spki_der()));
        assert_eq!(loaded_spki(dir), old.key.spki_der());
        // The retry sends the staged key (nothing is made); a bad answer drops it.
        let never = || -> Result<NextKey, &'static str> { panic!("a staged key is sent again") };
        let e = attempt(dir, &mut staged, never, Err(Unanswered::Abandon("bad")));
        assert!(matches!(e, Err(RotateError::Failed("bad"))));
        assert!(staged.is_none());
        assert_eq!(names(dir), vec!["identity.json", "node.key"]);
        // An answer is staged and committed.
        let make = || {
            stage_key(dir, key.as_ref()).unwrap();
            Ok(NextKey {
                key: key.clone(),
                csr: b"csr".to_vec(),
                certified: None,
            })
        };
        let renewed = attempt(dir, &mut staged, make, Ok(new)).ok().unwrap();
        assert_eq!(loaded_spki(dir), renewed.key.spki_der());
        assert_eq!(names(dir), vec!["identity.json", "node.key"]);
    }
}
