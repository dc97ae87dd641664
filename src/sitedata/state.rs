//! `site.json` in the data directory: what `bcd site` last knew of its
//! lease, the ramdisk it serves and the site's commissioning policy, for
//! `bcd status` and `bcd doctor` (separate processes) to show. Written at every lease answer; read as "held" only while its
//! expiry is ahead.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::pki::rfc3339;

/// The lease as this node last had it confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub epoch: u64,
    /// The control plane's word, in its time.
    pub expires_at: OffsetDateTime,
}

pub(crate) const FILE: &str = "site.json";
/// A state file is a few hundred bytes.
const MAX_BYTES: u64 = 16 * 1024;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SiteState {
    pub site_id: String,
    pub held: bool,
    pub epoch: u64,
    /// RFC 3339; empty when not held.
    pub expires_at: String,
    pub vmlinuz_bytes: u64,
    pub initrd_bytes: u64,
    /// What admits a machine's commissioning, as the last lease answer
    /// said (absent: no answer yet, or a control plane from before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commissioning: Option<super::commissioning::Commissioning>,
}

/// Where `bcd site` writes it, and what stays the same between writes.
pub(crate) struct StateFile {
    pub dir: PathBuf,
    pub base: SiteState,
}

impl StateFile {
    pub(crate) fn save(&self, lease: Option<Held>) {
        let state = SiteState {
            held: lease.is_some(),
            epoch: lease.map_or(0, |h| h.epoch),
            expires_at: lease.map(|h| rfc3339(h.expires_at)).unwrap_or_default(),
            ..self.base.clone()
        };
        let written = serde_json::to_vec_pretty(&state)
            .map_err(std::io::Error::other)
            .and_then(|b| crate::identity::atomic::write_atomic(&self.dir, FILE, &b));
        if let Err(e) = written {
            tracing::warn!(error = %e, "cannot write {FILE}; bcd status will not show the lease");
        }
    }
}

/// The state `bcd site` left, with `held` false once its expiry passed.
pub(crate) fn load(dir: &Path, now: OffsetDateTime) -> Option<SiteState> {
    let bytes = crate::identity::guard::read_private(&dir.join(FILE), MAX_BYTES).ok()?;
    let mut state: SiteState = serde_json::from_slice(&bytes).ok()?;
    let live = OffsetDateTime::parse(
        &state.expires_at,
        &time::format_description::well_known::Rfc3339,
    )
    .is_ok_and(|t| now < t);
    state.held &= live;
    Some(state)
}

/// `site site_x: boot lease held (epoch 3) until T; ramdisk vmlinuz N B, initrd M B`
pub(crate) fn line(s: &SiteState) -> String {
    let lease = if s.held {
        format!("boot lease held (epoch {}) until {}", s.epoch, s.expires_at)
    } else {
        "boot lease not held (standing by, or bcd site not running)".to_owned()
    };
    format!(
        "site {}: {lease}; ramdisk vmlinuz {} bytes, initrd {} bytes (configuration appended)",
        s.site_id, s.vmlinuz_bytes, s.initrd_bytes
    )
}
