//! Deploy images (`images add|list|remove`, `GET /v1/images/<name>`): OS
//! images the commissioning ramdisk writes to a machine's disk with
//! `deploy.image`.
//!
//! An image is stored as added (raw, or a zstd stream: detected by its
//! magic) under `DIR/images/<sha256 of the stored bytes>`, and recorded in
//! the `images` table with the SHA-256 and size of its RAW bytes, which
//! `images add` measures by decoding the whole stream (a corrupt one is
//! refused, nothing kept). The command pins the raw digest, so the agent
//! checks what it wrote, whatever it was sent. Files are named by content:
//! a replaced image's row and file never disagree (the new file is in place
//! before its row names it), and a file no row names is removed.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::store::{params, DbError, Row, Store, Tx, UnixMs};

pub(crate) const IMAGES_DIR: &str = "images";

/// One registered image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    pub name: String,
    /// SHA-256 of the raw (decompressed) image, lowercase hex: what
    /// `deploy.image`'s `sha256` pins.
    pub sha256: String,
    /// The raw image's size.
    pub bytes: u64,
    /// `none` or `zstd`: how it is stored and served.
    pub compression: String,
    /// The stored (served) size.
    pub stored_bytes: u64,
    /// SHA-256 of the stored bytes: the file's name under `DIR/images`.
    pub stored_sha256: String,
    pub created_at: UnixMs,
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{0:?} is not an image name (1-64 of a-z 0-9 . _ -, not starting with .)")]
    BadName(String),
    #[error("an image named {0} exists; pass --replace to replace it, or images remove it first")]
    Exists(String),
    #[error("no image named {0} (images list shows them)")]
    NotFound(String),
    #[error("{path}: {why}")]
    BadFile { path: PathBuf, why: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Db(#[from] DbError),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The `Name` shape of the command's `image` argument.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        })
}

const SELECT: &str =
    "SELECT name, sha256, bytes, compression, stored_bytes, stored_sha256, created_at FROM images";

fn read_row(r: &Row) -> Result<Image, DbError> {
    let size = |i: usize, v: i64| {
        u64::try_from(v).map_err(|_| DbError::Corrupt {
            what: "image size",
            detail: format!("column {i}: {v}"),
        })
    };
    Ok(Image {
        name: r.get(0)?,
        sha256: r.get(1)?,
        bytes: size(2, r.get(2)?)?,
        compression: r.get(3)?,
        stored_bytes: size(4, r.get(4)?)?,
        stored_sha256: r.get(5)?,
        created_at: r.get(6)?,
    })
}

/// The image `name`, if registered.
pub(crate) fn get(tx: &Tx<'_>, name: &str) -> Result<Option<Image>, DbError> {
    tx.query_opt_map(
        &format!("{SELECT} WHERE name = ?1"),
        params![name],
        read_row,
    )
}

/// Every image, by name.
pub fn list(db: &Store) -> Result<Vec<Image>, DbError> {
    db.read(|tx| {
        tx.query_map(&format!("{SELECT} ORDER BY name"), params![], read_row)?
            .collect()
    })
}

/// Where an image's stored bytes are.
pub(crate) fn stored_path(dir: &Path, image: &Image) -> PathBuf {
    dir.join(IMAGES_DIR).join(&image.stored_sha256)
}

/// What `images add` measured of a file.
struct Measured {
    raw_sha256: String,
    raw_bytes: u64,
    compression: &'static str,
    stored_sha256: String,
    stored_bytes: u64,
}

/// Stores `file` as image `name` (see the module docs); `replace` lets it
/// take the place of an image of that name.
pub fn add(
    dir: &Path,
    db: &Store,
    name: &str,
    file: &Path,
    replace: bool,
) -> Result<Image, ImageError> {
    if !valid_name(name) {
        return Err(ImageError::BadName(name.to_owned()));
    }
    if !replace && db.read(|tx| get(tx, name))?.is_some() {
        return Err(ImageError::Exists(name.to_owned()));
    }
    let images = dir.join(IMAGES_DIR);
    std::fs::create_dir_all(&images).map_err(io_err(&images))?;
    let suffix = hex::encode(crate::ids::random_bytes::<8>().map_err(DbError::Random)?);
    let tmp = images.join(format!(".add-{suffix}.tmp"));
    let result = (|| {
        let m = copy_and_measure(file, &tmp)?;
        let path = images.join(&m.stored_sha256);
        std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
        File::open(&images)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&images))?;
        let (image, old) = db.write(|tx| {
            let old = get(tx, name)?;
            if old.is_some() && !replace {
                return Err(ImageError::Exists(name.to_owned()));
            }
            let image = Image {
                name: name.to_owned(),
                sha256: m.raw_sha256.clone(),
                bytes: m.raw_bytes,
                compression: m.compression.to_owned(),
                stored_bytes: m.stored_bytes,
                stored_sha256: m.stored_sha256.clone(),
                created_at: tx.now()?,
            };
            tx.execute("DELETE FROM images WHERE name = ?1", params![name])?;
            tx.execute(
                "INSERT INTO images (name, sha256, bytes, compression, stored_bytes, stored_sha256, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    image.name,
                    image.sha256,
                    to_i64(image.bytes),
                    image.compression,
                    to_i64(image.stored_bytes),
                    image.stored_sha256,
                    image.created_at
                ],
            )?;
            Ok((image, old))
        })?;
        if let Some(old) = old {
            remove_unused_file(dir, db, &old.stored_sha256);
        }
        Ok(image)
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Removes image `name`'s row, then its file when no other image names it.
pub fn remove(dir: &Path, db: &Store, name: &str) -> Result<Image, ImageError> {
    let image = db.write(|tx| {
        let Some(image) = get(tx, name)? else {
            return Err(ImageError::NotFound(name.to_owned()));
        };
        tx.execute("DELETE FROM images WHERE name = ?1", params![name])?;
        Ok(image)
    })?;
    remove_unused_file(dir, db, &image.stored_sha256);
    Ok(image)
}

fn remove_unused_file(dir: &Path, db: &Store, stored_sha256: &str) {
    let used = db.read(|tx| {
        tx.query_opt_map(
            "SELECT 1 FROM images WHERE stored_sha256 = ?1",
            params![stored_sha256],
            |r| r.get::<i64>(0),
        )
    });
    if let Ok(None) = used {
        let path = dir.join(IMAGES_DIR).join(stored_sha256);
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove an unused image file");
        }
    }
}

