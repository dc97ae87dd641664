//! The ramdisk a site serves: `vmlinuz` as it is, `initrd` with this
//! control plane's bcd configuration for the ramdisk (api = `[site]
//! ramdisk_api`, the site node's own trust domain and pins) appended as a
//! second cpio archive ([`super::cpio`]). Computed once at start.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::cpio;
use crate::config::Config;

/// Where the ramdisk's init looks for its configuration.
pub const CONFIG_PATH: &str = "etc/bcd/config.toml";
/// The ramdisk's data directory (its initramfs, a tmpfs).
pub const RAMDISK_DATA_DIR: &str = "/var/lib/bcd";

/// A file served as its first `len` bytes followed by `suffix`.
#[derive(Debug, Clone)]
pub struct Served {
    pub path: PathBuf,
    pub len: u64,
    pub suffix: std::sync::Arc<[u8]>,
}

impl Served {
    pub fn total(&self) -> u64 {
        self.len + self.suffix.len() as u64
    }
}

#[derive(Debug, Clone)]
pub struct Image {
    pub kernel: Served,
    pub initrd: Served,
}

impl Image {
    /// Reads the sizes under `[site] ramdisk_dir` and builds the archive
    /// from the configuration file at `config_path` (already checked as
    /// `config`).
    pub fn prepare(config: &Config, config_path: &Path, dir: &Path) -> anyhow::Result<Image> {
        let size = |name: &str| -> anyhow::Result<(PathBuf, u64)> {
            let p = dir.join(name);
            let m = std::fs::metadata(&p)
                .with_context(|| format!("[site] ramdisk_dir: cannot read {}", p.display()))?;
            Ok((p, m.len()))
        };
        let (kpath, klen) = size("vmlinuz")?;
        let (ipath, ilen) = size("initrd")?;
        let text = ramdisk_config(config, config_path)?;
        let archive = cpio::archive(&[cpio::File {
            path: CONFIG_PATH,
            mode: 0o600,
            data: text.as_bytes(),
        }])?;
        let mut suffix = vec![0u8; cpio::padding_before(ilen)];
        suffix.extend_from_slice(&archive);
        Ok(Image {
            kernel: Served {
                path: kpath,
                len: klen,
                suffix: std::sync::Arc::from(Vec::new()),
            },
            initrd: Served {
                path: ipath,
                len: ilen,
                suffix: suffix.into(),
            },
        })
    }
}

/// The ramdisk's `config.toml`: this node's trust domain and `[pins]` as
/// written (the same control plane), the api the guests use, a tmpfs data
/// directory.
fn ramdisk_config(config: &Config, config_path: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(config_path)
        .with_context(|| format!("cannot read {}", config_path.display()))?;
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
