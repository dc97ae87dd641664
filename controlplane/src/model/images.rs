//! STUB until the `deploy` branch (helper B) is merged: the signature of
//! B's `images` table access, so that the workflows compile. B's file
//! replaces this one whole.

use crate::store::{DbError, Tx};

/// A registered image (B's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Image {
    pub name: String,
    pub sha256: String,
    pub bytes: u64,
    pub compression: String,
    pub stored_bytes: u64,
}

/// The image named `name` (stub: none yet).
pub(crate) fn get(tx: &Tx<'_>, name: &str) -> Result<Option<Image>, DbError> {
    let _ = (tx, name);
    Ok(None)
}