/// Copies `file` to `tmp` (hashing what it stores), then decodes `tmp` to
/// measure the raw image.
fn copy_and_measure(file: &Path, tmp: &Path) -> Result<Measured, ImageError> {
    let bad = |why: String| ImageError::BadFile {
        path: file.to_owned(),
        why,
    };
    let mut src = File::open(file).map_err(io_err(file))?;
    let meta = src.metadata().map_err(io_err(file))?;
    if !meta.is_file() {
        return Err(bad("not a regular file".to_owned()));
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(io_err(tmp))?;
    let mut stored = Sha256::new();
    let mut stored_bytes = 0u64;
    let mut head = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(file)(e)),
        };
        if head.len() < 4 {
            head.extend_from_slice(&buf[..n.min(4)]);
        }
        stored.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io_err(tmp))?;
        stored_bytes += n as u64;
    }
    out.sync_all().map_err(io_err(tmp))?;
    drop(out);
    if stored_bytes == 0 {
        return Err(bad("empty: an image has at least one byte".to_owned()));
    }
    let zstd = bc_wire::image::is_zstd(&head);
    let reader = File::open(tmp).map_err(io_err(tmp))?;
    let (raw_sha256, raw_bytes) = if zstd {
        hash_all(bc_wire::image::Decoder::new(io::BufReader::new(reader))).map_err(|e| {
            bad(format!(
                "a zstd stream that does not decode ({e}); nothing was added"
            ))
        })?
    } else {
        hash_all(reader).map_err(io_err(tmp))?
    };
    if raw_bytes == 0 {
        return Err(bad(
            "decodes to nothing: an image has at least one byte".to_owned()
        ));
    }
    Ok(Measured {
        raw_sha256,
        raw_bytes,
        compression: if zstd { "zstd" } else { "none" },
        stored_sha256: hex::encode(stored.finalize()),
        stored_bytes,
    })
}

fn hash_all(mut r: impl Read) -> io::Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut n = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                h.update(&buf[..k]);
                n += k as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((hex::encode(h.finalize()), n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("debian-12.raw"));
        for bad in ["", ".x", "A", "a/b", "..", "a b", &"a".repeat(65)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    crate::test_support::both_backends!(add_replace_remove);

    fn add_replace_remove(backend: crate::test_support::Backend) {
        let t = crate::test_support::temp_db_on(backend);
        let dir = tempfile::tempdir().unwrap();
        let raw: Vec<u8> = (0..200_000u32).map(|i| (i % 13) as u8).collect();
        let plain = dir.path().join("plain.img");
        std::fs::write(&plain, &raw).unwrap();
        let z = dir.path().join("img.zst");
        std::fs::write(
            &z,
            ruzstd::encoding::compress_to_vec(
                &raw[..],
                ruzstd::encoding::CompressionLevel::Fastest,
            ),
        )
        .unwrap();
        let a = add(dir.path(), &t.db, "a", &plain, false).unwrap();
        assert_eq!(a.compression, "none");
        assert_eq!(a.bytes, raw.len() as u64);
        assert_eq!(a.sha256, hex::encode(Sha256::digest(&raw)));
        assert!(matches!(
            add(dir.path(), &t.db, "a", &z, false),
            Err(ImageError::Exists(_))
        ));
        let b = add(dir.path(), &t.db, "a", &z, true).unwrap();
        assert_eq!(
            (b.compression.as_str(), b.sha256.as_str()),
            ("zstd", a.sha256.as_str())
        );
        assert!(b.stored_bytes < b.bytes);
        assert!(
            !stored_path(dir.path(), &a).exists(),
            "the replaced file is gone"
        );
        assert!(stored_path(dir.path(), &b).exists());
        assert_eq!(t.db.read(|tx| get(tx, "a")).unwrap(), Some(b.clone()));
        // A corrupt stream: refused, nothing kept.
        let mut bytes = std::fs::read(&z).unwrap();
        bytes.truncate(bytes.len() / 2);
        let cut = dir.path().join("cut.zst");
        std::fs::write(&cut, bytes).unwrap();
        let e = add(dir.path(), &t.db, "cut", &cut, false).unwrap_err();
        assert!(e.to_string().contains("does not decode"), "{e}");
        assert_eq!(list(&t.db).unwrap().len(), 1);
        let files = std::fs::read_dir(dir.path().join(IMAGES_DIR))
            .unwrap()
            .count();
        assert_eq!(files, 1, "no temporary file left");
        remove(dir.path(), &t.db, "a").unwrap();
        assert!(!stored_path(dir.path(), &b).exists());
        assert!(matches!(
            remove(dir.path(), &t.db, "a"),
            Err(ImageError::NotFound(_))
        ));
    }
}
