//! The ramdisk a site serves: `vmlinuz` as it is, `initrd` with this
//! control plane's bcd configuration for the ramdisk (api = `[site]
//! ramdisk_api`, the site node's own trust domain and pins) appended as a
//! second cpio archive ([`super::cpio`]). The archive is built once at
//! start; the files are opened (never through a link) at each answer.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use hyper::body::Bytes;

use super::cpio;
use crate::config::Config;

/// Where the ramdisk's init looks for its configuration.
pub(super) const CONFIG_PATH: &str = "etc/bcd/config.toml";
/// The ramdisk's data directory (its initramfs, a tmpfs).
pub(super) const RAMDISK_DATA_DIR: &str = "/var/lib/bcd";

/// One of the two files, opened for one answer: its first `len` bytes
/// (its size when opened), then `suffix`.
#[derive(Debug)]
pub struct Served {
    pub file: std::fs::File,
    pub len: u64,
    pub suffix: Bytes,
}

impl Served {
    pub(crate) fn total(&self) -> u64 {
        self.len + self.suffix.len() as u64
    }
}

/// Which file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Kernel,
    Initrd,
}

impl Part {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Part::Kernel => "vmlinuz",
            Part::Initrd => "initrd",
        }
    }
}

/// Why a ramdisk file is not served.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error("{0} is a symbolic link: bcd site serves regular files only")]
    Symlink(PathBuf),
    #[error("{0} is not a regular file")]
    NotRegular(PathBuf),
    #[error("cannot open {0}: {1}")]
    Io(PathBuf, std::io::Error),
}

/// `[site] ramdisk_dir` and the archive appended to its initrd. The files
/// themselves are opened at each answer ([`Image::open`]): a rebuilt initrd
/// is served whole, at its new size.
#[derive(Debug, Clone)]
pub(crate) struct Image {
    dir: PathBuf,
    archive: Bytes,
    /// What the files measured at start (`bcd status`).
    pub kernel_bytes: u64,
    pub initrd_bytes: u64,
}

impl Image {
    /// Checks both files under `[site] ramdisk_dir` as [`Image::open`] will
    /// and builds the archive from the configuration file at `config_path`
    /// (already checked as `config`).
    pub(crate) fn prepare(
        config: &Config,
        config_path: &Path,
        dir: &Path,
    ) -> anyhow::Result<Image> {
        let text = ramdisk_config(config, config_path)?;
        let archive = cpio::archive(&[cpio::File {
            path: CONFIG_PATH,
            mode: 0o600,
            data: text.as_bytes(),
        }])?;
        let mut image = Image {
            dir: dir.to_owned(),
            archive: Bytes::from(archive),
            kernel_bytes: 0,
            initrd_bytes: 0,
        };
        let size = |part| {
            image
                .open(part)
                .map(|s| s.total())
                .context("[site] ramdisk_dir")
        };
        let (k, i) = (size(Part::Kernel)?, size(Part::Initrd)?);
        (image.kernel_bytes, image.initrd_bytes) = (k, i);
        Ok(image)
    }

    /// Opens `part` without following a link (a link to the data
    /// directory's `node.key` is refused, not served), refuses anything but
    /// a regular file, and takes its size from the opened file.
    pub(crate) fn open(&self, part: Part) -> Result<Served, OpenError> {
        use bc_wire::file::{open_regular, FileError, Links};
        let path = self.dir.join(part.name());
        // Opened without blocking: a FIFO in its place must not hang it.
        let (file, meta) = open_regular(&path, Links::Refuse).map_err(|e| match e {
            FileError::Link => OpenError::Symlink(path.clone()),
            FileError::NotRegular(_) => OpenError::NotRegular(path.clone()),
            e => OpenError::Io(path.clone(), e.into()),
        })?;
        let len = meta.len();
        let suffix = match part {
            Part::Kernel => Bytes::new(),
            Part::Initrd => {
                let mut s = vec![0u8; cpio::padding_before(len)];
                s.extend_from_slice(&self.archive);
                Bytes::from(s)
            }
        };
        Ok(Served { file, len, suffix })
    }
}

/// The ramdisk's `config.toml`: this node's trust domain and `[pins]` as
/// written (the same control plane), the api the guests use, a tmpfs data
/// directory.
fn ramdisk_config(config: &Config, config_path: &Path) -> anyhow::Result<String> {
    let bytes = bc_wire::file::read_regular(
        config_path,
        crate::config::MAX_CONFIG_BYTES,
        bc_wire::file::Links::Follow,
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", config_path.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{} is not UTF-8", config_path.display()))?;
    let table: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not TOML", config_path.display()))?;
    let pins = table
        .get("pins")
        .cloned()
        .context("the configuration has no [pins]")?;
    let mut out = toml::Table::new();
    out.insert(
        "api".to_owned(),
        config
            .site
            .as_ref()
            .map(|s| s.ramdisk_api.as_str().trim_end_matches('/').to_owned())
            .unwrap_or_else(|| config.api.as_str().to_owned())
            .into(),
    );
    out.insert(
        "trust_domain".to_owned(),
        config.trust_domain.clone().into(),
    );
    out.insert("data_dir".to_owned(), RAMDISK_DATA_DIR.into());
    out.insert("pins".to_owned(), pins);
    let rendered = toml::to_string(&out).context("cannot write the ramdisk's configuration")?;
    // What the ramdisk will read must be what bcd accepts.
    Config::parse(Path::new(CONFIG_PATH), &rendered)
        .context("the ramdisk's configuration does not check")?;
    Ok(rendered)
}
