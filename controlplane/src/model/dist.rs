//! Packages the control plane hands out (`DIR/dist/`): `dist add` stores a
//! file and its SHA-256, `GET /dist/<name>` serves it, and the install
//! script embeds the hash so that a machine installs exactly that file.
//!
//! Layout: `DIR/dist/<name>` and `DIR/dist/<name>.sha256` (hex), plus
//! `DIR/dist/current` naming the package the next install script uses (the
//! one added last). Only names that `dist add` recorded are served: a name
//! is checked against [`valid_name`] before it touches the file system, so
//! no request reaches outside `DIR/dist`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::fsutil;

pub(crate) const DIST_DIR: &str = "dist";
const CURRENT: &str = "current";
/// Larger than any bcd package (a few MB): a bigger file is a mistake, and
/// a download is held in memory while it is served.
pub const MAX_PACKAGE_BYTES: u64 = 64 * 1024 * 1024;
const MAX_NAME_LEN: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("{0:?} is not a package name (letters, digits, '.', '_', '+', '-'; ending in .deb; at most {MAX_NAME_LEN} characters)")]
    BadName(String),
    #[error("{path} is {size} bytes; a package is at most {MAX_PACKAGE_BYTES} bytes")]
    TooLarge { path: PathBuf, size: u64 },
    #[error("no package {0} in dist/ (add it with bc-controlplane dist add)")]
    NotFound(String),
    #[error("no package in dist/ yet: add one with bc-controlplane dist add --dir DIR FILE.deb")]
    NoCurrent,
    #[error("dist/{name} does not match its recorded SHA-256 (changed on disk?)")]
    Altered { name: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DistError + '_ {
    move |source| DistError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A recorded package: its name in `dist/` and its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    pub name: String,
    pub sha256: [u8; 32],
}

impl Package {
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.sha256)
    }

    /// The Debian version in a `bcd_<version>_<arch>.deb` name, if it is one.
    pub fn version(&self) -> Option<&str> {
        let stem = self.name.strip_suffix(".deb")?;
        let mut parts = stem.splitn(3, '_');
        let (_, version) = (parts.next()?, parts.next()?);
        parts.next().map(|_| version)
    }
}

/// A name safe to join onto `dist/`: no separator, no leading dot (so never
/// `.` or `..` or a hidden file), a `.deb`, nothing outside
/// `[A-Za-z0-9._+-]`.
pub(crate) fn valid_name(name: &str) -> bool {
    name.len() <= MAX_NAME_LEN
        && name.ends_with(".deb")
        && name.len() > ".deb".len()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'+' | b'-'))
}

fn dist_dir(dir: &Path) -> PathBuf {
    dir.join(DIST_DIR)
}

/// Copies `file` into `DIR/dist/` under its own name, records its SHA-256
/// and makes it the current package. Adding the same bytes again changes
/// nothing but `current`.
pub fn add(dir: &Path, file: &Path) -> Result<Package, DistError> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| valid_name(n))
        .ok_or_else(|| DistError::BadName(file.display().to_string()))?
        .to_owned();
    let bytes = read_bounded(file)?;
    let sha256: [u8; 32] = Sha256::digest(&bytes).into();
    let d = dist_dir(dir);
    std::fs::create_dir_all(&d).map_err(io_err(&d))?;
    let path = d.join(&name);
    fsutil::write_atomic(&path, &bytes, 0o644).map_err(io_err(&path))?;
    let hash_path = d.join(format!("{name}.sha256"));
    fsutil::write_atomic(
        &hash_path,
        format!("{}\n", hex::encode(sha256)).as_bytes(),
        0o644,
    )
    .map_err(io_err(&hash_path))?;
    let current = d.join(CURRENT);
    fsutil::write_atomic(&current, format!("{name}\n").as_bytes(), 0o644)
        .map_err(io_err(&current))?;
    Ok(Package { name, sha256 })
}

/// The package `name` as recorded (its hash file), without reading it.
pub fn lookup(dir: &Path, name: &str) -> Result<Package, DistError> {
    if !valid_name(name) {
        return Err(DistError::BadName(name.to_owned()));
    }
    let hash_path = dist_dir(dir).join(format!("{name}.sha256"));
    let text = match std::fs::read_to_string(&hash_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(DistError::NotFound(name.to_owned()))
        }
        Err(e) => return Err(io_err(&hash_path)(e)),
    };
    let mut sha256 = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut sha256).map_err(|_| DistError::Altered {
        name: name.to_owned(),
    })?;
    Ok(Package {
        name: name.to_owned(),
        sha256,
    })
}

/// The package `dist add` added last.
pub fn current(dir: &Path) -> Result<Package, DistError> {
    let path = dist_dir(dir).join(CURRENT);
    let name = match std::fs::read_to_string(&path) {
        Ok(t) => t.trim().to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(DistError::NoCurrent),
        Err(e) => return Err(io_err(&path)(e)),
    };
    lookup(dir, &name)
}

/// The bytes of a recorded package, checked against its recorded hash so
/// that a file changed behind the control plane's back is never served.
pub(crate) fn read(dir: &Path, name: &str) -> Result<(Package, Vec<u8>), DistError> {
    let package = lookup(dir, name)?;
    let bytes = read_bounded(&dist_dir(dir).join(name))?;
    if <[u8; 32]>::from(Sha256::digest(&bytes)) != package.sha256 {
        return Err(DistError::Altered {
            name: name.to_owned(),
        });
    }
    Ok((package, bytes))
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, DistError> {
    use bc_wire::file::{read_regular, FileError, Links};
    read_regular(path, MAX_PACKAGE_BYTES, Links::Follow).map_err(|e| match e {
        e if e.is_not_found() => DistError::NotFound(path.display().to_string()),
        FileError::TooLarge(_) => DistError::TooLarge {
            path: path.to_owned(),
            size: MAX_PACKAGE_BYTES + 1,
        },
        e => io_err(path)(e.into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("bcd_0.1.0_amd64.deb"));
        assert!(valid_name("bcd_0.1.0+vm2_amd64.deb"));
        for bad in [
            "",
            ".deb",
            "..deb",
            ".hidden.deb",
            "../x.deb",
            "a/b.deb",
            "x.deb/",
            "x.tar",
            "x%2f.deb",
            "x .deb",
            "current",
            "x.deb.sha256",
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(!valid_name(&format!("{}.deb", "a".repeat(200))));
    }

    #[test]
    fn add_lookup_read_and_tamper() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("bcd_1.2_amd64.deb");
        std::fs::write(&file, b"package bytes").unwrap();
        let dir = tmp.path().join("cp");
        let p = add(&dir, &file).unwrap();
        assert_eq!(p.version(), Some("1.2"));
        assert_eq!(current(&dir).unwrap(), p);
        assert_eq!(read(&dir, &p.name).unwrap().1, b"package bytes");
        assert!(matches!(
            lookup(&dir, "bcd_9_amd64.deb"),
            Err(DistError::NotFound(_))
        ));
        assert!(matches!(
            lookup(&dir, "../x.deb"),
            Err(DistError::BadName(_))
        ));
        std::fs::write(dir.join("dist").join(&p.name), b"other bytes").unwrap();
        assert!(matches!(
            read(&dir, &p.name),
            Err(DistError::Altered { .. })
        ));
    }

    #[test]
    fn no_current_until_added() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(current(tmp.path()), Err(DistError::NoCurrent)));
    }
}
